"""Aspects as a search signal over the plain app (`serve.api.plain_app`, real HTTP on 127.0.0.1): an index encoded
(in process, 2 shards, with a BM25 part) from a tiny MADRAL model stores its products' calibrated aspect values;
`/search` fuses the aspect-match score at `aspect_weight`, filters / boosts by the caller's aspect values or the
query's own predicted ones, refuses bad aspect requests with a 422 naming the field, and `/explain` shows the
calibrated aspects behind the aspect-match score. One Ray Serve run checks the fan-out app answers the same."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
import torch
from serve_helpers import TINY, docs_table, free_port, running_plain_app

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.calibration import AspectCalibration
from madr.search.aspect_match import AspectStore, aspect_match
from serve.config import DeploymentSettings, ServeSettings

K = 10


@pytest.fixture(scope="module")
def aspect_index(catalog, tokenizer, vocabularies, tmp_path_factory) -> dict:
    from madr.encode_config import EncodeConfig
    from madr.modeling.model import BiEncoder, build_model
    from pipelines.encode.job import run_encode

    root = tmp_path_factory.mktemp("served_aspects")
    torch.manual_seed(0)
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=TINY), max_query_length=24, max_doc_length=48)
    model = build_model(cfg, tokenizer, vocabularies)
    model.calibration = AspectCalibration({"query": {"brand": 0.3}, "doc": {"brand": 0.3}}, "test")
    model.save(root / "model")
    ids = np.arange(len(catalog.products), dtype=np.int64) * 3 + 5
    docs = docs_table(catalog, ids)
    (root / "corpus").mkdir()
    pq.write_table(docs.select(["doc_id", "text", "title", "brand"]), root / "corpus" / "docs.parquet")
    run_encode(EncodeConfig(input=[str(root / "corpus")], output=str(root / "index"), model_dir=str(root / "model"),
                            text_columns=["text"], display_columns=["title", "brand"], num_shards=2,
                            rows_per_read=100, lexical="bm25", aspect_top_k=4), log=lambda _: None, local=True)
    manifest = root / "index" / "manifest.json"
    return {"model": BiEncoder.load(root / "model").eval(), "manifest": manifest, "store": AspectStore.open(manifest),
            "queries": [q.text for q in catalog.queries[:3]]}


def _settings(idx: dict, **kw) -> ServeSettings:
    return ServeSettings(manifest_path=str(idx["manifest"]), api_key_env="MADR_TEST_UNSET_KEY", port=free_port(),
                         doc_text_field="title", **kw)


def _search(url: str, **body) -> requests.Response:
    return requests.post(url + "/search", json={"k": K, **body}, timeout=60)


def _top_brand(store: AspectStore, ids: list[int]) -> list[str]:
    table = store.lookup(np.array(ids, dtype=np.int64))
    return store.names("brand", table["brand"].values[:, 0])


def test_aspect_weight_filter_boost_and_explain(aspect_index):
    from madr.modeling.aspect_distributions import encode_aspects

    store, query = aspect_index["store"], aspect_index["queries"][0]
    with running_plain_app(_settings(aspect_index)) as url:
        plain = _search(url, query=query).json()
        assert plain["aspects"] is None  # the index's weight is 0 and nothing was asked
        ids = [h["id"] for h in plain["results"]]
        # aspect_weight 1: the candidates ranked by the aspect match alone
        full = _search(url, query=query, aspect_weight=1.0).json()
        got = [h["id"] for h in full["results"]]
        q = encode_aspects(aspect_index["model"], [query], "query", store.info.k)
        match = aspect_match(q, 0, store.lookup(np.array(got))).total
        np.testing.assert_allclose([h["score"] for h in full["results"]], match, atol=1e-5)
        assert np.all(np.diff(match) <= 1e-9) and full["aspects"]["weight"] == 1.0 and got != ids
        # the caller's values: filter keeps only products whose top stored brand is wanted (precision 1)
        brand = _top_brand(store, ids[:1])[0]
        kept = _search(url, query=query, aspects={"brand": [brand.upper()]}).json()
        kept_ids = [h["id"] for h in kept["results"]]
        assert kept_ids and set(_top_brand(store, kept_ids)) == {brand}
        assert kept["aspects"]["source"] == "request" and kept["aspects"]["values"] == {"brand": [brand]}
        # boost: the same products first, then the others
        boosted = _search(url, query=query, aspects={"brand": [brand]}, aspect_filter={"mode": "boost"}).json()
        b_ids = [h["id"] for h in boosted["results"]]
        n = min(len(kept_ids), K)
        assert b_ids[:n] == kept_ids[:n] and len(b_ids) == K
        assert np.all(np.diff([h["score"] for h in boosted["results"]]) <= 1e-9)  # scores in ranking order
        assert brand not in _top_brand(store, b_ids[n:])
        # the query's own predicted values above a confidence
        pred = _search(url, query=query, aspect_filter={"mode": "filter", "min_confidence": 0.01}).json()
        assert pred["aspects"]["source"] == "predicted" and pred["aspects"]["values"]
        for a, values in pred["aspects"]["values"].items():
            table = store.lookup(np.array([h["id"] for h in pred["results"]]))
            assert set(store.names(a, table[a].values[:, 0])) <= set(values)
        # /explain: the calibrated aspects of both sides and each aspect's contribution
        out = requests.post(url + "/explain", json={"query": query, "doc_id": ids[0]}, timeout=60).json()
        am = out["aspect_match"]
        assert am["calibrated"] and am["index_aspect_weight"] == 0.0
        assert {r["aspect"] for r in am["aspects"]} == set(store.aspects)
        assert am["score"] == pytest.approx(sum(r["contribution"] for r in am["aspects"]), abs=1e-6)
        for r in am["aspects"]:
            assert 0 <= r["query_presence"] <= 1 and r["query_values"] and r["doc_values"]
            assert {"value", "probability"} <= set(r["query_values"][0])


@pytest.mark.parametrize("body, field", [
    ({"aspects": {"size": ["xl"]}}, "aspects"),
    ({"aspects": {"brand": ["no such brand"]}}, "aspects.brand"),
    ({"aspects": {"brand": []}}, "aspects"),
    ({"aspect_weight": 1.5}, "aspect_weight"),
    ({"aspect_filter": {"mode": "drop"}}, "aspect_filter"),
    ({"aspect_filter": {"min_confidence": 0}}, "aspect_filter"),
    ({"aspect_filter": {"min_confidence": 0.5, "extra": 1}}, "aspect_filter"),
])
def test_bad_aspect_requests_name_the_field(aspect_index, body, field):
    with running_plain_app(_settings(aspect_index)) as url:
        r = _search(url, query="red shoes", **body)
        assert r.status_code == 422, r.text
        assert field in r.json()["error"], r.json()


def test_an_index_without_aspect_data_refuses_aspect_requests(served_index):
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), api_key_env="MADR_TEST_UNSET_KEY",
                             port=free_port())
    with running_plain_app(settings) as url:
        for body in ({"aspect_filter": {"min_confidence": 0.7}}, {"aspects": {"brand": ["acme"]}},
                     {"aspect_weight": 0.5}):
            r = _search(url, query="red shoes", **body)
            assert r.status_code == 422 and "no aspect data" in r.json()["error"], r.text
        assert _search(url, query="red shoes", aspect_weight=0.0).status_code == 200


@pytest.mark.ray
@pytest.mark.slow
def test_ray_serve_app_applies_the_aspect_stage(ray_local, aspect_index):
    from ray import serve

    from serve.app import run_local

    small = {"num_cpus": 0.1, "num_replicas": 1}
    settings = _settings(aspect_index, topology="fanout", request_timeout_s=60,
                         encoder=DeploymentSettings(**small), searcher=DeploymentSettings(**small),
                         ingress=DeploymentSettings(**small))
    query = aspect_index["queries"][1]
    with running_plain_app(_settings(aspect_index)) as url:
        want = _search(url, query=query, aspect_weight=0.5,
                       aspect_filter={"mode": "boost", "min_confidence": 0.01}).json()
    run_local(settings, name="madr_aspects")
    try:
        got = _search(f"http://127.0.0.1:{settings.port}", query=query, aspect_weight=0.5,
                      aspect_filter={"mode": "boost", "min_confidence": 0.01}).json()
    finally:
        serve.shutdown()  # the proxy too: the next module starts Serve on its own port
    assert [h["id"] for h in got["results"]] == [h["id"] for h in want["results"]]
    assert got["aspects"] == want["aspects"]


def test_the_encoder_computes_aspect_values_only_for_the_queries_that_use_them(aspect_index):
    """A second pass of the query tower only for the texts whose search uses aspects (`wants_aspects`)."""
    from madr.modeling.aspect_distributions import encode_aspects
    from madr.search.query_encoder import LeanQueryEncoder
    from serve.backend import encode_texts

    model, texts = aspect_index["model"], aspect_index["queries"]
    rows = encode_texts(LeanQueryEncoder(model), texts, aspect_k=4, wants_aspects=[True, False, True])
    assert rows[1].aspects is None and rows[0].aspects is not None and rows[2].aspects is not None
    want = encode_aspects(model, [texts[0], texts[2]], "query", 4)
    for row, i in ((rows[0], 0), (rows[2], 1)):
        np.testing.assert_allclose(row.aspects["brand"].probs[0], want["brand"].probs[i], atol=1e-6)
    assert all(r.aspects is None for r in encode_texts(LeanQueryEncoder(model), texts, aspect_k=4,
                                                        wants_aspects=[False] * 3))
