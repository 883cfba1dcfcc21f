"""Where a pipeline process meets Ray: the network settings of ../shared/ENVIRONMENT.md (the shell twin is
scripts/ray_env.sh) and `init_ray`, and a job's config from its YAML section with the command line on top
(`load_stage_config`), shared by every `pipelines` CLI so that no CLI imports another's.

Importing this module imports nothing of Ray: call `apply_ray_env()` before `import ray` / `ray.init`
(`init_ray` does both).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from madr.config import from_dict
from madr.config_files import read_config_file
from madr.config_overrides import apply_overrides

C = TypeVar("C")
R = TypeVar("R")

LOOPBACK_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray's workers (tasks, actors, Serve's proxy and replicas) at the priority of the rest of the machine, not Ray's
# default niceness 15, at which any nice-0 process starves them (a served burst then times out)
PRIORITY_DEFAULTS = {"RAY_worker_niceness": "0"}
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
    for key, value in {**LOOPBACK_DEFAULTS, **PRIORITY_DEFAULTS, **(OFFLINE_DEFAULTS if offline else {})}.items():
        os.environ.setdefault(key, value)
    write_bootstrap()


def init_ray(num_cpus: int | None = None) -> Any:
    """Join the cluster of RAY_ADDRESS, or start a new local Ray (never one that a `ray start` left running on
    this machine, which a bare `ray.init()` would join), with the network settings of ENVIRONMENT.md; Ray Data
    shows its progress bars. A local Ray ends with this process (`start_reaper`, `exit_on_sigterm`). Returns `ray`."""
    apply_ray_env()
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            start_reaper()
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False)
            exit_on_sigterm()
    ray.data.DataContext.get_current().enable_progress_bars = True
    return ray


_reaper: Any = None  # the reaper's Popen, kept so that it is not collected (and warned about) while it runs


def start_reaper() -> None:
    """The local Ray this process starts ends with it, even when it is SIGKILLed (`pipelines.reaper`:
    without it the agents of a killed driver's Ray live on for 60 s, ignoring SIGTERM)."""
    global _reaper
    from pipelines import reaper

    if _reaper is None or _reaper.poll() is not None:
        _reaper = reaper.watch()


def exit_on_sigterm() -> None:
    """After `ray.init` (whose handler it replaces): SIGTERM exits through Python (`SystemExit`, status 143, or
    Ray's own non-zero status when it arrives inside `ray.get`), so that `finally` blocks and atexit's
    `ray.shutdown()` run. Before, the handler that `ray.init` leaves aborted the driver (SIGABRT, no clean-up)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def job_parser(prog: str, doc: str | None, config_class: str, section: str) -> argparse.ArgumentParser:
    """The start of a job CLI's parser: its module docstring as the help, `--config` (the job's own YAML or an
    experiment YAML with a `section:` for it) and `--num-cpus` (a local Ray's CPUs)."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help=f"YAML with the {config_class} fields (optionally under '{section}:')")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    return p


def run_ray_job(load: Callable[[], C], run: Callable[[C], R], num_cpus: int | None = None,
                start_ray: bool = True) -> tuple[C, R] | None:
    """A job CLI's body: load its config, start Ray (unless the job runs in this process: ``start_ray``
    False), run it. A `ValueError` (a bad config or input, which names what is wrong) is printed as
    `error: ...` and gives None, for the CLI to exit 1 without a trace."""
    try:
        cfg = load()
        if start_ray:
            init_ray(num_cpus)
        return cfg, run(cfg)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return None


def flag_overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """Command-line flags -> dotted overrides: a flag left None is skipped (the file's value stays); a
    mapping flag sets each of its keys that is not None."""
    dotted: dict[str, Any] = {}
    for key, value in flags.items():
        if isinstance(value, dict):
            dotted.update({f"{key}.{k}": v for k, v in value.items() if v is not None})
        elif value is not None:
            dotted[key] = value
    return dotted


def load_stage_config(cls: type[C], path: str | Path | None, flags: dict[str, Any] | None = None,
                      section: str | None = None) -> C:
    """Dataclass `cls` from a YAML file (its `section` mapping when the file has one, else the whole file: one
    experiment YAML holds every stage's section, a stage's own YAML holds just its fields; the loader of
    `madr.config`), then the command line's `flags` (`flag_overrides`). Errors name the file."""
    data, where = read_config_file(path, section)
    try:
        return from_dict(cls, apply_overrides(data, flag_overrides(flags or {})), where)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path or '<defaults>'}: {e}") from None


def experiment_main(argv: list[str] | None, prog: str, description: str | None, run: Callable[[Any], Any]) -> int:
    """`prog --config EXPERIMENT.yaml`: `run` the typed experiment (`madr.config.load_config`); a bad config or a
    missing input is one line on stderr and exit status 1; else `run`'s status when it returns an int, 0."""
    from madr.config import load_config

    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiment YAML")
    args = parser.parse_args(argv)
    try:
        status = run(load_config(args.config))
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return status if isinstance(status, int) else 0

