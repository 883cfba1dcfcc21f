"""Concurrent calls of one remote method sent as one call with a list: the ingress's hops under a burst.

Each request the ingress serves makes a call to the encoder and one to every shard group. Under a burst that
is hundreds of Ray calls a second, each costing CPU in the ingress, the callee and Serve's router. A
`Coalescer` sends the first call at once and, while it is in flight, gathers the calls that arrive into the
next one (up to `max_size`), so a burst of N requests makes about N / batch calls per hop, and a lone request
waits for nothing. The callee answers a list in order, a failed member as its exception in place: a bad
request fails alone; a call that fails as a whole (its replica died, no replica answered in time) fails every
member with that error, which each would have met alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Coalescer:
    """`await coalescer(item)`: the result of `send_many([..., item, ...])` for `item`, raised if it is an
    exception (module docstring)."""

    def __init__(self, send_many: Callable[[list[Any]], Awaitable[list[Any]]], max_size: int = 64) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.send_many, self.max_size = send_many, max_size
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._sender: asyncio.Task | None = None
        self.calls = 0  # calls sent (for tests and metrics)

    async def __call__(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send_while_pending())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _send_while_pending(self) -> None:
        batch: list[tuple[Any, asyncio.Future]] = []
        try:
            while self._pending:
                batch = [(item, f) for item, f in self._pending[:self.max_size] if not f.done()]
                del self._pending[:self.max_size]
                if batch:
                    await self._send(batch)
        except asyncio.CancelledError:  # the replica is shutting down: no member waits for an answer
            for _, future in batch + self._pending:
                future.cancel()
            self._pending.clear()
            raise
        finally:
            self._sender = None

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.calls += 1
        try:
            results = await self.send_many([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a call of {len(batch)} items answered {len(results)}")
        except Exception as err:  # the call failed as a whole: every member meets the error
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():  # a member whose request was cancelled (its deadline) is left out
                future.set_result(result)
