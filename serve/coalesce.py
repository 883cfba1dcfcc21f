"""Concurrent calls of one remote method sent as one call with a list: the ingress's hops under a burst.

Each request the ingress serves makes a call to the encoder and one to every shard group. Under a burst that
is hundreds of Ray calls a second, each costing CPU in the ingress, the callee and Serve's router. A
`Coalescer` keeps up to `max_in_flight` calls in flight: a request that finds a free slot is sent at once
(a lone request waits for nothing); the requests that arrive while every slot is busy are gathered into the
next call (up to `max_size`), so a burst of N requests makes about N / batch calls per hop. Several calls in
flight keep one slow or frozen replica from holding everyone else's requests: the call it holds is sent again
by `serve.calls.call`, and the other slots go on meanwhile.

The callee answers a list in order, a failed member as its exception in place: a bad request fails alone; a
call that fails as a whole (its replica died, no replica answered in time) fails every member with that error,
which each would have met alone. Each call is sent from a fresh context: it is made on behalf of several
requests, so it carries none of their per-request context (Ray Serve keys a call's routing state by the
request id it finds in the context; calls that shared the first member's id would overwrite each other's).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any


class Coalescer:
    """`await coalescer(item)`: the result of `send_many([..., item, ...])` for `item`, raised if it is an
    exception (module docstring)."""

    def __init__(self, send_many: Callable[[list[Any]], Awaitable[list[Any]]], max_size: int = 64,
                 max_in_flight: int = 4) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.send_many, self.max_size, self.max_in_flight = send_many, max_size, max_in_flight
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._in_flight: set[asyncio.Task] = set()
        self.calls = 0  # calls sent (for tests and metrics)

    async def __call__(self, item: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._send_while_slots()
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    def _send_while_slots(self) -> None:
        """Start a call with the pending members (up to `max_size`) while a slot is free."""
        while self._pending and len(self._in_flight) < self.max_in_flight:
            batch = [(item, f) for item, f in self._pending[:self.max_size] if not f.done()]
            del self._pending[:self.max_size]
            if not batch:
                continue
            task = asyncio.get_running_loop().create_task(self._send(batch), context=contextvars.Context())
            self._in_flight.add(task)
            task.add_done_callback(self._call_done)

    def _call_done(self, task: asyncio.Task) -> None:
        self._in_flight.discard(task)
        if task.cancelled():  # the replica is shutting down: no pending member waits for an answer
            for _, future in self._pending:
                future.cancel()
            self._pending.clear()
            return
        self._send_while_slots()

    async def _send(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        self.calls += 1
        try:
            results = await self.send_many([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a call of {len(batch)} items answered {len(results)}")
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as err:  # the call failed as a whole: every member meets the error
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():  # a member whose request was cancelled (its deadline) is left out
                future.set_result(result)
