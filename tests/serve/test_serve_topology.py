"""The two serving topologies (serve/colocated.py) side by side on one local Ray Serve, queried over HTTP on
127.0.0.1: one query set gets identical ids and scores from fan-out (ingress, QueryEncoder, two shard-group
deployments) and co-located (one deployment: encoder + every shard in each replica), also with a lambda
override; /encode, /explain and a bad request answer the same; the co-located app is one deployment; the
settings refuse an unknown topology and count the co-located replicas' CPUs."""

from __future__ import annotations

import pytest
import requests
from serve_helpers import free_port

from serve.client import MadrClient
from serve.config import DeploymentSettings, ServeSettings

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)

K = 10
APPS = {"fanout": "topo_fanout", "colocated": "topo_colocated"}


@pytest.fixture(scope="module")
def clients(ray_local, served_index):
    from ray import serve

    from serve.app import run_local, url

    small = DeploymentSettings(num_cpus=0.2, max_ongoing_requests=32)
    common = {"manifest_path": str(served_index["manifest"]), "port": free_port(),
              "api_key_env": "MADR_TEST_UNSET_KEY", "request_timeout_s": 60}  # a cold numba cache compiles on the first search
    settings = {"fanout": ServeSettings(**common, topology="fanout", shard_groups=2, encoder=small, searcher=small,
                                        ingress=small),
                "colocated": ServeSettings(**common, topology="colocated", colocated=small)}
    out = {}
    for topology, s in settings.items():
        run_local(s, name=APPS[topology], route_prefix=f"/{topology}")
        out[topology] = MadrClient(f"{url(s)}/{topology}")
        out[topology].wait_ready(timeout=60)
    yield out
    for c in out.values():
        c.close()
    serve.shutdown()


@pytest.mark.ray
def test_both_topologies_give_identical_answers(clients, served_index):
    fan, col = clients["fanout"], clients["colocated"]
    for q in served_index["queries"]:
        for lam in (None, 0.8):
            a, b = fan.search(q, k=K, lam=lam), col.search(q, k=K, lam=lam)
            got = [(h["id"], h["score"], h["doc"]) for h in b["results"]]
            assert got == [(h["id"], h["score"], h["doc"]) for h in a["results"]], f"{q!r} lam={lam}"
            assert len(got) == K
    q = served_index["queries"][0]  # one text: a batch of one in both (batch size moves floats by ~1e-7)
    assert col.encode([q]) == fan.encode([q])
    doc_id = int(served_index["ids"][5])
    assert col.explain(q, doc_id=doc_id) == fan.explain(q, doc_id=doc_id)
    bad = [requests.post(f"{c.base_url}/search", json={"query": "\u200b ", "k": K}, timeout=20)
           for c in (fan, col)]
    assert [r.status_code for r in bad] == [422, 422] and bad[0].json() == bad[1].json()


@pytest.mark.ray
def test_colocated_app_is_one_deployment_holding_every_shard(clients):
    from ray import serve

    deployments = serve.status().applications[APPS["colocated"]].deployments
    assert set(deployments) == {"Colocated"}, f"co-located app deploys {sorted(deployments)}"
    assert clients["colocated"].ready()["shard_groups"] == [[0, 1, 2]]
    assert clients["fanout"].ready()["shard_groups"] == [[0, 1], [2]]


def test_topology_setting_is_checked_and_counts_its_cpus():
    from serve.app import min_app_cpus

    with pytest.raises(ValueError, match="topology must be one of colocated, fanout, got 'star'"):
        ServeSettings(topology="star")
    assert ServeSettings().topology == "colocated"
    s = ServeSettings(colocated=DeploymentSettings(num_cpus=0.5, num_replicas=3))
    assert min_app_cpus(s, num_shards=4) == 1.5  # replicas x CPUs; shard groups do not apply


def test_colocated_serve_config_yaml_names_its_one_deployment():
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from serve.config import settings_from_dict

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "serve" / "serve_config_colocated.yaml").read_text())
    app = ServeDeploySchema.model_validate(raw).applications[0]
    assert settings_from_dict(app.args).topology == "colocated" and raw["http_options"]["host"] == "127.0.0.1"
    assert [d.name for d in app.deployments] == ["Colocated"]
