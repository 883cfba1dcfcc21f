"""Issue 24 item 3: searcher replicas SIGKILLed under load. The Serve app runs on local Ray with 2 replicas of
its one searcher deployment while 4 clients send /search over HTTP:

1. one replica killed: the other answers; every request (those in flight at the kill included) gets 200 (or
   503 + Retry-After) within FAST_S, never a hang, 500 or 504 (issue 24: "loses 0 requests or answers 503 +
   Retry-After within 1 s");
2. the other one killed too (no live replica): 503 + Retry-After: 1 within FAST_S each, then 200 again once
   Serve has replaced them. The health check runs every 10 s here (Serve's default, as in the issue's probe),
   so the outage is long: the fast 503s come from `route_timeout_s` (serve/calls.py), not from a quick
   replacement. Before it, requests stalled until the replacement (4-10 s).
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


@pytest.fixture(scope="module")
def app(ray_local, served_index):
    from ray import serve

    from serve.app import APP_NAME, run_local, url

    small = {"num_cpus": 0.2, "max_ongoing_requests": 32, "health_check_period_s": 10.0}
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), port=free_port(), shard_groups=1,
                             topology="fanout",
                             request_timeout_s=20, route_timeout_s=ROUTE_TIMEOUT_S, access_log=False,
                             log_level="WARNING", encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small, num_replicas=2),
                             ingress=DeploymentSettings(**small))
    run_local(settings)
    base = url(settings)
    wait_for(lambda: requests.get(base + "/ready", timeout=5).status_code == 200, 60, "the app is not ready")
    yield {"url": base, "searcher": serve.get_deployment_handle("searcher-0", app_name=APP_NAME)}
    serve.shutdown()


def replica_pids(handle) -> set[int]:
    return {int(info["pid"]) for info in handle.broadcast("info").results(timeout_s=10)}


def check_answers(answers: list[Answer], what: str) -> None:
    for a in answers:
        assert a.status in (200, 503), f"{what}: a request got {a.status or 'no answer'}: {describe(answers)}"
        assert a.status == 200 or a.retry_after == "1", f"{what}: 503 without Retry-After: 1"
        assert a.took_s < FAST_S, f"{what}: a request stalled {a.took_s:.2f} s: {describe(answers)}"


def test_sigkill_one_of_two_replicas_is_invisible_then_a_full_outage_fails_fast(app, served_index):
    handle = app["searcher"]
    first = replica_pids(handle)
    assert len(first) == 2, f"expected 2 searcher replicas, got pids {first}"
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
    print(f"\none of two replicas killed, 3 s: {describe(one)}\nboth killed: 200 again after {took:.1f} s; "
          f"{describe(outage)}")
    check_answers(one, "one replica of two killed")
    assert sum(a.status == 200 for a in one) >= 0.9 * len(one), describe(one)
    check_answers(outage, "no live replica")
    assert any(a.status == 503 for a in outage), f"no 503 while no replica was alive: {describe(outage)}"
