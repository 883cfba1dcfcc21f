"""Where a /search request's time goes (serve/latency.py): the search code's stages are collected only when
asked and follow a call into a worker thread; the plain app logs one line per request with every stage, counts
each stage once per successful request in its metrics and leaves the response body as it was; the Ray Serve app
(fan-out: ingress, encoder, two shard groups) logs the line through Serve's access log with the replicas' stages,
the stages sum to no more than the total, the co-located app with its access log off logs none; and (slow) the
stage histogram reaches the Prometheus endpoint Ray exports on this node, tagged by stage and deployment."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
import requests
from serve_helpers import free_port, latency_lines, running_asgi

from serve.config import DeploymentSettings, ServeSettings

N = 6  # requests per app
INGRESS = ("http", "encode_call", "search_call", "fields", "respond")  # sequential on the ingress


def _check_breakdown(stages: dict[str, float], what: str) -> None:
    """The ingress's sequential stages fit in the total; a replica's stage fits in the hop that carried it."""
    assert sum(stages.get(n, 0.0) for n in INGRESS) <= stages["total"] + 1e-6, f"{what}: {stages}"
    if "encode_call" in stages:
        assert stages["encode"] <= stages["encode_call"] + 1e-6, f"{what}: {stages}"
        searched = sum(stages.get(n, 0.0) for n in ("dense", "sparse", "bm25"))
        assert searched <= stages["search_call"] + 1e-6, f"{what}: {stages}"


# ---- in-process ---------------------------------------------------------------------------------------------

def test_stages_are_collected_only_when_asked_and_follow_into_a_thread():
    from madr.search.timing import collecting, current, stage

    with stage("dense"):  # nobody collecting: nothing to add to
        assert current() is None

    async def scenario() -> dict[str, float]:
        def work() -> None:
            with stage("dense"):
                time.sleep(0.01)

        with collecting() as stages:
            await asyncio.to_thread(work)
            await asyncio.to_thread(work)  # a repeated stage sums
            with stage("fields"):
                pass
        return stages

    stages = asyncio.run(scenario())
    assert set(stages) == {"dense", "fields"} and stages["dense"] >= 20.0, stages


def test_log_line_lists_stages_in_order_and_parses_back():
    from serve.latency import log_line, parse_line

    line = log_line({"total": 9.5, "zeta": 0.25, "http": 0.5, "encode": 3.0}, 200)
    assert line == "madr_search status=200 http=0.50 encode=3.00 total=9.50 zeta=0.25"
    assert parse_line(f"INFO 2026 replica.py:12 -- {line}") == (200, {"http": 0.5, "encode": 3.0, "total": 9.5,
                                                                      "zeta": 0.25})
    assert parse_line("INFO POST /search 200 3.1ms") is None


def test_plain_app_logs_and_counts_every_stage_of_each_search(served_index, caplog):
    from serve.api import create_api
    from serve.backend import Docs, LocalBackend
    from serve.latency import StageMetrics, StageSink, parse_line

    settings = ServeSettings(manifest_path=str(served_index["manifest"]), api_key_env="MADR_TEST_UNSET_KEY")
    metrics = StageMetrics(None)  # the in-process tally only (a replica also exports it through Ray)
    sink = StageSink(logging.getLogger("serve.latency"), True, metrics)
    app = create_api(LocalBackend(settings.manifest_path), settings, Docs.open(settings.manifest_path), sink)
    caplog.set_level(logging.INFO, logger="serve.latency")
    with running_asgi(app, free_port()) as url:
        bodies = [requests.post(url + "/search", json={"query": q, "k": 5}, timeout=30)
                  for q in served_index["queries"][:N]]
        bad = requests.post(url + "/search", json={"query": ""}, timeout=30)
        requests.get(url + "/healthz", timeout=30)
    assert [r.status_code for r in bodies] == [200] * N and bad.status_code == 422
    assert set(bodies[0].json()) == {"query", "k", "lam", "results", "filter", "aspects", "took_ms", "timings_ms"}
    lines = [parse_line(r.getMessage()) for r in caplog.records if r.name == "serve.latency"]
    assert [s for s, _ in lines] == [200] * N + [422], lines  # one line per /search, none for /healthz
    for _, stages in lines[:N]:
        assert {"http", "encode", "dense", "sparse", "fusion", "merge", "fields", "respond", "total"} <= set(stages)
        # in one process every stage is sequential
        assert sum(v for n, v in stages.items() if n != "total") <= stages["total"] + 1e-6, stages
    tally = metrics.tally()
    assert tally["total"][0] == N and tally["encode"][0] == N, tally  # 2xx only
    assert tally["dense"][0] == N and tally["dense"][1] > 0, tally


# ---- on Ray Serve -------------------------------------------------------------------------------------------

APPS = {"fanout": "latency_fanout", "colocated": "latency_colocated"}


@pytest.fixture(scope="module")
def apps(ray_local, served_index):
    """Both topologies on one Serve: fan-out (2 shard groups) with its access log on, co-located with it off;
    `N` searches sent to each."""
    from ray import serve

    from serve.app import run_local, url
    from serve.client import MadrClient

    small = DeploymentSettings(num_cpus=0.2, max_ongoing_requests=32)
    common = {"manifest_path": str(served_index["manifest"]), "port": free_port(), "request_timeout_s": 60,
              "api_key_env": "MADR_TEST_UNSET_KEY"}
    settings = {"fanout": ServeSettings(**common, topology="fanout", shard_groups=2, encoder=small, searcher=small,
                                        ingress=small),
                "colocated": ServeSettings(**common, topology="colocated", colocated=small, access_log=False)}
    clients = {}
    for topology, s in settings.items():
        run_local(s, name=APPS[topology], route_prefix=f"/{topology}")
        clients[topology] = MadrClient(f"{url(s)}/{topology}")
        clients[topology].wait_ready(timeout=60)
        for q in served_index["queries"][:N]:
            clients[topology].search(q, k=5)
    yield clients
    for c in clients.values():
        c.close()
    serve.shutdown()


@pytest.mark.ray
def test_fanout_ingress_logs_each_search_with_the_replicas_stages(apps):
    lines = latency_lines(APPS["fanout"], "SearchIngress", N)
    assert len(lines) == N, f"{len(lines)} latency lines for {N} searches"
    for status, stages in lines:
        assert status == 200
        # encoder: encode; searchers: dense, sparse, fusion (hybrid re-scoring), merge (2 shards in group 0)
        assert {"http", "encode_call", "encode", "search_call", "dense", "sparse", "fusion", "merge", "fields",
                "respond", "total"} <= set(stages), stages
        _check_breakdown(stages, "fan-out")


@pytest.mark.ray
def test_colocated_app_with_its_access_log_off_logs_no_breakdown(apps):
    assert apps["colocated"].search("red shoes", k=3)["results"]
    assert latency_lines(APPS["colocated"], "Colocated", 1, timeout_s=2.0) == []


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """{(deployment, stage): observations} of the stage histogram on Ray's metrics endpoint."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("ray_madr_search_stage_ms_count{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = (labels.get("deployment", ""), labels.get("stage", ""))
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.ray
@pytest.mark.slow  # Ray exports metrics every few seconds: polls up to a minute
def test_stage_histogram_reaches_rays_prometheus_endpoint(apps):
    import ray

    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
    want = {("SearchIngress", "total"): N, ("SearchIngress", "encode_call"): N, ("SearchIngress", "http"): N,
            ("QueryEncoder", "encode"): N, ("searcher-0", "dense"): N, ("searcher-1", "dense"): N,
            ("Colocated", "total"): N, ("Colocated", "encode"): N, ("Colocated", "sparse"): N}
    deadline, counts = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        counts = _scrape(port)
        if all(counts.get(k, 0) >= v for k, v in want.items()):
            break
        time.sleep(2)
    missing = {k: (counts.get(k, 0), v) for k, v in want.items() if counts.get(k, 0) < v}
    assert not missing, f"(deployment, stage): (scraped, wanted) {missing}; scraped {sorted(counts)}"
