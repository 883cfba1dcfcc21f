"""Serving an index with a BM25 part (dense + BM25 fusion): the encode job (in process, `lexical: bm25`,
2 shards) indexes the session catalog with a mean-pooled BiBERT that has e5-style prefixes; the Ray Serve app
(2 shard groups, over real HTTP on 127.0.0.1) and the plain FastAPI app answer `/search` with the fused results
of the in-process reference (exact dense top-100 + `BM25Index().fit` over the raw texts' word pieces,
`weighted_fusion` min-max at the manifest's lam, or the request's), as do `ShardedIndex` and the evaluation
jobs' `search_texts`; `/healthz` and `/ready` say the mode. An index built with its own `lexical_tokenizer`
(a WordPiece of another vocabulary than the model's) is served the same way, its queries split by that tokenizer
(loaded from the index directory by the plain app's `LocalBackend` and the Serve app's `QueryEncoder`)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
import torch
from serve_helpers import TINY, assert_same_ranking, docs_table, free_port, latency_lines, running_plain_app

from madr.config import BackboneConfig, ModelConfig
from madr.index.manifest import record_fusion
from serve.config import DeploymentSettings, ServeSettings

K, N_CAND, LAM = 10, 100, 0.4


def _build(catalog, tokenizer, root, own_tokenizer: bool = False) -> dict:
    from madr.encode_config import EncodeConfig
    from madr.modeling.model import BiEncoder, build_model
    from madr.modeling.tokenization import train_wordpiece_tokenizer
    from pipelines.encode.job import run_encode

    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", pooling="mean", backbone=BackboneConfig(tiny=TINY), max_query_length=24,
                      max_doc_length=48, text_prefixes={"query": "query: ", "doc": "passage: "})
    build_model(cfg, tokenizer).save(root / "model")
    ids = np.arange(len(catalog.products), dtype=np.int64) * 3 + 5
    docs = docs_table(catalog, ids)
    (root / "corpus").mkdir()
    pq.write_table(docs.select(["doc_id", "text", "title", "brand"]), root / "corpus" / "docs.parquet")
    texts = docs.column("text").to_pylist()
    own = train_wordpiece_tokenizer(texts, vocab_size=250, out_dir=str(root / "own_tok")) if own_tokenizer else None
    run_encode(EncodeConfig(input=[str(root / "corpus")], output=str(root / "index"), model_dir=str(root / "model"),
                            text_columns=["text"], display_columns=["title", "brand"], num_shards=2,
                            rows_per_read=100, lexical="bm25", fusion_lambda=LAM,
                            lexical_tokenizer=str(root / "own_tok") if own_tokenizer else None),
               log=lambda _: None, local=True)
    model = BiEncoder.load(root / "model").eval()
    normalisation = "minmax"
    if own_tokenizer:  # as the tune stage leaves it: z-scores recorded, served when a request sets none
        normalisation = "zscore"
        record_fusion(root / "index" / "manifest.json", LAM, normalisation)
    return {"model": model, "manifest": root / "index" / "manifest.json", "ids": ids, "texts": texts,
            "queries": [q.text for q in catalog.queries[:5]], "normalisation": normalisation,
            "lexical_tokenizer": model.tokenizer if own is None else own}


@pytest.fixture(scope="module")
def lexical_index(catalog, tokenizer, tmp_path_factory) -> dict:
    return _build(catalog, tokenizer, tmp_path_factory.mktemp("served_lexical"))


@pytest.fixture(scope="module")
def own_lexical_index(catalog, tokenizer, tmp_path_factory) -> dict:
    """The same with `lexical_tokenizer`: BM25 over a WordPiece of 250 pieces (the model's has more), and the
    fusion's normalisation recorded in the manifest as z-scores (the tune stage's `record_fusion`)."""
    idx = _build(catalog, tokenizer, tmp_path_factory.mktemp("served_own_lexical"), own_tokenizer=True)
    assert len(idx["lexical_tokenizer"]) != len(idx["model"].tokenizer)
    return idx


def reference(idx: dict, queries: list[str], lam: float, k: int = K):
    """Unsharded, in process: exact dense top-100 over all documents + BM25 over the lower-cased raw texts'
    pieces of the index's lexical tokenizer, fused."""
    from madr.index.encode import encode_documents, encode_queries
    from madr.search.exact import ExactSearcher
    from madr.search.score_fusion import weighted_fusion
    from madr.search.sparse import BM25Index

    tok = idx["lexical_tokenizer"]
    dense = ExactSearcher(encode_documents(idx["model"], idx["texts"])[0], idx["ids"]).search(
        encode_queries(idx["model"], queries)[0], k=N_CAND)
    bm25 = BM25Index().fit([tok.tokenize(t.lower()) for t in idx["texts"]], idx["ids"]).search(
        [tok.tokenize(q.lower()) for q in queries], k=N_CAND)
    return weighted_fusion([dense, bm25], [lam, 1 - lam], k, normalisation=idx["normalisation"])


def _check(base: str, idx: dict, headers: dict | None = None) -> None:
    queries = idx["queries"]
    ref_s, ref_i = reference(idx, queries, LAM)
    for qi, q in enumerate(queries):
        r = requests.post(base + "/search", json={"query": q, "k": K}, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        hits = r.json()["results"]
        assert_same_ranking([h["score"] for h in hits], [h["id"] for h in hits], ref_s[qi], ref_i[qi], q)
    ref_s, ref_i = reference(idx, queries[:1], 0.0)
    r = requests.post(base + "/search", json={"query": queries[0], "k": K, "lam": 0.0}, headers=headers, timeout=30)
    hits = r.json()["results"]
    assert_same_ranking([h["score"] for h in hits], [h["id"] for h in hits], ref_s[0], ref_i[0], "lam=0")
    assert requests.get(base + "/healthz", headers=headers, timeout=10).json()["search_mode"] == "dense+bm25"
    ready = requests.get(base + "/ready", headers=headers, timeout=30).json()
    assert ready["search_mode"] == "dense+bm25" and ready["ntotal"] == len(idx["ids"])


@pytest.mark.parametrize("which", ["lexical_index", "own_lexical_index"])
def test_offline_sharded_index_equals_the_reference(which, request):
    from madr.index.encode import encode_queries
    from madr.search.sharded import ShardedIndex

    lexical_index = request.getfixturevalue(which)
    index = ShardedIndex.open(lexical_index["manifest"])
    q = lexical_index["queries"]
    got = index.search(encode_queries(lexical_index["model"], q)[0], k=K,
                       lexical=index.query_terms(lexical_index["model"].tokenizer, q))
    ref = reference(lexical_index, q, LAM)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-5)
    if which == "own_lexical_index":  # the model's pieces would fuse otherwise: the index's tokenizer is used
        model_pieces = dict(lexical_index, lexical_tokenizer=lexical_index["model"].tokenizer)
        assert not np.allclose(got[0], reference(model_pieces, q, LAM)[0], rtol=1e-5, atol=1e-5)
        # and the recorded z-scores, not the min-max default, are what it fused with
        assert not np.allclose(got[0], reference(dict(lexical_index, normalisation="minmax"), q, LAM)[0],
                               rtol=1e-5, atol=1e-5)
    # the evaluation / mining jobs' searcher fuses the same way
    from pipelines.evaluate.searcher import SearchSpec, search_texts

    spec = SearchSpec(index=str(lexical_index["manifest"]))
    got = search_texts(lexical_index["model"], index, q, K, spec)
    np.testing.assert_array_equal(got[1], ref[1])


@pytest.mark.parametrize("which", ["lexical_index", "own_lexical_index"])
def test_plain_app_serves_the_fused_results(which, request):
    lexical_index = request.getfixturevalue(which)
    settings = ServeSettings(manifest_path=str(lexical_index["manifest"]), api_key_env="MADR_TEST_UNSET_KEY",
                             port=free_port(), doc_text_field="title")
    with running_plain_app(settings) as url:
        _check(url, lexical_index)


@pytest.mark.ray
@pytest.mark.parametrize("which", ["lexical_index", "own_lexical_index"])
def test_ray_serve_app_serves_the_fused_results(ray_local, which, request):
    from ray import serve

    from serve.app import run_local, url
    from serve.client import MadrClient

    lexical_index = request.getfixturevalue(which)
    small = {"num_cpus": 0.2, "max_ongoing_requests": 16}
    settings = ServeSettings(manifest_path=str(lexical_index["manifest"]), port=free_port(), shard_groups=2,
                             doc_text_field="title", request_timeout_s=30, api_key_env="MADR_TEST_UNSET_KEY",
                             encoder=DeploymentSettings(**small), searcher=DeploymentSettings(**small),
                             ingress=DeploymentSettings(**small))
    run_local(settings, name="madr_lexical")
    try:
        client = MadrClient(url(settings))
        client.wait_ready(timeout=90)
        client.close()
        _check(url(settings), lexical_index)
        # the access log's latency line: the BM25 candidates and their fusion (`serve.latency`)
        lines = latency_lines("madr_lexical", "Colocated", 1)
        assert lines and all({"dense", "bm25", "fusion", "total"} <= set(st) for s, st in lines if s == 200), lines
    finally:
        serve.shutdown()


def test_plain_app_explains_the_bm25_part(lexical_index):
    """`/explain` on an index with a BM25 part adds the pair's BM25 score and the word pieces both share
    (`serve.backend.LexicalExplainer`), beside the model's own explanation (a BiBERT: its cosine score)."""
    from madr.search.sparse import BM25Index

    settings = ServeSettings(manifest_path=str(lexical_index["manifest"]), api_key_env="MADR_TEST_UNSET_KEY",
                             port=free_port(), doc_text_field="title")
    tok = lexical_index["lexical_tokenizer"]
    bm25 = BM25Index().fit([tok.tokenize(t.lower()) for t in lexical_index["texts"]], lexical_index["ids"])
    query = lexical_index["queries"][0]
    scores, ids = bm25.search([tok.tokenize(query.lower())], k=1)  # its best BM25 document: some pieces shared
    doc_id = int(ids[0, 0])
    text = lexical_index["texts"][int(np.flatnonzero(lexical_index["ids"] == doc_id)[0])]
    with running_plain_app(settings) as url:
        out = requests.post(url + "/explain", json={"query": query, "doc_text": text}, timeout=30).json()
        assert out["model"] == "bibert" and isinstance(out["score"], float)
        assert out["bm25"]["score"] == pytest.approx(float(scores[0, 0]), rel=1e-5)
        terms = out["bm25"]["matched_terms"]
        assert terms and all(t["term"] in tok.tokenize(query.lower()) for t in terms), terms
        by_id = requests.post(url + "/explain", json={"query": query, "doc_id": doc_id}, timeout=30).json()
        assert by_id["doc_id"] == doc_id and set(by_id["bm25"]) == {"score", "matched_terms"}  # over its title
