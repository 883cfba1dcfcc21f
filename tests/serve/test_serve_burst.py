"""Busy is not dead: a call to a deployment whose replicas are all busy waits its turn, a call to one with no
live replica fails fast (serve.routing.LiveReplicaRouter, serve.calls), both through a handle (the fan-out
ingress's hops) and through Serve's HTTP proxy (every topology's ingress); beyond the queue bound
(`max_queued_requests`) the proxy answers 503 + Retry-After at once, after the queue's time bound
(`queue_timeout_s`) too, and so it does for a request whose replica dies under it.

Two small deployments on local Ray: `Slow` (called through handles; it takes 6 calls at once and works on
them one at a time) and `Front` (HTTP; one slot). A replica's replacement is held in its constructor while a marker file exists, so that "no live replica"
lasts as long as the test needs, whatever the machine's speed. Margins: ROUTE_TIMEOUT_S (the configured wait
for a live replica) plus SLACK_S for Ray, HTTP and noticing the death on a busy 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from serve_helpers import free_port, wait_for

from serve.config import DeploymentSettings, deployment_options

pytestmark = pytest.mark.ray

ROUTE_TIMEOUT_S = 0.5
SLACK_S = 5.0  # Ray, HTTP and noticing a death on a busy 2-core machine; a held call would wait until the end
WORK_S = 0.4  # each call's work, one at a time: a burst of BURST calls queues far longer than the timeouts
SLOTS = 6  # Slow's max_ongoing_requests: the rest of a burst queues in the router
CALL_TIMEOUT_S = 1.0  # a call waits longer than this in the replica, which keeps finishing calls: busy, not hung
QUEUE_TIMEOUT_S = 1.5  # Front's: a request waits at most this long in the proxy for its busy replica
BURST = 12


def _options(queue_timeout_s: float | None = None, **settings) -> dict:
    opts = deployment_options(DeploymentSettings(num_cpus=0, health_check_period_s=1.0, **settings), ROUTE_TIMEOUT_S,
                              queue_timeout_s)
    opts["ray_actor_options"] = {"num_cpus": 0}
    return opts


@pytest.fixture(scope="module")
def apps(ray_local, tmp_path_factory):
    from ray import serve

    marker = str(tmp_path_factory.mktemp("burst") / "hold")

    # (defined here, shipped to the replicas by value; a constructor waits while `marker` exists: a replacement
    # "being started")
    @serve.deployment
    class Slow:
        """Takes up to max_ongoing_requests calls and works on them one at a time (as a batching replica
        queues the calls it took for its next batch)."""

        def __init__(self, marker: str) -> None:
            while os.path.exists(marker):
                time.sleep(0.1)
            self.lock = asyncio.Lock()

        async def work(self, seconds: float) -> int:
            async with self.lock:
                await asyncio.sleep(seconds)
            return os.getpid()

    @serve.deployment
    class Front:
        def __init__(self, marker: str, work_s: float) -> None:
            while os.path.exists(marker):
                time.sleep(0.1)
            self.work_s = work_s

        async def __call__(self, request) -> dict:
            body = await request.json()
            if body.get("running"):  # tell the test this request runs here now
                Path(body["running"]).touch()
            await asyncio.sleep(body.get("sleep", self.work_s))
            return {"pid": os.getpid()}

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        slow = serve.run(Slow.options(**_options(max_ongoing_requests=SLOTS)).bind(marker), name="madr_burst_slow",
                         route_prefix=None)
        front = _options(QUEUE_TIMEOUT_S, max_ongoing_requests=1, max_queued_requests=2)
        serve.run(Front.options(**front).bind(marker, WORK_S), name="madr_burst_front", route_prefix="/front")
        yield {"slow": slow, "url": f"http://127.0.0.1:{port}/front", "marker": Path(marker)}
    finally:
        Path(marker).unlink(missing_ok=True)
        serve.shutdown()


def _policy():
    from serve.calls import CallPolicy

    return CallPolicy(route_timeout_s=ROUTE_TIMEOUT_S, retries=1, call_timeout_s=CALL_TIMEOUT_S)


async def _timed_calls(handle, n: int, seconds: float) -> list[tuple[object, float]]:
    """`n` concurrent `serve.calls.call`s of `Slow.work(seconds)`: (pid or the exception, seconds taken) each."""
    from serve.calls import call

    async def one() -> tuple[object, float]:
        t = time.monotonic()
        try:
            return await call(lambda: handle.work.remote(seconds), _policy(), "Slow", handle), time.monotonic() - t
        except Exception as e:  # noqa: BLE001 - recorded, asserted on below
            return e, time.monotonic() - t

    return await asyncio.gather(*[one() for _ in range(n)])


def _post(url: str, body: dict | None = None) -> tuple[int, str | None, float, str]:
    """(status, Retry-After, seconds, the start of the body) of one POST (status 0: no answer)."""
    t = time.monotonic()
    try:
        r = requests.post(url, json=body or {}, timeout=30)
        return r.status_code, r.headers.get("Retry-After"), time.monotonic() - t, r.text[:200]
    except requests.RequestException as e:
        return 0, None, time.monotonic() - t, repr(e)[:200]


def _post_all(url: str, n: int) -> list[tuple[int, str | None, float, str]]:
    """`n` concurrent POSTs (`_post`)."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _post(url), range(n)))


def _kill_replicas_holding_replacements(pids: set[int], marker: Path) -> None:
    marker.touch()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def test_a_burst_on_busy_replicas_queues_instead_of_failing(apps):
    answers = asyncio.run(_timed_calls(apps["slow"], BURST, WORK_S))
    failed = [a for a, _ in answers if isinstance(a, Exception)]
    assert not failed, f"{len(failed)} of {BURST} calls failed: {failed[:3]}"
    slowest = max(t for _, t in answers)
    # 12 calls, one at a time: the last waited ~12 x WORK_S, in the router's queue and then in the replica, many
    # times ROUTE_TIMEOUT_S and CALL_TIMEOUT_S, and was answered
    assert slowest > 3 * CALL_TIMEOUT_S, f"no call queued (slowest {slowest:.2f} s): the test proves nothing"


def test_no_live_replica_fails_fast_through_a_handle_then_recovers(apps):
    from serve.backend import BackendUnavailable

    handle, marker = apps["slow"], apps["marker"]
    pids = {int(pid) for pid, _ in asyncio.run(_timed_calls(handle, 2, 0.0))}
    _kill_replicas_holding_replacements(pids, marker)
    try:
        answers = asyncio.run(_timed_calls(handle, 4, 0.0))
    finally:
        marker.unlink()
    print(f"\nno live replica, through a handle: {[(type(a).__name__, round(t, 2)) for a, t in answers]}")
    for answer, took in answers:
        assert isinstance(answer, BackendUnavailable) and "no live replica" in str(answer), answer
        assert took < ROUTE_TIMEOUT_S + SLACK_S, f"failed after {took:.2f} s, not fast"
    wait_for(lambda: not isinstance(asyncio.run(_timed_calls(handle, 1, 0.0))[0][0], Exception), 60,
             "no answer after the replacement")


def test_the_proxy_sheds_beyond_the_queue_bound_and_fails_fast_with_no_live_replica(apps, tmp_path):
    url, marker = apps["url"], apps["marker"]
    wait_for(lambda: requests.post(url, json={}, timeout=10).status_code == 200, 60, "Front does not answer")
    burst = _post_all(url, 8)  # 1 slot + 2 queued: the rest is refused at once
    print(f"\nburst of 8 over 1 slot + 2 queued: {sorted((s, round(t, 2)) for s, _, t, _ in burst)}")
    assert {s for s, _, _, _ in burst} <= {200, 503}, burst
    assert any(s == 200 for s, _, _, _ in burst) and any(s == 503 for s, _, _, _ in burst), burst
    for status, retry_after, took, _ in burst:
        assert status == 200 or (retry_after == "1" and took < WORK_S + SLACK_S), (status, retry_after, took)

    # a request queued behind a long one waits queue_timeout_s, not as long as the long one takes
    running = tmp_path / "long"
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(_post, url, {"running": str(running), "sleep": 3 * QUEUE_TIMEOUT_S})
        wait_for(running.exists, 30, "the long request did not start")
        queued = _post(url)
        assert long.result()[0] == 200, long.result()
    print(f"queued behind a long request: {queued}")
    assert (queued[0], queued[1]) == (503, "1") and "every replica busy" in queued[3], queued
    assert QUEUE_TIMEOUT_S <= queued[2] < QUEUE_TIMEOUT_S + SLACK_S, queued

    # the replica dies under a request (it dies with it), and no replica is alive for the next ones
    pid, running = requests.post(url, json={}, timeout=10).json()["pid"], tmp_path / "running"
    with ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(_post, url, {"running": str(running), "sleep": 60})
        wait_for(running.exists, 30, "the request did not start")
        _kill_replicas_holding_replacements({pid}, marker)
        try:
            outage = [doomed.result()] + _post_all(url, 2)  # 2: within the queue bound
        finally:
            marker.unlink()
    print(f"a replica killed under a request, then none alive, through the proxy: {outage}")
    assert "the replica running this request died" in outage[0][3], outage[0]
    assert all("no live replica" in body for *_, body in outage[1:]), outage
    assert all((status, retry_after) == (503, "1") for status, retry_after, _, _ in outage), outage
    assert all(took < ROUTE_TIMEOUT_S + SLACK_S for _, _, took, _ in outage[1:]), f"not fast: {outage}"
