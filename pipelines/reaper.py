"""The local Ray a job driver starts dies with the driver, however the driver ends.

`ray.init()` starts the node's processes (GCS, raylet, dashboard, log monitor) as children of the driver, bound
to it by `PR_SET_PDEATHSIG = SIGKILL`; the raylet starts the dashboard and runtime-env agents. When the driver
is SIGKILLed (or aborts), the raylet is SIGKILLed with it and its agents are orphaned. Each agent notices the
dead raylet, finds no "Raylet received SIGTERM" in its log and reports an unexpected death to the GCS, which
is dead too: a call with a 60 s timeout that blocks the agent's event loop, so for those 60 s the agent also
ignores SIGTERM (Ray 2.60, `ray._private.process_watcher.report_raylet_error_logs`).

`watch()` starts ``python -m pipelines.reaper PID:START``, a small process in its own session that waits
until the driver is gone (exited or killed; its start time is checked, so a reused PID is no driver). Every
process of the driver's Ray holds a file of its session directory open (`<temp dir>/session_<time>_<driver
PID>/logs/...`): the reaper gives those `GRACE_S` to exit on their own (a graceful `ray.shutdown()` is not cut
short), then SIGKILLs each one still alive. (Ancestry cannot find them: the agents are orphans by then; nor the
environment: Ray's `setproctitle` overwrites it.) Linux only (it reads /proc); elsewhere a no-op.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 1.0
PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time in clock ticks) of `pid`, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def alive(pid: int, started: int | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, when `started` is given, is the process that started then."""
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X") and (started is None or st[2] == started)


def tag_of(pid: int) -> str:
    """`pid`'s tag: "PID:START" (its start time tells it from a later process with the same PID)."""
    st = _stat(pid)
    if st is None:
        raise ProcessLookupError(pid)
    return f"{pid}:{st[2]}"


def session_processes(driver_pid: int) -> list[int]:
    """Living processes (this one excluded) with a file open under a Ray session directory of `driver_pid`."""
    session = re.compile(rf"/session_[^/]*_{driver_pid}(/|$)")
    me, found = os.getpid(), []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone, or not ours
            continue
        if any(session.search(t) for t in targets) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def reap(tag: str, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> list[int]:
    """Wait until the driver of `tag` is gone, then end what it left (module docstring); returns the PIDs
    that had to be SIGKILLed."""
    pid, started = (int(x) for x in tag.split(":"))
    while alive(pid, started):
        time.sleep(poll_s)
    deadline = time.monotonic() + grace_s
    while (left := session_processes(pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
            killed.append(p)
        except OSError:
            pass
    return killed


def watch() -> subprocess.Popen | None:
    """Start this process's reaper (module docstring); None where /proc is missing."""
    if not (PROC / "self" / "stat").exists():
        return None
    return subprocess.Popen([sys.executable, "-m", "pipelines.reaper", tag_of(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].replace(":", "").isdigit() or args[0].count(":") != 1:
        print("usage: python -m pipelines.reaper PID:START (see pipelines.reaper.tag_of)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver's terminal
    reap(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
