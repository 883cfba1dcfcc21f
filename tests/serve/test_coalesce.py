"""serve.coalesce.Coalescer: concurrent calls gathered into one call with a list while every slot is in flight."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from serve.backend import BackendBadRequest, BackendUnavailable
from serve.calls import member_error
from serve.coalesce import Coalescer


class Callee:
    """A remote method's stand-in: answers each call after `delay_s`, records the lists it was sent."""

    def __init__(self, delay_s: float = 0.02, fail_call: bool = False) -> None:
        self.sent: list[list[str]] = []
        self.delay_s, self.fail_call = delay_s, fail_call

    async def __call__(self, items: list[str]) -> list[object]:
        self.sent.append(list(items))
        await asyncio.sleep(self.delay_s)
        if self.fail_call:
            raise BackendUnavailable("searcher-0: no live replica")
        return [ValueError(f"bad {x}") if x.startswith("bad") else x.upper() for x in items]


def test_a_burst_makes_few_calls_in_order_and_a_bad_member_fails_alone():
    async def main():
        callee = Callee()
        coalescer = Coalescer(callee, max_size=4, max_in_flight=1)
        items = [f"q{i}" for i in range(10)] + ["bad"]
        results = await asyncio.gather(*(coalescer(x) for x in items), return_exceptions=True)
        return callee, coalescer, items, results

    callee, coalescer, items, results = asyncio.run(main())
    assert results[:10] == [f"Q{i}" for i in range(10)]
    assert isinstance(results[10], ValueError) and str(results[10]) == "bad bad"
    # the first is sent at once; those arriving while it is in flight go together, in calls of <= 4, in order
    assert [len(s) for s in callee.sent] == [1, 4, 4, 2] and coalescer.calls == 4
    assert [x for s in callee.sent for x in s] == items


def test_a_call_failing_as_a_whole_fails_each_member_and_a_cancelled_member_is_left_out():
    async def main():
        failing = Coalescer(Callee(fail_call=True))
        failed = await asyncio.gather(*(failing(x) for x in ("a", "b")), return_exceptions=True)
        callee = Callee(delay_s=0.05)
        coalescer = Coalescer(callee, max_in_flight=1)
        first = asyncio.ensure_future(coalescer("first"))
        await asyncio.sleep(0)
        late = [asyncio.ensure_future(coalescer(x)) for x in ("gone", "kept")]
        await asyncio.sleep(0)
        late[0].cancel()  # its request's deadline passed while it waited for the call in flight
        answers = await asyncio.gather(first, late[1])
        return failed, callee.sent, answers

    failed, sent, answers = asyncio.run(main())
    assert all(isinstance(e, BackendUnavailable) for e in failed) and len(failed) == 2
    assert answers == ["FIRST", "KEPT"] and sent == [["first"], ["kept"]]


def test_a_members_exception_is_answered_as_a_call_of_its_own_would_be():
    assert isinstance(member_error("QueryEncoder", ValueError("text is blank")), BackendBadRequest)
    assert isinstance(member_error("searcher-0", BackendUnavailable("x")), BackendUnavailable)
    other = RuntimeError("a bug")
    assert member_error("searcher-0", other) is other
    with pytest.raises(ValueError, match="max_size"):
        Coalescer(Callee(), max_size=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        Coalescer(Callee(), max_in_flight=0)


class Frozen(Callee):
    """A callee whose first call never returns (a frozen replica holds it) until `release` is set."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.01)
        self.release = asyncio.Event()

    async def __call__(self, items: list[str]) -> list[object]:
        if not self.sent:
            self.sent.append(list(items))
            await self.release.wait()
            return [x.upper() for x in items]
        return await super().__call__(items)


def test_a_call_held_by_a_frozen_callee_does_not_hold_the_requests_that_come_after_it():
    async def main():
        callee = Frozen()
        coalescer = Coalescer(callee, max_size=8, max_in_flight=2)
        held = asyncio.ensure_future(coalescer("held"))
        await asyncio.sleep(0)
        later = await asyncio.wait_for(asyncio.gather(*(coalescer(f"q{i}") for i in range(20))), 2.0)
        callee.release.set()
        return await held, later, callee.sent

    held, later, sent = asyncio.run(main())
    assert later == [f"Q{i}" for i in range(20)] and held == "HELD"
    assert sent[0] == ["held"] and all(len(s) <= 8 for s in sent) and len(sent) < 21  # gathered while busy


def test_a_burst_fills_every_slot_first_and_each_call_carries_no_request_context():
    request = contextvars.ContextVar("request", default=None)
    seen: list[object] = []

    async def send_many(items: list[str]) -> list[str]:
        seen.append(request.get())
        await asyncio.sleep(0.02)
        return items

    async def one(coalescer: Coalescer, i: int) -> str:
        request.set(f"request-{i}")  # what Ray Serve keeps per request (its id)
        return await coalescer(str(i))

    async def main():
        coalescer = Coalescer(send_many, max_size=16, max_in_flight=3)
        return await asyncio.gather(*(one(coalescer, i) for i in range(30))), coalescer.calls

    answers, calls = asyncio.run(main())
    assert answers == [str(i) for i in range(30)]
    assert seen == [None] * calls and 3 < calls < 30
