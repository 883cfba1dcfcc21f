"""The machine, library versions, load average and command line a benchmark records next to its numbers."""

from __future__ import annotations

import importlib
import os
import platform
import sys


def _proc_field(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(key)), None)
    except OSError:
        return None


def cpu_model() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or "unknown cpu"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's count."""
    return len(os.sched_getaffinity(0))


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line() -> str:
    ram_gib = int((_proc_field("/proc/meminfo", "MemTotal") or "0 kB").split()[0]) / 2**20
    return (f"{cpu_model()}; {usable_cores()} usable cores; RAM {ram_gib:.1f} GiB; {platform.system()} "
            f"{platform.release()}")


def versions(*packages: str) -> dict[str, str]:
    """{"python": ..., package: its __version__}; underscores become dashes in the keys."""
    return {"python": platform.python_version(),
            **{name.replace("_", "-"): str(importlib.import_module(name).__version__) for name in packages}}


def machine_info(**extra: str) -> dict[str, str]:
    """CPU, usable cores, torch threads, OS, Python, torch / transformers / numpy versions, then `extra`."""
    import torch

    return {"cpu": cpu_model(), "usable_cores": str(usable_cores()), "torch_threads": str(torch.get_num_threads()),
            "os": f"{platform.system()} {platform.release()}",
            **versions("torch", "transformers", "numpy"), **extra}


def run_command(module: str) -> str:
    return " ".join(["python", "-m", module, *sys.argv[1:]])
