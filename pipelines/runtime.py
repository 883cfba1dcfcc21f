"""Where a pipeline process meets Ray: the network settings of ../shared/ENVIRONMENT.md (the shell twin is
scripts/ray_env.sh) and `init_ray`, shared by every `pipelines` CLI so that no CLI imports another's.

Importing this module imports nothing of Ray: call `apply_ray_env()` before `import ray` / `ray.init`
(`init_ray` does both).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C")
R = TypeVar("R")

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


def init_ray(num_cpus: int | None = None) -> Any:
    """Start (or join, with RAY_ADDRESS) Ray with the network settings of ENVIRONMENT.md; Ray Data shows its
    progress bars. Returns the `ray` module."""
    apply_ray_env()
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = True
    return ray


def run_ray_job(load: Callable[[], C], run: Callable[[C], R], num_cpus: int | None = None) -> tuple[C, R] | None:
    """A job CLI's body: load its config, start Ray, run it. A `ValueError` (a bad config or input, which
    names what is wrong) is printed as `error: ...` and gives None, for the CLI to exit 1 without a trace."""
    try:
        cfg = load()
        init_ray(num_cpus)
        return cfg, run(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
