"""The Serve app on a local Ray, queried over real HTTP on 127.0.0.1: results equal the offline ShardedIndex
search of the same saved model; filters, lambda override, /explain, /encode; every bad input gets its 4xx;
the API key is enforced; a killed searcher replica is replaced and queries succeed again."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests
from serve_helpers import assert_same_ranking, free_port

from serve.client import MadrAPIError, MadrClient
from serve.config import DeploymentSettings, ServeSettings

pytestmark = pytest.mark.ray

KEY = "test-key-123"
K = 10


@pytest.fixture(scope="module")
def app(ray_local, served_index):
    from ray import serve

    from serve.app import APP_NAME, run_local, url

    small = {"num_cpus": 0.2, "max_ongoing_requests": 32}
    settings = ServeSettings(manifest_path=str(served_index["manifest"]), api_key=KEY, port=free_port(),
                             topology="fanout", shard_groups=2, max_k=50, max_filter_fetch=400, max_body_bytes=4096,
                             max_query_chars=200, request_timeout_s=20,
                             encoder=DeploymentSettings(**small),
                             searcher=DeploymentSettings(**small, health_check_period_s=1.0),
                             ingress=DeploymentSettings(**small))
    run_local(settings)
    client = MadrClient(url(settings), api_key=KEY)
    client.wait_ready(timeout=60)
    yield {"client": client, "url": url(settings), "settings": settings, "app_name": APP_NAME}
    client.close()
    serve.shutdown()


@pytest.fixture(scope="module")
def offline(served_index):
    """The offline reference: encode_queries + ShardedIndex.search over the same manifest and model."""
    from madr.index.encode import encode_queries
    from madr.search.sharded import ShardedIndex

    index = ShardedIndex.open(served_index["manifest"])

    def search(queries: list[str], k: int, lam: float | None = None):
        dense, sparse = encode_queries(served_index["model"], queries)
        return index.search(dense, k=k, sparse=sparse, lam=lam)

    return search


def test_search_equals_offline_sharded_index(app, served_index, offline):
    queries = served_index["queries"]
    ref_scores, ref_ids = offline(queries, K)
    docs = {int(d["doc_id"]): d for d in served_index["docs"].to_pylist()}
    for qi, q in enumerate(queries):
        res = app["client"].search(q, k=K)
        got_ids = [h["id"] for h in res["results"]]
        assert_same_ranking([h["score"] for h in res["results"]], got_ids, ref_scores[qi], ref_ids[qi], q)
        for h in res["results"]:
            assert h["doc"]["title"] == docs[h["id"]]["title"], f"doc fields of {h['id']} do not match the store"


def test_lambda_override_and_fields(app, served_index, offline):
    q = served_index["queries"][0]
    ref_scores, ref_ids = offline([q], 5, lam=0.9)
    res = app["client"].search(q, k=5, lam=0.9, fields=["brand"])
    assert_same_ranking([h["score"] for h in res["results"]], [h["id"] for h in res["results"]],
                        ref_scores[0], ref_ids[0], "lam=0.9")
    assert all(set(h["doc"]) == {"brand"} for h in res["results"])
    bare = app["client"].search(q, k=5, include_docs=False)
    assert all(h["doc"] is None for h in bare["results"])


def test_aspect_filters_equal_offline_post_filter(app, served_index, offline):
    docs = served_index["docs"].to_pylist()
    pairs = [(d["brand"], c) for d in docs if d["brand"] for c in d["color"]]
    brand, color = max(set(pairs), key=pairs.count)  # the most frequent (brand, colour) pair
    by_id = {int(d["doc_id"]): d for d in docs}
    q = served_index["queries"][1]
    res = app["client"].search(q, k=K, filters={"brand": brand.upper(), "color": [color, "no-such-colour"]})
    assert res["filter"]["fetched"] >= K
    ref_scores, ref_ids = offline([q], res["filter"]["fetched"])
    keep = [j for j, i in enumerate(ref_ids[0]) if i >= 0 and by_id[int(i)]["brand"] == brand
            and color in by_id[int(i)]["color"]][:K]
    assert res["filter"]["matched"] == len(keep) and len(keep) > 0, "filter matched nothing: weak test data"
    assert_same_ranking([h["score"] for h in res["results"]], [h["id"] for h in res["results"]],
                        ref_scores[0][keep], ref_ids[0][keep], "filtered")
    for h in res["results"]:
        assert h["doc"]["brand"] == brand and color in h["doc"]["color"]


def test_explain_by_id_and_by_text(app, served_index):
    from serve.backend import explain_texts

    doc = served_index["docs"].to_pylist()[7]
    q = served_index["queries"][2]
    ref = explain_texts(served_index["model"], q, doc["text"])
    by_id = app["client"].explain(q, doc_id=int(doc["doc_id"]))
    by_text = app["client"].explain(q, doc_text=doc["text"])
    for got in (by_id, by_text):
        assert got["model"] == "hybrid"
        assert got["hybrid_score"] == pytest.approx(ref["hybrid_score"], abs=1e-4)
        assert [m["term"] for m in got["matched_terms"]] == [m["term"] for m in ref["matched_terms"]]
        assert {"term", "weight"} <= set(got["query"]["expansion_terms"][0])
        assert "aspects" in got["query"] and "aspects" in got["doc"]
    assert by_id["doc_id"] == int(doc["doc_id"])


def test_encode_returns_dense_and_sparse_terms(app, served_index):
    from madr.index.encode import encode_queries

    texts = served_index["queries"][:3]
    res = app["client"].encode(texts, top_terms=5)
    dense, sparse = encode_queries(served_index["model"], texts)
    assert res["dim"] == dense.shape[1]
    for i, r in enumerate(res["results"]):
        np.testing.assert_allclose(r["dense"], dense[i], atol=1e-4)
        ids, weights = sparse.row(i)
        assert r["sparse_nnz"] == len(ids)
        top = sorted(zip(weights.tolist(), ids.tolist(), strict=True), reverse=True)[:5]
        np.testing.assert_allclose([t["weight"] for t in r["terms"]], [w for w, _ in top], atol=1e-4)
        assert {t["id"] for t in r["terms"]} == {i for _, i in top}
        names = served_index["model"].tokenizer.convert_ids_to_tokens([t["id"] for t in r["terms"]])
        assert [t["term"] for t in r["terms"]] == names


def test_health_ready_openapi(app, served_index):
    c = app["client"]
    assert c.health() == {"status": "ok", "search_mode": "hybrid"}  # the index's mode: SPLADE hybrid
    ready = c.ready()
    assert ready["ready"] and ready["ntotal"] == len(served_index["ids"]) and ready["num_shards"] == 3
    assert ready["search_mode"] == "hybrid"
    assert ready["shard_groups"] == [[0, 1], [2]]
    schema = c._request("GET", "/openapi.json")
    assert {"/search", "/explain", "/encode", "/healthz", "/ready"} <= set(schema["paths"])


BAD = [
    ("/search", {"query": ""}, 422, "at least 1 character"),
    ("/search", {"query": "   "}, 422, "blank"),
    ("/search", {"query": "x" * 201}, 422, "at most 200 characters"),
    ("/search", {"query": 5}, 422, "valid string"),
    ("/search", {"query": "shoes", "k": 0}, 422, "greater than or equal to 1"),
    ("/search", {"query": "shoes", "k": 51}, 422, "less than or equal to 50"),
    ("/search", {"query": "shoes", "k": "10"}, 422, "valid integer"),
    ("/search", {"query": "shoes", "k": 2.5}, 422, "valid integer"),
    ("/search", {"query": "shoes", "lam": 1.5}, 422, "less than or equal to 1"),
    ("/search", {"query": "shoes", "filters": {"size": "xl"}}, 422, "unknown filter field 'size'"),
    ("/search", {"query": "shoes", "filters": {"brand": []}}, 422, "give 1 to"),
    ("/search", {"query": "shoes", "filters": {"brand": [3]}}, 422, "brand"),
    ("/search", {"query": "shoes", "fields": ["price"]}, 422, "unknown document field"),
    ("/search", {"query": "shoes", "top": 3}, 422, "Extra inputs are not permitted"),
    ("/search", ["shoes"], 422, "body"),
    ("/explain", {"query": "shoes"}, 422, "exactly one of doc_id and doc_text"),
    ("/explain", {"query": "shoes", "doc_id": 1, "doc_text": "a"}, 422, "exactly one"),
    ("/explain", {"query": "shoes", "doc_id": 4}, 404, "not in the DocStore"),
    ("/encode", {"texts": []}, 422, "at least 1 item"),
    ("/encode", {"texts": ["a"] * 33}, 422, "at most 32 items"),
    ("/encode", {"texts": ["ok", " "]}, 422, "texts[1]"),
    # unpaired surrogates, invisible-only text and int64 overflow are 422s naming the field
    ("/encode", {"texts": ["ok", "\ud800"]}, 422, "texts[1] holds an unpaired UTF-16 surrogate"),
    ("/encode", {"texts": ["ok", "\u200b\ufeff"]}, 422, "texts[1] is blank"),
    ("/search", {"query": "\u200b\u200c\u200d"}, 422, "query is blank"),
    ("/search", {"query": "\x00\x00"}, 422, "query is blank"),
    ("/explain", {"query": "shoes", "doc_text": "\u2060 \x00"}, 422, "doc_text is blank"),
    ("/explain", {"query": "shoes", "doc_id": 2**63}, 422, "doc_id"),
    ("/explain", {"query": "shoes", "doc_id": 2**64 + 5}, 422, "doc_id"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[f"{p}-{m}" for p, _, _, m in BAD])
def test_bad_input_gets_4xx_with_message(app, path, body, status, message):
    r = requests.post(app["url"] + path, json=body, headers={"X-API-Key": KEY}, timeout=20)
    assert r.status_code == status, r.text
    assert message in r.json()["error"], r.json()


def test_malformed_json_and_oversized_body(app):
    headers = {"X-API-Key": KEY, "Content-Type": "application/json"}
    r = requests.post(app["url"] + "/search", data=b'{"query": "shoes", ', headers=headers, timeout=20)
    assert r.status_code == 422 and "JSON" in r.json()["error"], r.text
    big = json.dumps({"query": "shoes", "filters": {"brand": ["b" * 100] * 60}})
    r = requests.post(app["url"] + "/search", data=big, headers=headers, timeout=20)
    assert r.status_code == 413 and "4096 bytes" in r.json()["error"], r.text

    def chunks():  # no Content-Length: the streamed body is counted
        for _ in range(10):
            yield b" " * 1000

    r = requests.post(app["url"] + "/search", data=chunks(), headers=headers, timeout=20)
    assert r.status_code == 413, r.text


def test_undecodable_or_deeply_nested_body_is_422_naming_the_problem(app):
    headers = {"X-API-Key": KEY, "Content-Type": "application/json"}
    r = requests.post(app["url"] + "/search", data=b'{"query": "sh\xffoes"}', headers=headers, timeout=20)
    assert r.status_code == 422 and "not valid UTF-8" in r.json()["error"], r.text
    r = requests.post(app["url"] + "/search", data=b"[" * 2000 + b"]" * 2000, headers=headers, timeout=20)
    assert r.status_code == 422 and "nested too deeply" in r.json()["error"], r.text


def test_head_healthz_answers_200(app):
    r = requests.head(app["url"] + "/healthz", headers={"X-API-Key": KEY}, timeout=20)
    assert r.status_code == 200, r.status_code


def test_bad_text_in_a_batch_fails_only_its_own_request(app, served_index):
    """Texts sent straight to the batching QueryEncoder arrive in one batch; the unpaired
    surrogate used to raise inside the batch and fail every member."""
    from ray import serve

    encoder = serve.get_deployment_handle("QueryEncoder", app_name=app["app_name"])
    good = served_index["queries"][:6]
    for _ in range(3):
        texts = good[:3] + ["bad \ud800"] + good[3:] + ["\udfff"]
        responses = [encoder.encode.remote(t) for t in texts]  # submitted together: one batch
        for t, resp in zip(texts, responses, strict=True):
            if t in good:
                assert resp.result(timeout_s=30).dense.shape[0] > 0
            else:
                with pytest.raises(Exception, match="unpaired UTF-16 surrogate"):
                    resp.result(timeout_s=30)


def test_bad_requests_under_load_fail_no_good_request(app, served_index):
    """Over HTTP: good /search requests mixed with bad /encode ones, all concurrent; no good one fails."""
    from concurrent.futures import ThreadPoolExecutor

    def call(i: int) -> tuple[bool, int, str]:
        if i % 3 == 0:
            body, path = {"texts": ["ok", "\ud800"]}, "/encode"
        else:
            body, path = {"query": served_index["queries"][i % 12], "k": 3}, "/search"
        r = requests.post(app["url"] + path, json=body, headers={"X-API-Key": KEY}, timeout=30)
        return path == "/search", r.status_code, r.text

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(60)))
    good = [(status, text) for is_good, status, text in results if is_good]
    bad = [status for is_good, status, _ in results if not is_good]
    assert all(status == 200 for status, _ in good), [g for g in good if g[0] != 200][:3]
    assert bad and all(status == 422 for status in bad), bad


def test_api_key_is_required_when_set(app):
    for headers in ({}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}):
        r = requests.post(app["url"] + "/search", json={"query": "shoes"}, headers=headers, timeout=20)
        assert r.status_code == 401 and "API key" in r.json()["error"], (headers, r.text)
        assert requests.get(app["url"] + "/ready", headers=headers, timeout=20).status_code == 401
    r = requests.post(app["url"] + "/search", json={"query": "shoes", "k": 2},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=20)
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    with pytest.raises(MadrAPIError) as err:
        MadrClient(app["url"]).search("shoes")
    assert err.value.status == 401


def test_killed_searcher_replica_is_replaced(app, served_index):
    import ray
    from ray import serve

    handle = serve.get_deployment_handle("searcher-0", app_name=app["app_name"])
    before = handle.info.remote().result(timeout_s=30)["replica"]
    q = served_index["queries"][3]
    expected = [h["id"] for h in app["client"].search(q, k=K)["results"]]
    ray.kill(ray.get_actor(before, namespace="serve"), no_restart=True)
    statuses, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        t = time.monotonic()
        r = requests.post(app["url"] + "/search", json={"query": q, "k": K}, headers={"X-API-Key": KEY}, timeout=30)
        took = time.monotonic() - t
        statuses.append(r.status_code)
        if r.status_code == 200:
            break
        assert r.status_code == 503, f"a dead replica must give 503, got {r.status_code}: {r.text}"
        assert r.headers.get("Retry-After") == "1" and took < 2.5, (dict(r.headers), took)
        time.sleep(0.5)
    assert statuses[-1] == 200, f"no successful search 60 s after the kill: {statuses[-5:]}"
    assert [h["id"] for h in r.json()["results"]] == expected
    after = handle.info.remote().result(timeout_s=30)["replica"]
    assert after != before, "the replica answering is still the killed one"
    for q in served_index["queries"][:4]:
        app["client"].search(q, k=3)
