"""Pieces of the serving layer without Ray: the filter semantics, the settings and the Serve YAML, the plain
FastAPI app (uvicorn on 127.0.0.1, no API key) giving the offline ShardedIndex results, and batched search
equal to one-by-one search."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from serve_helpers import assert_same_ranking, free_port, running_plain_app

from madr.search.params import SearchParams
from serve.backend import shard_groups
from serve.config import (
    MAX_BACKOFF_S,
    DeploymentSettings,
    ServeSettings,
    check_exposure,
    deployment_options,
    resolved_api_key,
    settings_from_dict,
)
from serve.filters import check_filters, matches

REPO = Path(__file__).resolve().parents[2]


def test_filters_and_across_fields_or_within_case_insensitive():
    f = check_filters({"brand": "Acme", "color": ["red", "Navy Blue"]}, ["brand", "color", "category"])
    assert matches({"brand": "acme ", "color": ["navy blue", "white"]}, f)
    assert not matches({"brand": "acme", "color": ["white"]}, f), "color must match too (AND)"
    assert not matches({"brand": "zentra", "color": "red"}, f)
    assert not matches({"brand": None, "color": "red"}, f), "a missing field never matches"
    assert not matches(None, f)
    assert matches({"brand": "acme", "color": np.array(["red"])}, f), "numpy list values"
    with pytest.raises(ValueError, match="unknown filter field 'size'; filterable fields: brand, color"):
        check_filters({"size": "xl"}, ["brand", "color"])
    with pytest.raises(ValueError, match="filter 'brand': expected a string or a list of strings"):
        check_filters({"brand": [1]}, ["brand"])


def test_shard_groups_are_contiguous_and_cover_all():
    assert shard_groups(5, 2) == [[0, 1, 2], [3, 4]]
    assert shard_groups(2, 4) == [[0], [1]]
    assert shard_groups(3, 1) == [[0, 1, 2]]


def test_min_app_cpus_counts_every_deployment_at_its_smallest_scale():
    from serve.app import min_app_cpus
    from serve.config import DeploymentSettings

    assert min_app_cpus(ServeSettings(topology="fanout"), num_shards=3) == 2.5  # defaults: 1 + 1 + 0.5 > 2 CPUs
    s = ServeSettings(topology="fanout", shard_groups=3, encoder=DeploymentSettings(num_cpus=0.5, num_replicas=2),
                      searcher=DeploymentSettings(num_cpus=0.25, autoscaling={"min_replicas": 2, "max_replicas": 4}),
                      ingress=DeploymentSettings(num_cpus=0.1))
    assert min_app_cpus(s, num_shards=3) == 1.0 + 3 * 0.5 + 0.1
    assert min_app_cpus(s, num_shards=2) == 1.0 + 2 * 0.5 + 0.1  # no more groups than shards


def test_check_text_refuses_surrogates_and_invisible_only_text():
    from serve.backend import check_text

    assert check_text("white \u200bsocks", "query") == "white \u200bsocks"
    with pytest.raises(ValueError, match="query holds an unpaired UTF-16 surrogate at character 3"):
        check_text("abc\ud800", "query")
    for blank in (" \t", "\u200b\u200c\u200d\u2060", "\x00\x00", "\ufeff\n", "\u3000"):
        with pytest.raises(ValueError, match="texts\\[2\\] is blank"):
            check_text(blank, "texts[2]")


def test_isolate_fails_only_the_guilty_members():
    """A batch function that raises when any member is bad: `isolate` retries members alone."""
    from serve.backend import isolate

    calls = []

    def upper(batch: list[str]) -> list[str]:
        calls.append(list(batch))
        if any(t.startswith("bad") for t in batch):
            raise ValueError(f"cannot encode {batch}")
        return [t.upper() for t in batch]

    out = isolate(upper, ["a", "bad1", "b", "bad2"])
    assert out[0] == "A" and out[2] == "B"
    assert isinstance(out[1], ValueError) and "bad1" in str(out[1]) and "bad2" not in str(out[1])
    assert isinstance(out[3], ValueError) and "bad2" in str(out[3])
    assert isolate(upper, ["x", "y"]) == ["X", "Y"] and calls[-1] == ["x", "y"]  # a good batch: one call


def test_explain_text_field_defaults_to_what_the_docstore_has():
    """The encode job's DocStore has `title`, not `text`; `/explain` by doc_id used to look for
    `text` unless the settings named the field."""
    import pyarrow as pa

    from madr.index.docstore import DocStore
    from serve.backend import Docs

    store = DocStore(pa.table({"doc_id": pa.array([7, 9], pa.int64()), "title": ["red socks", "blue hat"],
                               "brand": ["a", "b"]}))
    docs = Docs(store, ["title", "brand"], None)
    settings = ServeSettings()
    assert docs.text(9, docs.text_field(settings)) == "blue hat"
    assert docs.filter_fields(settings) == ["brand"]
    assert docs.text_field(ServeSettings(doc_text_field="brand")) == "brand"
    bare = Docs(DocStore(pa.table({"doc_id": pa.array([1], pa.int64()), "brand": ["a"]})), ["brand"], None)
    with pytest.raises(ValueError, match="has no text field; send doc_text"):
        bare.text(1, bare.text_field(settings))
    assert store.get([2**63, 2**70, 7])[:2] == [None, None], "ids outside int64 are unknown, not an error"


def test_settings_reject_unknown_keys_and_bad_values(tmp_path):
    with pytest.raises(ValueError, match="unknown config key.*max_kk"):
        settings_from_dict({"max_kk": 3})
    with pytest.raises(ValueError, match="max_k must be >= 1"):
        ServeSettings(max_k=0)
    (tmp_path / "s.yaml").write_text("max_k: 7\nencoder: {num_cpus: 0.5}\n")
    s = settings_from_dict({"config": str(tmp_path / "s.yaml"), "port": 9001})
    assert (s.max_k, s.encoder.num_cpus, s.port) == (7, 0.5, 9001)
    auto = settings_from_dict({"searcher": {"autoscaling": {"min_replicas": 1, "max_replicas": 3}}})
    assert deployment_options(auto.searcher)["autoscaling_config"]["max_replicas"] == 3


def test_deployments_check_health_every_second_and_calls_have_a_route_deadline():
    """Serve's default health check (10 s) left a dead replica unnoticed that long."""
    s = ServeSettings()
    for d in (s.encoder, s.searcher, s.ingress):
        assert deployment_options(d)["health_check_period_s"] == 1.0
    assert deployment_options(s.searcher)["health_check_timeout_s"] == 5.0  # a frozen replica: replaced after 5 s, not 30
    assert "health_check_timeout_s" not in deployment_options(DeploymentSettings(health_check_timeout_s=None))
    assert (s.route_timeout_s, s.replica_retries, s.call_timeout_s) == (1.0, 1, 2.0)
    with pytest.raises(ValueError, match="call_timeout_s must be > 0"):
        ServeSettings(call_timeout_s=0)
    assert ServeSettings(call_timeout_s=None).call_timeout_s is None
    with pytest.raises(ValueError, match="route_timeout_s must be > 0"):
        ServeSettings(route_timeout_s=0)
    with pytest.raises(ValueError, match="replica_retries must be >= 0"):
        ServeSettings(replica_retries=-1)


def test_max_replicas_per_node_reaches_the_deployment():
    """One replica per node on a multi-node cluster (tests/multinode); no limit unless set."""
    from serve.deployments import ShardSearcher

    assert "max_replicas_per_node" not in deployment_options(DeploymentSettings())
    deployment = ShardSearcher.options(**deployment_options(DeploymentSettings(num_replicas=2, max_replicas_per_node=1)))
    assert deployment._replica_config.max_replicas_per_node == 1  # what the scheduler reads


def test_every_deployment_routes_through_the_live_replica_router_with_a_queue_bound_that_answers_retry_after():
    """Calls wait for busy replicas and fail after route_timeout_s only with no live replica (serve.routing);
    a deployment that may scale to zero waits for its cold start; a full queue answers 503 + Retry-After: 1."""
    from serve.deployments import ShardSearcher

    opts = deployment_options(DeploymentSettings(max_queued_requests=50), route_timeout_s=0.7, queue_timeout_s=4.0,
                              max_wait_s=8.0)
    deployment = ShardSearcher.options(**opts)
    config = deployment._deployment_config  # what Serve's routers and proxy read
    assert config.request_router_config.request_router_class == "serve.routing:LiveReplicaRouter"
    assert config.request_router_config.request_router_kwargs == {"no_replica_timeout_s": 0.7, "max_queue_wait_s": 4.0,
                                                                  "max_wait_s": 8.0}
    # a queued call is routed within MAX_BACKOFF_S of a slot freeing (Serve's 0.5 s let a full replica's queue
    # drain at two calls per 0.5 s per replica, whatever the replica's speed)
    assert config.request_router_config.max_backoff_s == MAX_BACKOFF_S <= 0.1
    assert config.max_queued_requests == 50
    assert (config.backpressure_config.status_code, config.backpressure_config.retry_after_s) == (503, 1.0)
    assert deployment_options(DeploymentSettings())["max_queued_requests"] == -1  # Serve's "no bound"
    zero = deployment_options(DeploymentSettings(autoscaling={"min_replicas": 0, "max_replicas": 2}), route_timeout_s=0.7)
    assert zero["request_router_config"]["request_router_kwargs"]["no_replica_timeout_s"] is None
    assert ServeSettings(request_timeout_s=8).ingress_queue_timeout_s() == 4.0  # half the deadline unless set
    assert ServeSettings(queue_timeout_s=2.5).ingress_queue_timeout_s() == 2.5
    assert ServeSettings(request_timeout_s=8).ingress_max_wait_s() == 8.0  # an admitted request waits to its deadline
    assert ServeSettings(request_timeout_s=8, queue_timeout_s=9).ingress_max_wait_s() == 9.0
    with pytest.raises(ValueError, match="max_queued_requests must be >= 1"):
        DeploymentSettings(max_queued_requests=0)


def test_the_router_refuses_a_bursts_excess_on_arrival_by_its_expected_wait_and_a_call_with_no_live_replica():
    """serve.routing.LiveReplicaRouter's decisions on a queued call (Serve's own routing runs in the Ray tests)."""
    import time
    from types import SimpleNamespace

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    from serve.routing import ADMIT_WINDOW_S, LiveReplicaRouter, NoLiveReplica, QueuedTooLong

    router = LiveReplicaRouter(deployment_id=DeploymentID(name="Front", app_name="a"),
                               handle_source=DeploymentHandleSource.UNKNOWN)
    with pytest.raises(ValueError, match="max_wait_s"):
        router.initialize_state(max_queue_wait_s=5.0, max_wait_s=4.0)
    router.initialize_state(no_replica_timeout_s=1.0, max_queue_wait_s=5.0, max_wait_s=10.0)
    now = time.monotonic()
    queued = SimpleNamespace(created_at=time.time() - 0.45)  # queued 0.45 s ago: still judged by its expected wait
    assert 0.45 < ADMIT_WINDOW_S < 1.0
    assert router.finish_rate(now) is None  # nothing finished yet: only the time waited counts
    assert router._overdue(now, now, queued, ahead=1000, rate=None) is None
    router._finishes.extend(now - 1.0 + i * 0.05 for i in range(20))  # 20 calls finished over the last second
    rate = router.finish_rate(now)
    assert rate == pytest.approx(20.0)  # over 1 s
    assert router._overdue(now, now, queued, ahead=50, rate=rate) is None  # ~3 s in all: within the bound
    refused = router._overdue(now, now, queued, ahead=150, rate=rate)  # ~8 s: refused now, not after 5 s
    assert isinstance(refused, QueuedTooLong) and refused.status_code == 503 and refused.retry_after_s == 1.0
    assert "would wait 8.0 s in the queue, over its 5 s bound" in str(refused)  # 0.45 + 151 / 20
    admitted = SimpleNamespace(created_at=time.time() - ADMIT_WINDOW_S - 0.05)  # past its arrival: admitted
    assert router._overdue(now, now, admitted, ahead=150, rate=rate) is None  # keeps its place however slow the queue
    overdue = router._overdue(now, now, SimpleNamespace(created_at=time.time() - 10.2), ahead=0, rate=rate)
    assert isinstance(overdue, QueuedTooLong) and "over its 10 s bound" in str(overdue)  # ... up to max_wait_s
    router._finishes.clear()
    router._finishes.extend(now - 0.9 + i * 0.001 for i in range(20))  # one batch of 20: no rate yet
    assert router.finish_rate(now) is None
    for at in (now - 0.6, now - 0.3):  # two more batches of 20, 0.3 s apart: 20 calls per 0.3 s
        router._finishes.extend(at + i * 0.001 for i in range(20))
    assert router.finish_rate(now) == pytest.approx(40 / 0.6, rel=0.01)  # not 60 calls over the window
    assert router.finish_rate(now + 0.25) == router.finish_rate(now)  # no sag before the next batch
    router._empty_since = now - 2.0  # and no live replica for 2 s
    assert isinstance(router._overdue(now, now - 3.0, queued, ahead=0, rate=rate), NoLiveReplica)
    assert router._overdue(now, now - 0.5, queued, ahead=0, rate=rate) is None  # queued 0.5 s: not yet


def test_api_key_from_environment(monkeypatch):
    monkeypatch.setenv("MY_KEY", "s3cret")
    assert resolved_api_key(ServeSettings(api_key_env="MY_KEY")) == "s3cret"
    monkeypatch.setenv("MY_KEY", "")
    assert resolved_api_key(ServeSettings(api_key_env="MY_KEY")) is None


def test_an_open_api_beyond_loopback_is_refused_unless_public(monkeypatch):
    """Fail closed. A missing key secret must not silently mean an open API on 0.0.0.0."""
    from serve.config import is_loopback

    monkeypatch.delenv("MADR_TEST_UNSET_KEY", raising=False)
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.1.2.3", "search.internal"))
    open_api = ServeSettings(host="0.0.0.0", api_key_env="MADR_TEST_UNSET_KEY")
    with pytest.raises(ValueError, match="host '0.0.0.0' is not loopback and no API key.*public: true"):
        check_exposure(open_api)
    check_exposure(ServeSettings(host="0.0.0.0", api_key_env="MADR_TEST_UNSET_KEY", public=True))
    check_exposure(ServeSettings(host="0.0.0.0", api_key="k"))
    check_exposure(ServeSettings(api_key_env="MADR_TEST_UNSET_KEY"))  # loopback: a key is optional
    monkeypatch.setenv("MADR_TEST_UNSET_KEY", "from-env")
    check_exposure(open_api)


def test_deploy_tells_the_app_where_the_proxy_binds(tmp_path):
    """`serve deploy` configs: the app's host follows http_options.host, so its fail-closed check applies."""
    from pipelines.jobs.deploy import load_serve_config

    raw = yaml.safe_load((REPO / "serve" / "serve_config.yaml").read_text())
    raw["http_options"]["host"] = "0.0.0.0"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_serve_config(str(tmp_path / "s.yaml"))
    settings = settings_from_dict({**cfg["applications"][0]["args"], "api_key_env": "MADR_TEST_UNSET_KEY"})
    with pytest.raises(ValueError, match="not loopback"):
        check_exposure(settings)


def test_serve_config_yaml_is_valid_and_binds_loopback():
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load((REPO / "serve" / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    assert schema.http_options.host == "127.0.0.1"
    app = schema.applications[0]
    assert app.import_path == "serve.app:build_app"
    settings = settings_from_dict(app.args)
    names = {d.name for d in app.deployments}
    assert {"QueryEncoder", "SearchIngress"} | {f"searcher-{g}" for g in range(settings.shard_groups)} == names


def test_batched_search_equals_one_by_one(served_index):
    from madr.index.encode import encode_queries
    from serve.backend import EncodedQuery, ShardGroup, search_batched

    group = ShardGroup(served_index["manifest"], [0, 1, 2])
    dense, sparse = encode_queries(served_index["model"], served_index["queries"][:6])
    queries = [EncodedQuery(dense[i], sparse.select([i])) for i in range(6)]
    params = [SearchParams(k=5), SearchParams(k=5, lam=0.9), SearchParams(k=3)] * 2
    batched = search_batched(group.search, list(zip(queries, params, strict=True)))
    for q, p, (scores, ids) in zip(queries, params, batched, strict=True):
        s1, i1 = group.search(q.dense[None], p, sparse=q.sparse)
        np.testing.assert_allclose(scores, s1[0], rtol=1e-5, atol=1e-5)
        assert np.array_equal(ids, i1[0])


@pytest.fixture(scope="module")
def plain(served_index):
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), api_key_env="MADR_TEST_UNSET_KEY",
                             port=free_port(), body_timeout_s=1.0, max_header_bytes=4096)
    with running_plain_app(settings) as url:
        yield url


def test_plain_app_without_key_equals_offline(plain, served_index):
    from madr.index.encode import encode_queries
    from madr.search.sharded import ShardedIndex

    queries = served_index["queries"][:4]
    dense, sparse = encode_queries(served_index["model"], queries)
    ref_scores, ref_ids = ShardedIndex.open(served_index["manifest"]).search(dense, k=5, sparse=sparse)
    for qi, q in enumerate(queries):
        r = requests.post(plain + "/search", json={"query": q, "k": 5}, timeout=20)
        assert r.status_code == 200, r.text
        hits = r.json()["results"]
        assert_same_ranking([h["score"] for h in hits], [h["id"] for h in hits], ref_scores[qi], ref_ids[qi], q)
    assert requests.get(plain + "/ready", timeout=20).json()["ntotal"] == len(served_index["ids"])
    assert requests.post(plain + "/search", json={"query": ""}, timeout=20).status_code == 422


def test_plain_app_head_healthz_and_huge_doc_id(plain):
    assert requests.head(plain + "/healthz", timeout=20).status_code == 200
    r = requests.post(plain + "/explain", json={"query": "socks", "doc_id": 2**63}, timeout=20)
    assert r.status_code == 422 and "doc_id" in r.json()["error"], r.text


def test_plain_app_caps_headers_and_times_out_slow_bodies(plain):
    """A slow client held a connection 12 s; headers had no size cap."""
    r = requests.get(plain + "/healthz", headers={"X-Padding": "p" * 5000}, timeout=20)
    assert r.status_code == 431 and "4096 bytes" in r.json()["error"], r.text
    host, port = plain.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n{\"query\": ")  # and then nothing
        start = time.monotonic()
        reply = sock.recv(4096)
        waited = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 408") and b"not received within 1.0 s" in reply, reply[:200]
    assert waited < 5, f"the slow body held the connection {waited:.1f} s"
