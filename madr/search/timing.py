"""Per-stage wall times of a search, for whoever asks: `collecting()` opens a dict, `stage(name)` adds to it.

The search code marks its stages (`with stage("dense"): ...`); a caller that wants the breakdown wraps the call
in `with collecting() as stages:` and reads milliseconds per stage name afterwards. Nobody collecting: `stage` is
a no-op (one context-variable read). The dict lives in a context variable, so it follows the call into
`asyncio.to_thread` and child tasks (copies of the context share the dict) and never crosses into another
request's context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from time import perf_counter

_STAGES: ContextVar[dict[str, float] | None] = ContextVar("madr_search_stages", default=None)


@contextmanager
def collecting(into: dict[str, float] | None = None) -> Iterator[dict[str, float]]:
    """Collect the stages marked inside the block into `into` (default: a new dict), ms per stage name."""
    stages = {} if into is None else into
    token = _STAGES.set(stages)
    try:
        yield stages
    finally:
        _STAGES.reset(token)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Add the block's wall time (ms) to `name` in the dict being collected, if any (a repeated stage sums)."""
    stages = _STAGES.get()
    if stages is None:
        yield
        return
    start = perf_counter()
    try:
        yield
    finally:
        stages[name] = stages.get(name, 0.0) + 1000.0 * (perf_counter() - start)


def current() -> dict[str, float] | None:
    """The dict being collected into, or None."""
    return _STAGES.get()


__all__ = ["collecting", "current", "stage"]
