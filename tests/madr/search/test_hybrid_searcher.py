"""HybridSearcher (paper 002 Eq. 1 over FAISS + inverted-index candidates) against brute force through
`BiEncoder.hybrid_scores` over the whole corpus, with a tiny hybrid BERT and a few hundred evidences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.data.synthetic.pqa import generate_pqa
from madr.modeling.model import build_model
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.search.hybrid import HybridSearcher, encode_corpus
from madr.search.score_fusion import normalise

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    recs = generate_pqa(num_products=60, num_questions=80, seed=1)
    docs = sorted({r.evidence for r in recs})[:300]
    queries = sorted({r.question for r in recs})[:12]
    tok = train_wordpiece_tokenizer(docs + queries, vocab_size=600, out_dir=str(tmp_path_factory.mktemp("tok")))
    torch.manual_seed(0)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=24, max_query_length=24,
                      max_doc_length=40, hybrid_lambda=0.3)
    model = build_model(cfg, tok).eval()
    ids = np.arange(len(docs), dtype=np.int64) * 7 + 3  # global ids are not row numbers
    searcher = HybridSearcher.build(encode_corpus(model, docs, ids, batch_size=64), model)
    with torch.no_grad():
        q_enc, d_enc = model.tokenize(queries, "query"), model.tokenize(docs, "doc")
        q = model.encode(q_enc["input_ids"], q_enc["attention_mask"], "query")
        d = model.encode(d_enc["input_ids"], d_enc["attention_mask"], "doc")
        dense = model.hybrid_scores(q, d, 1.0).double().numpy()
        sparse = model.hybrid_scores(q, d, 0.0).double().numpy()
    return {"model": model, "docs": docs, "queries": queries, "ids": ids, "searcher": searcher,
            "dense": dense, "sparse": sparse}


def _assert_topk(scores, ids, reference, doc_ids, k, what, eligible=None):
    """Returned lists equal the brute-force top-k of `reference` [Q, N] (ties by id); ids are compared where
    the reference scores are not within 1e-4 of a neighbour."""
    for qi in range(reference.shape[0]):
        ref, cand = reference[qi], doc_ids
        if eligible is not None:
            ref, cand = ref[eligible[qi]], cand[eligible[qi]]
        order = np.lexsort((cand, -ref))[:k]
        exp_s, exp_i = ref[order], cand[order]
        n = exp_s.size
        assert np.all(ids[qi, n:] == -1), f"{what}, query {qi}: padding expected after {n} results"
        np.testing.assert_allclose(scores[qi, :n], exp_s, rtol=1e-4, atol=1e-4, err_msg=f"{what}, query {qi}")
        gaps = np.abs(np.diff(np.sort(ref)[::-1]))
        if gaps.size and gaps[: n + 1].min() > 1e-4:
            assert np.array_equal(ids[qi, :n], exp_i), f"{what}, query {qi}: {ids[qi, :n]} != {exp_i}"


def test_dense_mode_is_brute_force_dense(setup):
    s = setup["searcher"]
    scores, ids = s.search(setup["queries"], k=10, mode="dense", candidates=50)
    _assert_topk(scores, ids, setup["dense"], setup["ids"], 10, "lambda=1")
    hy_scores, hy_ids = s.search(setup["queries"], k=10, lam=1.0, candidates=50)
    np.testing.assert_allclose(hy_scores, scores, rtol=1e-6, err_msg="hybrid lam=1 == dense mode")


def test_sparse_mode_is_brute_force_sparse(setup):
    s = setup["searcher"]
    scores, ids = s.search(setup["queries"], k=10, mode="sparse", candidates=50)
    positive = setup["sparse"] > 0  # the inverted index returns documents sharing a term
    assert positive.sum(1).min() >= 10, "the fixture should give every query 10 sparse matches"
    _assert_topk(scores, ids, setup["sparse"], setup["ids"], 10, "lambda=0", eligible=positive)


@pytest.mark.parametrize("normalisation", ["none", "minmax"])
def test_hybrid_with_all_candidates_is_brute_force(setup, normalisation):
    s = setup["searcher"]
    scores, ids = s.search(setup["queries"], k=15, normalisation=normalisation, candidates=len(setup["docs"]))
    ref = 0.3 * normalise(setup["dense"], normalisation) + 0.7 * normalise(setup["sparse"], normalisation)
    _assert_topk(scores, ids, ref, setup["ids"], 15, f"hybrid lambda=0.3 (model config), {normalisation}")


def test_few_candidates_are_rescored_exactly(setup):
    s = setup["searcher"]
    scores, ids = s.search(setup["queries"], k=8, lam=0.6, candidates=5)
    col = {int(d): i for i, d in enumerate(setup["ids"])}
    for qi in range(len(setup["queries"])):
        live = ids[qi] >= 0
        assert live.sum() >= 5, "the union of two top-5 lists holds at least 5 documents"
        cols = [col[int(d)] for d in ids[qi, live]]
        exact = 0.6 * setup["dense"][qi, cols] + 0.4 * setup["sparse"][qi, cols]
        np.testing.assert_allclose(scores[qi, live], exact, rtol=1e-4, atol=1e-4,
                                   err_msg="both parts are exact for candidates found by only one retriever")


def test_save_load_and_reconstruct(setup, tmp_path):
    s = setup["searcher"]
    expected = s.search(setup["queries"], k=10, candidates=40)
    loaded = HybridSearcher.load(s.save(tmp_path / "idx"), setup["model"])
    assert loaded.hybrid_lambda == pytest.approx(0.3) and loaded.index_factory == "Flat"
    for got, want in zip(loaded.search(setup["queries"], k=10, candidates=40), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    corpus = encode_corpus(setup["model"], setup["docs"], setup["ids"])
    no_copy = HybridSearcher.build(corpus, setup["model"], keep_vectors=False)
    assert no_copy.vectors is None
    for got, want in zip(no_copy.search(setup["queries"], k=10, candidates=40), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg="index.reconstruct re-scores like stored vectors")
    ivf = HybridSearcher.build(corpus, setup["model"], index_factory="IVF4,Flat", keep_vectors=False)
    sc, ix = ivf.search(setup["queries"][:3], k=5, candidates=20)
    col = {int(d): i for i, d in enumerate(setup["ids"])}
    exact = [0.3 * setup["dense"][0, col[int(d)]] + 0.7 * setup["sparse"][0, col[int(d)]] for d in ix[0]]
    np.testing.assert_allclose(sc[0], exact, rtol=1e-4, atol=1e-4, err_msg="IVF candidates, exact re-scoring")


def test_bad_inputs(setup, tmp_path):
    s = setup["searcher"]
    with pytest.raises(ValueError, match="mode"):
        s.search(setup["queries"], k=3, mode="bm25")
    with pytest.raises(ValueError, match="lam is fixed"):
        s.search(setup["queries"], k=3, lam=0.5, mode="dense")
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\]"):
        s.search(setup["queries"], k=3, lam=1.5)
    with pytest.raises(ValueError, match="list of strings"):
        s.search("red shoes", k=3)
    with pytest.raises(ValueError, match="factory"):
        HybridSearcher.build(encode_corpus(setup["model"], setup["docs"][:5]), index_factory="NoSuchIndex")
    with pytest.raises(ValueError, match="unique"):
        encode_corpus(setup["model"], setup["docs"][:3], [1, 1, 2])
    with pytest.raises(ValueError, match="not a HybridSearcher directory"):
        HybridSearcher.load(tmp_path)
    bibert = build_model(ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), max_doc_length=40),
                         setup["model"].tokenizer)
    with pytest.raises(ValueError, match="hybrid model"):
        encode_corpus(bibert, setup["docs"][:3])
