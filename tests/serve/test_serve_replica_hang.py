"""A replica that hangs without dying.

1. The Serve app with 2 searcher replicas under load (4 clients); one replica is frozen (SIGSTOP: alive,
   accepting nothing, answering nothing). Every request still gets 200 quickly (a call the replica did not take,
   or took and did not answer, within `call_timeout_s` is sent again and lands on the other replica) and Serve
   replaces the frozen one (its health check times out after `health_check_timeout_s`). Before: the requests routed to it waited for `request_timeout_s` (504) and Serve kept it for its
   30 s health-check timeout.
2. A deployment whose method sleeps, called through `serve.calls.call`: `BackendTimeout` (HTTP 504 +
   Retry-After) after (retries + 1) x `call_timeout_s`, not after the request's whole deadline.
3. A searcher whose batch is stuck in a long call (its event loop free, so a plain health check passes) fails
   its health check once the batch has run `stuck_after_s`, and passes again when the call returns; so does a
   co-located replica (encoder + every shard) whose shard search is stuck past `request_timeout_s`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest
import requests
from serve_helpers import Load, describe, free_port, wait_for

from serve.config import DeploymentSettings, ServeSettings

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)

CALL_TIMEOUT_S = 1.0  # a call the frozen replica does not take, or took and does not answer, is sent again
RETRIES = 1  # replica_retries' default
SLACK_S = 4.0  # Ray and HTTP overhead on a shared, busy 2-core machine (two busy loops beside the tests)
FAST_S = (RETRIES + 1) * CALL_TIMEOUT_S + SLACK_S  # any answer: a call that hung, sent again, + the overhead
HEALTH_CHECK_TIMEOUT_S = 8.0  # > FAST_S: a call held until the frozen replica is replaced would show as a stall
REQUEST_TIMEOUT_S = 20.0  # long, so that an answer bounded by it alone shows as a stall


def _searcher_pids(handle) -> set[int]:
    return {int(info["pid"]) for info in handle.broadcast("info").results(timeout_s=3)}


@pytest.mark.ray
def test_a_frozen_searcher_replica_is_bypassed_and_replaced(ray_local, served_index):
    from ray import serve

    from serve.app import run_local, url

    name = "madr_hang"
    small = {"num_cpus": 0.2, "max_ongoing_requests": 32, "health_check_period_s": 1.0}
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), port=free_port(), topology="fanout",
                             shard_groups=1, replica_retries=RETRIES,
                             request_timeout_s=REQUEST_TIMEOUT_S, call_timeout_s=CALL_TIMEOUT_S, access_log=False,
                             log_level="WARNING", encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small, num_replicas=2,
                                                         health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S),
                             ingress=DeploymentSettings(**small))
    run_local(settings, name=name, route_prefix="/hang")
    base = url(settings) + "/hang"
    frozen = None
    try:
        wait_for(lambda: requests.get(base + "/ready", timeout=10).status_code == 200, 180, "the app is not ready")
        handle = serve.get_deployment_handle("searcher-0", app_name=name)
        pids = _searcher_pids(handle)
        assert len(pids) == 2, pids
        frozen = min(pids)
        with Load(base, served_index["queries"], clients=4) as load:
            wait_for(lambda: len(load.since(0)) >= 4, 60, "the clients got no answers")
            t_stop = time.monotonic()
            os.kill(frozen, signal.SIGSTOP)
            replaced = wait_for(lambda: (now := _searcher_pids(handle)) and frozen not in now and len(now) == 2,
                                120, f"the frozen replica {frozen} was not replaced")
            time.sleep(2.0)  # answers after the replacement too
        answers = load.since(t_stop)
    finally:
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGKILL)  # Serve killed it already unless the test failed first
            except ProcessLookupError:
                pass
        serve.shutdown()  # the app and Serve's proxy on this test's port (the next test starts its own)
    print(f"\nfrozen replica replaced after {replaced:.1f} s; answers since the freeze: {describe(answers)}")
    assert answers, "no answers after the freeze"
    for a in answers:
        assert a.status in (200, 503, 504), f"a request got {a.status or 'no answer'}: {describe(answers)}"
        assert a.status == 200 or a.retry_after == "1", f"{a.status} without Retry-After: 1"
        assert a.took_s < FAST_S, f"a request waited {a.took_s:.2f} s: {describe(answers)}"
    assert sum(a.status == 200 for a in answers) >= 0.9 * len(answers), describe(answers)


@pytest.mark.ray
def test_a_call_that_is_never_answered_is_504_after_its_attempts(ray_local):
    from ray import serve

    from serve.backend import BackendTimeout
    from serve.calls import CallPolicy, call

    @serve.deployment(ray_actor_options={"num_cpus": 0}, health_check_period_s=1.0)
    class Sleeper:
        async def wait(self, seconds: float) -> str:
            await asyncio.sleep(seconds)
            return "answered"

    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})  # never Serve's default port 8000
    handle = serve.run(Sleeper.bind(), name="madr_sleeper", route_prefix=None)
    try:
        policy = CallPolicy(route_timeout_s=1.0, retries=RETRIES, call_timeout_s=0.5)
        assert asyncio.run(call(lambda: handle.wait.remote(0.0), policy, "Sleeper")) == "answered"
        t = time.monotonic()
        with pytest.raises(BackendTimeout, match=r"Sleeper: no answer within 0.5 s in 2 attempt\(s\)"):
            asyncio.run(call(lambda: handle.wait.remote(60.0), policy, "Sleeper"))
        took = time.monotonic() - t
    finally:
        serve.shutdown()
    attempts_s = (RETRIES + 1) * policy.call_timeout_s
    assert attempts_s <= took < attempts_s + SLACK_S, f"BackendTimeout after {took:.2f} s (2 attempts x 0.5 s)"


class _StuckGroup:
    """A shard group whose search blocks until `release` is set (a call stuck in FAISS)."""

    def __init__(self, group) -> None:
        self.group, self.release = group, threading.Event()
        self.shards, self.shard_ids, self.ntotal = group.shards, group.shard_ids, group.ntotal

    def search(self, *args, **kw):
        self.release.wait(30)
        return self.group.search(*args, **kw)


def _stuck_search_fails_then_passes(check_health, searcher, query) -> None:
    """`searcher`'s shard search blocks (`_StuckGroup`): `check_health` passes while idle and 0.1 s into the batch,
    raises once it has run past 0.3 s (`stuck_after_s`), and passes again once the search returns."""
    from madr.search.params import SearchParams
    from serve.deployments import ShardSearcher

    batch = ShardSearcher.func_or_class._search_batch.__wrapped__
    stuck = searcher.group = _StuckGroup(searcher.group)

    async def scenario() -> None:
        check_health()  # idle
        # the batch handler itself (`@serve.batch` queues only inside a replica)
        task = asyncio.ensure_future(batch(searcher, [(query, SearchParams(k=3))]))
        await asyncio.sleep(0.1)
        check_health()  # running, not yet stuck
        await asyncio.sleep(0.4)
        with pytest.raises(RuntimeError, match=r"ShardSearcher: a batch has run 0\.\d s \(stuck after 0.3 s\)"):
            check_health()
        stuck.release.set()
        (found,) = await asyncio.wait_for(task, 10)
        scores, ids = found.arrays
        assert len(ids) == 3
        check_health()  # answered: healthy again

    asyncio.run(scenario())


def _query(served_index):
    from serve.backend import encode_texts, query_encoder

    return encode_texts(query_encoder(served_index["model"], None, False), ["red shoes"], None, None)[0]


def test_a_searcher_with_a_stuck_batch_fails_its_health_check(served_index):
    from serve.deployments import ShardSearcher

    searcher = ShardSearcher.func_or_class(str(served_index["manifest"]), [0], stuck_after_s=0.3)
    _stuck_search_fails_then_passes(searcher.check_health, searcher, _query(served_index))


def test_a_colocated_replica_with_a_stuck_search_fails_its_health_check(served_index):
    import dataclasses

    from serve.colocated import ColocatedSearch

    settings = ServeSettings(manifest_path=str(served_index["manifest"]), model_dir=str(served_index["model_dir"]),
                             topology="colocated", request_timeout_s=0.3)
    # the class under Serve's ingress wrapper (whose constructor also builds the ASGI app inside a replica)
    user_class = ColocatedSearch.func_or_class.__mro__[1]
    replica = object.__new__(user_class)
    user_class.__init__(replica, dataclasses.asdict(settings))
    _stuck_search_fails_then_passes(replica.check_health, replica.searcher, _query(served_index))
