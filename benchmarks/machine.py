"""The machine and library versions a quality benchmark prints next to its numbers (shared by the
quality_* scripts; the speed benchmarks report their own, Ray- / FAISS-specific, set)."""

from __future__ import annotations

import os
import platform

import numpy as np
import torch
import transformers


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown cpu" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "unknown cpu")
    except OSError:
        return "unknown cpu"


def load_average() -> str:
    """The 1 / 5 / 15 minute load averages, "a / b / c"."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_info(**extra: str) -> dict[str, str]:
    """CPU, usable cores, torch threads, OS, Python, torch / transformers / numpy versions, then `extra`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_model(), "usable_cores": str(cores), "torch_threads": str(torch.get_num_threads()),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__, **extra}
