"""Replicas SIGKILLed under load (fan-out: the searcher deployment; co-located: `Colocated`, the ingress + encoder +
every shard in each replica). The Serve app runs on local Ray with 2 replicas of the deployment that holds the
shards while 4 clients send /search over HTTP:

1. one replica killed: the other answers. Fan-out loses no request: the ingress sends a call on the dead
   replica again (`serve.calls`). Co-located, the dead replica was the HTTP ingress itself: the requests in
   flight on it die with it, answered 503 + Retry-After: 1 by Serve's proxy (`serve.routing.ReplicaDied`; at
   most one per client, sent before the kill); every later request lands on the live replica.
2. the other one killed too (no live replica until Serve has replaced them): every request gets 200 or
   503 + Retry-After: 1 within FAST_S, never a hang, a 504 or a 500.
   The router (`serve.routing.LiveReplicaRouter`, in the ingress and in Serve's proxy) fails a request that
   has waited `route_timeout_s` with no live replica; then 200 again once a replacement is up. Whether 503s
   come at all depends on how long the replacement takes (tests/serve/test_serve_burst.py holds one back).

Margins come from the configured timeouts: FAST_S = route_timeout_s + SLACK_S, the overhead of Ray, HTTP and
noticing a death on a busy 2-core machine; no request may wait for the replacement.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests
from serve_helpers import Answer, Load, describe, free_port, wait_for

from serve.config import DeploymentSettings, ServeSettings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROUTE_TIMEOUT_S = 1.0
SLACK_S = 4.0  # Ray, HTTP and noticing the death on a busy 2-core machine (two busy loops beside the tests)
FAST_S = ROUTE_TIMEOUT_S + SLACK_S  # any answer
REQUEST_TIMEOUT_S = 20.0
CLIENTS = 4
# per topology: how many requests a kill may fail (503s of requests in flight on the killed co-located replica,
# at most one per client: they die with it)
LOST = {"fanout": 0, "colocated": CLIENTS}


@pytest.fixture(scope="module", params=["fanout", "colocated"])
def app(request, ray_local, served_index):
    from ray import serve

    from serve.app import APP_NAME, run_local, url
    from serve.colocated import DEPLOYMENT

    topology = request.param
    small = {"num_cpus": 0.2, "max_ongoing_requests": 32, "health_check_period_s": 10.0}
    colocated = {**small, "health_check_period_s": 1.0, "num_replicas": 2}
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), port=free_port(), shard_groups=1,
                             topology=topology,
                             request_timeout_s=REQUEST_TIMEOUT_S, route_timeout_s=ROUTE_TIMEOUT_S, access_log=False,
                             log_level="WARNING", encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small, num_replicas=2),
                             ingress=DeploymentSettings(**small), colocated=DeploymentSettings(**colocated))
    try:  # start-up waits are generous: a busy machine starts replicas slowly
        run_local(settings)
        base = url(settings)
        wait_for(lambda: requests.get(base + "/ready", timeout=10).status_code == 200, 180, "the app is not ready")
        with Load(base, served_index["queries"], CLIENTS) as warm:  # each replica's first search (numba) first
            wait_for(lambda: len(warm.since(0)) >= 4 * CLIENTS, 180, "the clients got no answers")
        deployment = "searcher-0" if topology == "fanout" else DEPLOYMENT
        yield {"url": base, "topology": topology,
               "replicas": serve.get_deployment_handle(deployment, app_name=APP_NAME)}
    finally:
        serve.shutdown()


def replica_pids(handle) -> set[int]:
    return {int(info["pid"]) for info in handle.broadcast("info").results(timeout_s=10)}


def check_answers(answers: list[Answer], what: str) -> None:
    """Every answer 200 or 503 + Retry-After: 1 within FAST_S (a client gives up after 30 s: no answer, a
    failure)."""
    for a in answers:
        assert a.status in (200, 503), f"{what}: a request got {a.status or 'no answer'}: {describe(answers)}"
        assert a.status != 503 or a.retry_after == "1", f"{what}: 503 without Retry-After: 1"
        assert a.took_s < FAST_S, f"{what}: an answer after {a.took_s:.2f} s (> {FAST_S:g}): {describe(answers)}"


def test_sigkill_one_of_two_replicas_is_invisible_then_a_full_outage_fails_fast(app, served_index):
    handle, lost = app["replicas"], LOST[app["topology"]]
    first = replica_pids(handle)
    assert len(first) == 2, f"expected 2 replicas, got pids {first}"
    victim, other = sorted(first)
    with Load(app["url"], served_index["queries"], CLIENTS) as load:
        wait_for(lambda: len(load.since(0)) >= CLIENTS, 60, "the clients got no answers")  # warm: first answers
        assert all(a.status == 200 for a in load.since(0)), describe(load.since(0))

        # 1. one replica dies: the other one answers
        t_one = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        time.sleep(3.0)
        one = load.since(t_one)

        # 2. the other dies too: no live replica until Serve notices and starts new ones
        t_all = time.monotonic()
        os.kill(other, signal.SIGKILL)
        took = wait_for(lambda: (recent := load.since(time.monotonic() - 0.5)) and all(a.status == 200 for a in recent)
                        and any(a.sent > t_all + 1.0 for a in recent), 120, "no 200s after the replicas died")
        outage = load.since(t_all)
    print(f"\n{app['topology']}: one of two replicas killed, 3 s: {describe(one)}\nboth killed: 200 again after "
          f"{took:.1f} s; {describe(outage)}")
    check_answers(one, "one replica of two killed")
    died = [a for a in one if a.status != 200]  # in flight on the killed replica
    assert len(died) <= lost and all(a.sent < t_one for a in died), f"lost by the kill: {describe(one)}"
    check_answers(outage, "no live replica")
