"""A replica's health check that fails when its work is stuck (a replica that hangs without dying).

Serve replaces a replica whose `check_health` raises or does not answer within `health_check_timeout_s`. Our
deployments run each batch in a thread (`asyncio.to_thread`), so their event loop, and with it a plain health
check, stays responsive while a batch hangs in a long FAISS or model call, and every request queued behind
that batch waits. `Watchdog` times the batches a replica runs; `check` raises once one has run longer than
`stuck_after_s` (the deployments use `request_timeout_s`: by then every request in the batch was answered 504),
so Serve takes the replica out of routing and starts another.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Watchdog:
    """Start times of the batches running now; `check` fails when the oldest has run too long."""

    def __init__(self, what: str, stuck_after_s: float | None) -> None:
        if stuck_after_s is not None and stuck_after_s <= 0:
            raise ValueError(f"{what}: stuck_after_s must be > 0, got {stuck_after_s}")
        self.what, self.stuck_after_s = what, stuck_after_s
        self._running: dict[int, float] = {}
        self._ids = itertools.count()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Time the batch run inside this block."""
        key = next(self._ids)
        self._running[key] = time.monotonic()
        try:
            yield
        finally:
            del self._running[key]

    def oldest_s(self) -> float:
        """How long the longest-running batch has run (0 when none runs)."""
        return time.monotonic() - min(self._running.values()) if self._running else 0.0

    def check(self) -> None:
        """RuntimeError when a batch has run longer than `stuck_after_s` (None: never)."""
        if self.stuck_after_s is not None and (age := self.oldest_s()) > self.stuck_after_s:
            raise RuntimeError(f"{self.what}: a batch has run {age:.1f} s (stuck after {self.stuck_after_s:g} s); "
                               "replace this replica")


__all__ = ["Watchdog"]
