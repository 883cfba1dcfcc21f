#!/usr/bin/env bash
# The README's test command: bootstrap the venv, then run ruff and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/ray_env.sh
.venv/bin/ruff check madr pipelines serve tests benchmarks
.venv/bin/python -m pytest -q --durations=40 "$@"
