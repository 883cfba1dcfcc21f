"""A job driver's local Ray ends with the driver. A real driver process (`pipelines.runtime.init_ray`,
as every job CLI starts Ray, then blocked in `ray.get`) is killed once by SIGTERM and once by SIGKILL; within
a few seconds none of the processes it had started (GCS, raylet, dashboard, log monitor, the dashboard and
runtime-env agents, workers) may be left. Before: SIGTERM aborted the driver (SIGABRT, no `finally` ran) and after
a SIGKILL both agents lived on for 60 s, ignoring SIGTERM (see pipelines/reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.reaper import alive, tag_of

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import time
from pipelines.runtime import init_ray

ray = init_ray(1)

@ray.remote(num_cpus=0)
def wait():
    time.sleep(300)

print("DRIVER-READY", flush=True)
try:
    ray.get(wait.remote())
finally:
    print("finally", flush=True)
"""
AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
GONE_WITHIN_S = 5.0


def descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of the living descendants of `pid`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if alive(child):
            found[child] = int(tag_of(child).split(":")[1])
            todo.extend(children.get(child, []))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait(check, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(message())
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_driver_leaves_no_ray_process_behind(sig, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = tmp_path / "driver.out"
    with open(out, "w") as f:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=ROOT, env=env, stdout=f,
                                  stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "DRIVER-READY" in out.read_text(), 90, lambda: f"the driver did not start Ray:\n{out.read_text()[-3000:]}")
        # the agents start with the raylet, a moment after ray.init returns
        _wait(lambda: all(any(_cmdline(p).startswith(a) for p in descendants(driver.pid)) for a in AGENTS), 30,
              lambda: f"no {AGENTS} among {[_cmdline(p)[:40] for p in descendants(driver.pid)]}")
        started = descendants(driver.pid)
        names = {p: _cmdline(p)[:60] for p in started}
        driver.send_signal(sig)
        code = driver.wait(timeout=30)
        t0 = time.monotonic()
        _wait(lambda: not any(alive(p, t) for p, t in started.items()), GONE_WITHIN_S,
              lambda: f"{sig.name}: left after {GONE_WITHIN_S} s: "
                      f"{[names[p] for p, t in started.items() if alive(p, t)]}")
        print(f"\n{sig.name}: {len(started)} processes of the driver gone {time.monotonic() - t0:.1f} s after it exited")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    if sig == signal.SIGTERM:  # an exit through Python (an error status), not Ray's abort (-SIGABRT)
        assert code > 0, f"exit status {code}:\n{out.read_text()[-3000:]}"
        assert "finally" in out.read_text(), out.read_text()[-3000:]
