"""The machine, library versions, load average and command line a benchmark prints next to its numbers: one helper per
piece, used by every benchmark; `machine_info` is the quality benchmarks' dict of them."""

from __future__ import annotations

import importlib
import math
import os
import platform
import sys

import numpy as np


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown cpu" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown cpu")
    except OSError:
        return "unknown cpu"


def memory_gib() -> float:
    """Total RAM in GiB from /proc/meminfo (0.0 elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            return int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal"))) / 2**20
    except (OSError, StopIteration):
        return 0.0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_average() -> str:
    """The 1 / 5 / 15 minute load averages, "a / b / c"."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def load_1min() -> float:
    """The 1 minute load average (NaN where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def machine_line() -> str:
    """"<cpu>; <n> usable cores; RAM <x> GiB; <OS> <release>"."""
    return (f"{cpu_model()}; {usable_cores()} usable cores; RAM {memory_gib():.1f} GiB; {platform.system()} "
            f"{platform.release()}")


def arch_cores() -> str:
    """"<architecture>, <os.cpu_count()> cores": the short machine field of the speed benchmarks' JSON."""
    return f"{platform.machine()}, {os.cpu_count()} cores"


def versions(*packages: str) -> dict[str, str]:
    """{"python": ..., package: its __version__} for each importable name (imported here); a name's
    underscores become dashes in its key (sentence_transformers -> sentence-transformers)."""
    out = {"python": platform.python_version()}
    for name in packages:
        out[name.replace("_", "-")] = str(importlib.import_module(name).__version__)
    return out


def versions_line(*packages: str) -> str:
    """`versions` as "python 3.11.7, torch 2.3.1, ..."."""
    return ", ".join(f"{k} {v}" for k, v in versions(*packages).items())


def machine_info(**extra: str) -> dict[str, str]:
    """CPU, usable cores, torch threads, OS, Python, torch / transformers / numpy versions, then `extra`."""
    import torch
    import transformers

    return {"cpu": cpu_model(), "usable_cores": str(usable_cores()), "torch_threads": str(torch.get_num_threads()),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__, **extra}


def run_command(module: str) -> str:
    """The command line that re-runs this benchmark: "python -m <module> <its arguments>"."""
    return " ".join(["python", "-m", module, *sys.argv[1:]])
