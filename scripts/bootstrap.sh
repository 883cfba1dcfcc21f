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
  touch "$STAMP"
fi
