"""The encode job and the Serve app on a 3-node cluster (conftest: separate raylets on 127.0.0.1), behind the
`multinode` marker (not in the default run: 150-240 s measured on the shared 2 cores at load average 25-45;
`make test-multinode`, a CI step of its own):

1. encode: 600 docs -> 3 Flat hybrid shards with 2 tokenise and 2 encode actors started at once and SPREAD
   (`spread_actors`): each kind of actor ran on 2 different nodes (Ray's actor table), and the index is exact:
   every id once, the shard files byte for byte those of an in-process run of the same plan. (Checked to fail
   when the actors pack: with the DataContext strategy "DEFAULT" and spread_actors off both EncodeDocs actors
   ran on one node);
2. serve: that index served with 2 replicas of every deployment, at most one per node
   (`max_replicas_per_node: 1`), HTTP on the head; the worker node holding the most replicas is killed while
   4 clients send /search: every request is answered (200, or 503 + Retry-After: 1 while no replica is
   reachable), none stalls, and Serve brings every deployment back to 2 replicas on the nodes left. The
   exception, Ray Serve's own: a request in flight on an ingress replica of the removed node gets 500 from
   Serve's HTTP proxy (2.60 turns the replica's RayActorError into 500 and does not retry it); at most one per
   client, and none sent after the cluster marked the node dead.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.data.synthetic.catalog import generate_catalog
from madr.index import Manifest
from tests.serve.serve_helpers import Load, free_port, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multinode]

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
N_DOCS = 600
APP = "madr"
DEPLOYMENTS = ("QueryEncoder", "searcher-0", "SearchIngress")
CLIENTS = 4
SLOW_S = 5.0  # no answer may take longer (route_timeout_s 1 s + retries + a dead node noticed on busy cores)


def alive_actor_nodes(class_part: str) -> list[str]:
    """Node ids of the live actors whose class name contains `class_part` (GCS actor table; no dashboard)."""
    from ray._private.state import actors

    return [a["Address"]["NodeID"] for a in actors().values()
            if class_part in a["ActorClassName"] and a["State"] == "ALIVE"]


def actor_nodes_ever(class_part: str) -> list[str]:
    """Node ids of every actor (alive or finished) whose class name contains `class_part`."""
    from ray._private.state import actors

    return [a["Address"]["NodeID"] for a in actors().values() if class_part in a["ActorClassName"]]


@pytest.fixture(scope="module")
def encoded(cluster, tokenizer, tmp_path_factory) -> dict:
    """The encode job run on the cluster (and in process, for reference) over a 600-doc corpus."""
    from madr.encode_config import EncodeConfig
    from madr.modeling.model import build_model
    from pipelines.encode.job import run_encode

    root = tmp_path_factory.mktemp("mn_encode")
    catalog = generate_catalog(num_products=N_DOCS, num_queries=20, seed=5)
    table = pa.table({"doc_id": np.arange(N_DOCS, dtype=np.int64) * 7 + 5,
                      "title": [p.title for p in catalog.products],
                      "description": [p.description for p in catalog.products]})
    (root / "docs").mkdir()
    pq.write_table(table.slice(0, 300), root / "docs" / "a.parquet")
    pq.write_table(table.slice(300), root / "docs" / "b.parquet")
    torch.manual_seed(0)
    build_model(ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=16, max_query_length=16,
                            max_doc_length=32, hybrid_lambda=0.4), tokenizer).save(root / "model")

    def config(out: str) -> EncodeConfig:
        return EncodeConfig(input=[str(root / "docs")], output=str(root / out), model_dir=str(root / "model"),
                            text_columns=["title", "description"], num_shards=3, index_factory="Flat",
                            rows_per_read=50, tokenize_actors=2, encode_actors=2, spread_actors=True,
                            tokenize_cpus=0.5, encode_cpus=0.5, torch_threads=1,
                            tokenize_in_encoder=False)  # both kinds of actor (on CPU they are one by default)

    cfg = config("index")
    result = run_encode(cfg, log=lambda _: None)
    run_encode(config("reference"), local=True, log=lambda _: None)
    return {"cfg": cfg, "result": result, "root": root, "table": table,
            "queries": [q.text for q in catalog.queries]}


def test_encode_actors_spread_over_nodes_and_the_index_is_exact(cluster, encoded):
    from pipelines.encode.job import verify_index

    for kind in ("TokenizeDocs", "EncodeDocs"):
        nodes = actor_nodes_ever(kind)
        assert len(nodes) == 2 and len(set(nodes)) == 2, f"{kind} actors ran on nodes {nodes}, not on 2 nodes"
        assert set(nodes) <= cluster.node_ids()
    result = encoded["result"]
    assert result.num_docs == N_DOCS and result.report["duplicates"] == [] and result.report["num_ids"] == N_DOCS
    report = verify_index(encoded["cfg"])
    assert report["ok"] and report["missing"] == [] and report["unexpected"] == []
    got, ref = Manifest.load(encoded["root"] / "index"), Manifest.load(encoded["root"] / "reference")
    assert got.num_docs == N_DOCS and [s.count for s in got.shards] == [s.count for s in ref.shards]
    assert [s.sha256 for s in got.shards] == [s.sha256 for s in ref.shards], \
        "shards written by actors on several nodes differ from the in-process run's"


def _placement() -> dict[str, list[str]]:
    return {d: alive_actor_nodes(f"ServeReplica:{APP}:{d}") for d in DEPLOYMENTS}


def test_serve_replicas_on_two_nodes_keep_answering_when_one_node_dies(cluster, encoded):
    from ray import serve

    from serve.app import run_local, url
    from serve.config import DeploymentSettings, ServeSettings

    port = free_port()
    small = {"num_cpus": 0.2, "num_replicas": 2, "max_replicas_per_node": 1, "health_check_period_s": 1.0}
    settings = ServeSettings(manifest_path=str(encoded["root"] / "index" / "manifest.json"), port=port,
                             topology="fanout", shard_groups=1, request_timeout_s=20, route_timeout_s=1.0, access_log=False,
                             log_level="WARNING", encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small), ingress=DeploymentSettings(**small))
    # one HTTP proxy, on the head: every node here has the address 127.0.0.1, so proxies on each would share a port
    serve.start(proxy_location="HeadOnly", http_options={"host": settings.host, "port": settings.port})
    try:
        run_local(settings)
        base = url(settings)
        wait_for(lambda: requests.get(base + "/ready", timeout=5).status_code == 200, 60, "the app is not ready")
        placed = _placement()
        for d, nodes in placed.items():
            assert len(nodes) == 2 and len(set(nodes)) == 2, f"{d}: replicas on {nodes}, not on 2 nodes"
        counts = Counter(n for nodes in placed.values() for n in nodes if n != cluster.head_id)
        victim = counts.most_common(1)[0][0]

        with Load(base, encoded["queries"], clients=CLIENTS) as load:
            wait_for(lambda: len(load.answers) >= 2 * CLIENTS, 30, "no answers before the node was removed")
            t_kill = time.monotonic()
            cluster.remove(cluster.worker_with(victim))
            t_dead = time.monotonic()
            wait_for(lambda: all(len(set(n)) == 2 and victim not in n for n in _placement().values()), 60,
                  f"Serve did not bring every deployment back to 2 replicas off node {victim}")
            t_back = time.monotonic()
            wait_for(lambda: sum(a.sent > t_back for a in load.answers) >= 2 * CLIENTS, 30, "no answers afterwards")
        after_kill = load.since(t_kill)
        summary = Counter(a.status for a in after_kill)
        failed = [(round(a.sent - t_kill, 2), a.status, a.body) for a in after_kill if a.status not in (200, 503)]
        # Ray Serve's proxy answers 500 for a request whose ingress replica dies under it (RayActorError, not
        # retried: Serve cannot know the request is safe to repeat); only the requests on the removed node's
        # ingress replica before the cluster knew the node dead may get it, at most one per client
        lost = [f for f in failed if f[1] == 500 and f[0] < t_dead - t_kill]
        assert lost == failed and len(lost) <= CLIENTS, \
            f"answers after the node died: {summary}; failures (sent at s after the kill, status, body): {failed}"
        assert all(a.retry_after == "1" for a in after_kill if a.status == 503), "a 503 without Retry-After: 1"
        slowest = max(a.took_s for a in after_kill)
        assert slowest < SLOW_S, f"a request took {slowest:.1f} s"
        assert summary[200] >= 0.5 * len(after_kill), f"mostly failures while a node was down: {summary}"
        assert all(a.status == 200 for a in load.answers if a.sent > t_back), "not all 200 once the replicas were back"
    finally:
        serve.shutdown()

