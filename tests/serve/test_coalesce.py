"""serve.coalesce.Coalescer: concurrent calls gathered into one call with a list while one is in flight."""

from __future__ import annotations

import asyncio

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
        coalescer = Coalescer(callee, max_size=4)
        items = [f"q{i}" for i in range(10)] + ["bad"]
        results = await asyncio.gather(*(coalescer(x) for x in items), return_exceptions=True)
        return callee, coalescer, items, results

    callee, coalescer, items, results = asyncio.run(main())
    assert results[:10] == [f"Q{i}" for i in range(10)]
    assert isinstance(results[10], ValueError) and str(results[10]) == "bad bad"
    # arrivals of one event-loop turn go together, in calls of <= 4, in arrival order
    assert [len(s) for s in callee.sent] == [4, 4, 3] and coalescer.calls == 3
    assert [x for s in callee.sent for x in s] == items


def test_a_call_failing_as_a_whole_fails_each_member_and_a_cancelled_member_is_left_out():
    async def main():
        failing = Coalescer(Callee(fail_call=True))
        failed = await asyncio.gather(*(failing(x) for x in ("a", "b")), return_exceptions=True)
        callee = Callee(delay_s=0.05)
        coalescer = Coalescer(callee)
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
