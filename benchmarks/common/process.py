"""The speed benchmarks' measured child processes: each contender runs in a fresh interpreter (`call_in_child`:
a function of the benchmark's module, its arguments and result as JSON), its process tree's peak memory and CPU and
the rest of the machine's load sampled (`ProcessTree`, `Interval`, `wait_quiet`)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.common.config import ROOT

RESULT = "RESULT "  # the line a child prints its result on (`print_result`)


def module_command(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository root first on PYTHONPATH, then `extra`."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def call_in_child(module: str, function: str, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """`module.function(**kwargs)` in a fresh interpreter (`python -m benchmarks.common.process`, with
    `child_env(**env)`): the result it printed; RuntimeError with its output when it failed."""
    cmd = [*module_command(__spec__.name), module, function, json.dumps(kwargs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env(**(env or {})))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{module}.{function}({kwargs}) failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (/proc/stat, all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(below: float, max_wait: float, window: float = 5.0) -> float:
    """Wait up to `max_wait` s for the machine's busy CPU to fall under `below` cores; the last reading."""
    deadline = time.monotonic() + max_wait
    while True:
        busy0 = machine_busy_seconds()
        time.sleep(window)
        cores = (machine_busy_seconds() - busy0) / window
        if cores < below or time.monotonic() >= deadline:
            return cores


class ProcessTree:
    """Peak summed PSS / RSS and CPU seconds of this process and its descendants, sampled every `interval` s."""

    def __init__(self, interval: float = 1.0) -> None:
        import psutil

        self.proc, self.interval, self._stop = psutil.Process(), interval, threading.Event()
        self.peak = self.peak_rss = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sampler_cpu = 0.0
        self._cpu: dict[int, float] = {}

    def members(self) -> list:
        return [self.proc, *self.proc.children(recursive=True)]

    def cpu_seconds(self) -> float:
        """CPU seconds of the tree so far (every process ever seen: its last reading), less the sampler's."""
        for p in self.members():
            try:
                t = p.cpu_times()
                self._cpu[p.pid] = max(self._cpu.get(p.pid, 0.0), t.user + t.system)
            except Exception:  # noqa: BLE001 - a process that just exited
                pass
        return sum(self._cpu.values()) - self.sampler_cpu

    def _sample(self) -> int:
        """Summed PSS of the tree now (bytes); keeps the peak summed RSS."""
        pss = rss = 0
        for p in self.members():
            try:
                with open(f"/proc/{p.pid}/smaps_rollup") as f:
                    kb = {ln.split()[0]: int(ln.split()[1]) for ln in f if ln.startswith(("Pss:", "Rss:"))}
                pss, rss = pss + kb.get("Pss:", 0) * 1024, rss + kb.get("Rss:", 0) * 1024
            except (OSError, ValueError, IndexError):
                pass
        self.peak_rss = max(self.peak_rss, rss)
        return pss

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.thread_time()
            self.peak = max(self.peak, self._sample())
            self.cpu_seconds()  # keeps the CPU of processes that exit before the end
            self.sampler_cpu += time.thread_time() - t
            self._stop.wait(self.interval)

    def __enter__(self) -> ProcessTree:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self._sample())


class Interval:
    """Wall, our CPU and the rest of the machine's CPU over one measured interval."""

    def __init__(self, tree: ProcessTree) -> None:
        self.tree = tree
        self.start, self.cpu0, self.busy0 = time.perf_counter(), tree.cpu_seconds(), machine_busy_seconds()

    def result(self) -> dict:
        seconds, cpu = time.perf_counter() - self.start, self.tree.cpu_seconds() - self.cpu0
        busy = machine_busy_seconds() - self.busy0
        return {"seconds": seconds, "cpu": cpu, "others_cores": max(busy - cpu, 0.0) / seconds}


if __name__ == "__main__":  # a child of `call_in_child`: module, function, JSON arguments
    module, function, kwargs = sys.argv[1:]
    result = getattr(importlib.import_module(module), function)(**json.loads(kwargs))
    print(RESULT + json.dumps(result, default=float), flush=True)
