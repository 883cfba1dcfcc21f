"""Start-up tracing of the encode job: instrumentation only, off unless ``MADR_ENCODE_TRACE`` names a file.

Each process of the job (the driver, the read tasks' and the actors' workers) appends one tab-separated line
per event: wall-clock time, pid, the process's own start time (``psutil``, when installed) and what happened
(``stages imported``, ``<Stage> init start`` / ``init end``, ``<Stage> first call end``). Set the variable
before Ray starts, so that every worker inherits it; ``benchmarks.speed.encode`` reads the file back to say
where the job's start-up goes (worker boot, imports, model load, first piece).
"""

from __future__ import annotations

import os
import time

ENV = "MADR_ENCODE_TRACE"


def _process_start() -> float:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil missing: the column stays empty
        return float("nan")


def event(what: str) -> None:
    """Append `what` to the trace file (a no-op when ``MADR_ENCODE_TRACE`` is unset)."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a") as f:
        f.write(f"{time.time():.3f}\t{os.getpid()}\t{_process_start():.3f}\t{what}\n")


def read(path: str) -> list[tuple[float, int, float, str]]:
    """The events of a trace file: (time, pid, process start, what), in time order (ties: in file order)."""
    rows = []
    with open(path) as f:
        for line in f:
            t, pid, start, what = line.rstrip("\n").split("\t", 3)
            rows.append((float(t), int(pid), float(start), what))
    return sorted(rows, key=lambda r: r[0])
