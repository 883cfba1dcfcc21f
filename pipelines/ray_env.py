"""The Ray network settings of ../shared/ENVIRONMENT.md for a process that may start Ray (the shell twin is
scripts/ray_env.sh). Imports nothing of Ray: call `apply_ray_env()` before `import ray` / `ray.init`."""

from __future__ import annotations

import os
from pathlib import Path

LOOPBACK_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
OFFLINE_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
BOOTSTRAP = "provider:\n  type: local\n"


def write_bootstrap() -> Path:
    """~/ray_bootstrap_config.yaml naming the local provider, so Ray probes no cloud metadata address."""
    path = Path.home() / "ray_bootstrap_config.yaml"
    if not path.exists():
        path.write_text(BOOTSTRAP)
    return path


def apply_ray_env(offline: bool = False) -> None:
    """Set the loopback defaults (and, with `offline`, no hub downloads) in os.environ where unset; write the
    bootstrap file."""
    for key, value in {**LOOPBACK_DEFAULTS, **(OFFLINE_DEFAULTS if offline else {})}.items():
        os.environ.setdefault(key, value)
    write_bootstrap()
