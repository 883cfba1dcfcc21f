"""Issue 24 item 3 (fan-out) and issue 23 (co-located): replicas SIGKILLed under load. The Serve app runs on local
Ray with 2 replicas of the deployment that holds the shards (fan-out: its one searcher deployment; co-located:
`Colocated`, the ingress + encoder + every shard in each replica) while 4 clients send /search over HTTP:

1. one replica killed: the other answers; every request gets 200 (or 503 + Retry-After) within FAST_S, never a
   hang or a 504 (issue 24: "loses 0 requests or answers 503 + Retry-After within 1 s"). Fan-out loses no
   request: the ingress sends a call on the dead replica again (`serve.calls`). Co-located, the dead replica was
   the HTTP ingress itself: Serve's proxy answers the requests that were in flight on it 500 at once (at most
   one per client, sent before the kill); every later request lands on the live replica.
2. the other one killed too (no live replica). Fan-out: 503 + Retry-After: 1 within FAST_S each, then 200
   again once Serve has replaced them. The health check runs every 10 s here (Serve's default, as in the
   issue's probe), so the outage is long: the fast 503s come from `route_timeout_s` (serve/calls.py), not from a
   quick replacement. Before it, requests stalled until the replacement (4-10 s). Co-located: nothing of ours
   is alive to answer 503; Serve's proxy (Ray 2.60) holds each request until a replacement takes it, so no
   request is lost (but those in flight at the kill) and every one is answered 200, after the replacement
   (health check every 1 s here, the repository's default, + the replica's start: ~10 s on 2 busy cores).
   Serve's `max_queued_requests` would answer 503 beyond its count, but it counts every request waiting to
   be routed: at 1 with 4 clients it refused 3 of 19 requests while both replicas were alive.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests
from serve_helpers import Answer, Load, describe, free_port, wait_for

from serve.config import DeploymentSettings, ServeSettings

pytestmark = pytest.mark.ray

ROUTE_TIMEOUT_S = 1.0
FAST_S = 2.5  # any answer: route_timeout_s + noticing the death + HTTP and Ray overhead on a shared 2-core box
CLIENTS = 4
# per topology: how many requests a kill may fail (fast 500s: in flight on the killed co-located replica, at most
# one per client) and how many the outage may hold past FAST_S (co-located: every client's, until a replacement)
LOST_HELD = {"fanout": (0, 0), "colocated": (CLIENTS, CLIENTS)}


@pytest.fixture(scope="module", params=["fanout", "colocated"])
def app(request, ray_local, served_index):
    from ray import serve

    from serve.app import APP_NAME, run_local, url
    from serve.colocated import DEPLOYMENT

    topology = request.param
    small = {"num_cpus": 0.2, "max_ongoing_requests": 32, "health_check_period_s": 10.0}
    colocated = {**small, "health_check_period_s": 1.0, "num_replicas": 2}  # 1 s: the outage lasts the replacement
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), port=free_port(), shard_groups=1,
                             topology=topology,
                             request_timeout_s=20, route_timeout_s=ROUTE_TIMEOUT_S, access_log=False,
                             log_level="WARNING", encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small, num_replicas=2),
                             ingress=DeploymentSettings(**small), colocated=DeploymentSettings(**colocated))
    run_local(settings)
    base = url(settings)
    wait_for(lambda: requests.get(base + "/ready", timeout=5).status_code == 200, 60, "the app is not ready")
    with Load(base, served_index["queries"], CLIENTS) as warm:  # each replica's first search (numba) before the kill
        wait_for(lambda: len(warm.since(0)) >= 4 * CLIENTS, 60, "the clients got no answers")
    deployment = "searcher-0" if topology == "fanout" else DEPLOYMENT
    yield {"url": base, "topology": topology, "replicas": serve.get_deployment_handle(deployment, app_name=APP_NAME)}
    serve.shutdown()


def replica_pids(handle) -> set[int]:
    return {int(info["pid"]) for info in handle.broadcast("info").results(timeout_s=10)}


def check_answers(answers: list[Answer], what: str, killed_at: float, lost: int = 0, held: int = 0) -> None:
    """Every answer 200 or 503 + Retry-After: 1 within FAST_S, but for at most `lost` fast 500s of requests sent
    before `killed_at` (in flight on the killed replica) and `held` slow 200s (held by Serve's proxy until a
    replacement took them; a client gives up after 30 s: no answer, a failure)."""
    dropped = [a for a in answers if a.status == 500]
    assert len(dropped) <= lost and all(a.sent < killed_at for a in dropped), f"{what}: {describe(answers)}"
    slow = [a for a in answers if a.took_s >= FAST_S]
    assert len(slow) <= held and all(a.status == 200 for a in slow), f"{what}: stalled: {describe(answers)}"
    assert all(a.took_s < FAST_S for a in dropped), f"{what}: a slow 500: {describe(answers)}"
    for a in answers:
        assert a.status in (200, 500, 503), f"{what}: a request got {a.status or 'no answer'}: {describe(answers)}"
        assert a.status != 503 or a.retry_after == "1", f"{what}: 503 without Retry-After: 1"


def test_sigkill_one_of_two_replicas_is_invisible_then_a_full_outage_fails_fast(app, served_index):
    handle, colocated = app["replicas"], app["topology"] == "colocated"
    lost, held = LOST_HELD[app["topology"]]
    first = replica_pids(handle)
    assert len(first) == 2, f"expected 2 replicas, got pids {first}"
    victim, other = sorted(first)
    with Load(app["url"], served_index["queries"], CLIENTS) as load:
        wait_for(lambda: len(load.since(0)) >= CLIENTS, 30, "the clients got no answers")  # warm: first answers
        assert all(a.status == 200 for a in load.since(0)), describe(load.since(0))

        # 1. one replica dies: the other one answers
        t_one = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        time.sleep(3.0)
        one = load.since(t_one)

        # 2. the other dies too: no live replica until Serve notices (health check) and starts new ones
        t_all = time.monotonic()
        os.kill(other, signal.SIGKILL)
        took = wait_for(lambda: (recent := load.since(time.monotonic() - 0.5)) and all(a.status == 200 for a in recent)
                        and any(a.sent > t_all + 1.0 for a in recent), 45, "no 200s after the replicas died")
        outage = load.since(t_all)
    print(f"\n{app['topology']}: one of two replicas killed, 3 s: {describe(one)}\nboth killed: 200 again after "
          f"{took:.1f} s; {describe(outage)}")
    check_answers(one, "one replica of two killed", t_one, lost=lost)
    assert sum(a.status == 200 for a in one) >= 0.9 * len(one), describe(one)
    assert all(a.status == 200 for a in one if a.sent > t_one + 0.5), f"lost after the kill: {describe(one)}"
    check_answers(outage, "no live replica", t_all, lost=lost, held=held)
    if colocated:  # held, not refused: every request of the outage answered 200 by the replacement
        assert all(a.status == 200 for a in outage if a.sent > t_all + 0.5), describe(outage)
    else:
        assert any(a.status == 503 for a in outage), f"no 503 while no replica was alive: {describe(outage)}"
