#!/usr/bin/env bash
# The README's main command: bootstrap the venv, then run the main job on embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
source scripts/ray_env.sh
.venv/bin/python -m pipelines.cli demo "$@"
