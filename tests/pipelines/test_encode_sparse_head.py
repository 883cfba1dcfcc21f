"""A MADRAL with a lean sparse head (`model.sparse_head`) through the system, in process: the
encode job writes dense + sparse shards and the model's lam into the manifest, and the serving backend's answers
(encode the query, search the shards) are brute-force paper 002 Eq. 1 over the corpus with that lam: with the
top-12 cut, the query projected onto the whole lean vocabulary; without a cut, also onto the index's terms only
(with a cut that one may keep other terms: `madr.search.query_encoder`); `/explain` splits the score in two."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.index import Manifest
from madr.modeling.model import BiEncoder, build_model
from madr.modeling.tokenization import corpus_term_ids
from madr.search.params import SearchParams
from pipelines.encode.job import run_encode
from serve.backend import LocalBackend
from tests.pipelines.test_encode import TINY, encode_config, make_corpus, texts_of

N = 300


@pytest.fixture(scope="module", params=[12, None], ids=["top12", "uncut"])
def indexed(request, tmp_path_factory, tokenizer, vocabularies):
    root = tmp_path_factory.mktemp("sparse_head")
    catalog, table = make_corpus(root / "docs", N)
    torch.manual_seed(0)
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=TINY), aspects=catalog.aspect_names,
                      sparse_head=True, sparse_top_k=request.param, max_query_length=16, max_doc_length=48, hybrid_lambda=0.3)
    model = build_model(cfg, tokenizer, vocabularies)
    model.restrict_sparse_terms(corpus_term_ids(tokenizer, texts_of(table)))
    model.save(root / "model")
    run_encode(encode_config(root / "docs", root / "index", str(root / "model"), num_shards=2),
               local=True, log=lambda _: None)
    return {"model": BiEncoder.load(root / "model").eval(), "manifest": root / "index" / "manifest.json",
            "texts": texts_of(table), "ids": table.column("doc_id").to_numpy(),
            "queries": [q.text for q in catalog.queries[:10]]}


def test_served_answers_are_brute_force_equation_1(indexed):
    manifest = Manifest.load(indexed["manifest"])
    assert manifest.hybrid_lambda == 0.3 and manifest.search_mode == "hybrid"
    model, texts = indexed["model"], indexed["texts"]
    with torch.no_grad():
        d = model.encode(*model.tokenize(texts, "doc").values(), "doc")
    for index_vocabulary in [False] if model.config.sparse_top_k else [False, True]:
        backend = LocalBackend(indexed["manifest"], index_vocabulary=index_vocabulary)
        for query in indexed["queries"]:
            encoded = asyncio.run(backend.encode(query))
            scores, ids = asyncio.run(backend.search(encoded, SearchParams(k=10, candidates=N)))
            with torch.no_grad():
                q = model.encode(*model.tokenize([query], "query").values(), "query")
                want = torch.topk(model.hybrid_scores(q, d)[0], 10)
            what = f"{query!r}, index vocabulary {index_vocabulary}"
            np.testing.assert_allclose(scores, want.values.numpy(), rtol=1e-4, atol=1e-5, err_msg=what)
            same = np.mean(ids == indexed["ids"][want.indices.numpy()])
            assert same >= 0.9, f"{what}: the served top 10 is not brute force's ({same:.0%} equal, ties aside)"


def test_explain_splits_the_score(indexed):
    backend = LocalBackend(indexed["manifest"])
    out = asyncio.run(backend.explain(indexed["queries"][0], indexed["texts"][0]))
    lam = indexed["model"].config.hybrid_lambda
    assert out["hybrid_score"] == pytest.approx(lam * out["dense_score"] + (1 - lam) * out["sparse_score"], rel=1e-5)
    assert -1.0 <= out["dense_score"] <= 1.0, "MADRAL's cosine, not a raw dot product"
    assert out["query"]["aspects"], "MADRAL's aspects are explained too"
