#!/usr/bin/env bash
# The README's test command: bootstrap the venv, then run ruff and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/ray_env.sh
.venv/bin/ruff check madr pipelines serve tests benchmarks
# Test files spread over MADR_TEST_WORKERS processes (default 2; pytest-xdist, each file's tests in one process, so
# a module's fixtures are built once): the Ray and Serve tests spend much of their time waiting on starts, health
# checks and timeouts, which another file's tests then use. 0 runs every test in this process.
.venv/bin/python -m pytest -q --durations=40 -n "${MADR_TEST_WORKERS:-2}" --dist loadfile "$@"
