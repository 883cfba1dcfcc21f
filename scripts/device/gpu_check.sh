#!/bin/bash
# The GPU check of the product path on a lent H200 (the `device` tool), under 10 minutes, never part of CI:
# Ray Train + DeepSpeed ZeRO-2 bf16 fine-tuning of configs/product_search.yaml's e5-small (`python -m pipelines.jobs`
# with --set overrides: use_gpu, a few hundred steps) with pairs/s and MFU; the encode job over 1M generated
# documents (GPU encode; FAISS on the CPU: faiss-gpu needs CUDA 12, the machine has 13) with docs/s; Serve p50/p99
# over that index. scripts/device/gpu_check.py does the work; results: $OUT/gpu_check.json and the phases' logs.
#
# On the device machine (Python 3.12 with torch and transformers; no Ray, DeepSpeed, FAISS or registry): first, here,
#   bash scripts/device/gpu_check_prepare.sh      # .gpu/: slimmed Ray, FAISS, DeepSpeed, missing deps, e5 tokenizer
# then run(command="bash scripts/device/gpu_check.sh", carry=[".gpu"], timeout_s=600).
# Here, on the CPU, with tiny sizes and this environment's packages (the wiring check):
#   bash scripts/device/gpu_check.sh --dry-run
# Other arguments go to the Python module (e.g. --steps 200 --docs 2000000).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
# shellcheck source=/dev/null
source scripts/ray_env.sh
OUT="${OUT:-/tmp/madr_gpu_check}"      # the device runner sets it: the JSON and the logs' tails come back
WORK="${WORK:-/tmp/madr_gpu_check_work}"  # models, corpus, index: GBs that stay on the machine
PY="${PYTHON:-python3}"

setup_device() {  # unpack .gpu/ into /tmp/site (see gpu_check_prepare.sh); prints what it took
  local t0 site=/tmp/site
  t0=$(date +%s)
  mkdir -p "$site"
  tar -C "$site" -xJf .gpu/ray.tar.xz || return 1
  tar -C "$site" -xJf .gpu/faiss.tar.xz || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu/whl/*.whl || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$site" \
    .gpu/deepspeed-*.tar.gz || return 1
  xz -dc .gpu/e5_tokenizer.json.xz > /tmp/e5_tokenizer.json || return 1
  export PYTHONPATH="$site:$PWD"
  export PATH="$site/bin:$PATH"
  echo "device setup $(( $(date +%s) - t0 )) s"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

if [ "${1:-}" = "--dry-run" ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  exec "$PY" -m scripts.device.gpu_check --out "$OUT" --work "$WORK" "$@"
fi
[ -d .gpu ] || { echo "no .gpu/: run scripts/device/gpu_check_prepare.sh here first, then carry .gpu" >&2; exit 2; }
setup_device || { echo "device setup failed" >&2; exit 1; }
"$PY" -m scripts.device.gpu_check --out "$OUT" --work "$WORK" --tokenizer /tmp/e5_tokenizer.json "$@"
