"""The machine and library versions a benchmark prints next to its numbers: the pieces are shared by every
benchmark; `machine_info` is the quality_* scripts' set (the speed benchmarks add their Ray / FAISS versions)."""

from __future__ import annotations

import os
import platform

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


def machine_info(**extra: str) -> dict[str, str]:
    """CPU, usable cores, torch threads, OS, Python, torch / transformers / numpy versions, then `extra`."""
    import torch
    import transformers

    return {"cpu": cpu_model(), "usable_cores": str(usable_cores()), "torch_threads": str(torch.get_num_threads()),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__, **extra}
