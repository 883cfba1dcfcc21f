"""A sparse head on any backbone model (`model.sparse_head`) and the lean MLM head
(`BiEncoder.restrict_sparse_terms`): paper 002's sparse vector (Eq. 2, Sec. 4.2 cut) beside MADRAL's own fused,
unit-length vector, scored by Eq. 1, trained by Eq. 3-5 on top of the model's own loss, and served by the lean
query encoder, the ONNX graph and the hybrid searcher with the reference's answers.

Tiny random-init BERTs over the session tokenizer (no download). A tiny backbone ships no MLM head, so the head
starts as the identity transform, as it does on e5.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.index.encode import encode_queries
from madr.modeling.model import BiEncoder, build_model
from madr.modeling.tokenization import corpus_term_ids
from madr.search.hybrid import EncodedTexts, HybridSearcher
from madr.search.query_encoder import LeanQueryEncoder
from madr.training.loop import CatalogSampler, finetune_batches
from madr.training.stage_module import FinetuneBatch, StageModule

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def sparse_madral(catalog, tokenizer, vocabularies, top_k: int | None = 8, seed: int = 0) -> BiEncoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=TINY), aspects=catalog.aspect_names,
                      max_query_length=16, max_doc_length=32, sparse_head=True, sparse_top_k=top_k)
    return build_model(cfg, tokenizer, vocabularies).eval()


def half_catalog_terms(catalog, tokenizer) -> list[int]:
    return corpus_term_ids(tokenizer, [catalog.product_text(p) for p in catalog.products[:200]])


@pytest.fixture(scope="module")
def texts(catalog) -> dict[str, list[str]]:
    return {"query": [q.text for q in catalog.queries[:24]] + ["oak"],
            "doc": [catalog.product_text(p) for p in catalog.products[:80]]}


def test_config_checks():
    assert ModelConfig(name="madral", sparse_head=True).has_sparse
    assert ModelConfig(name="madral", sparse_head=True).unit_dense and not ModelConfig(name="hybrid").unit_dense
    with pytest.raises(ValueError, match="sparse_head needs a backbone"):
        ModelConfig(name="dssm", sparse_head=True)
    with pytest.raises(ValueError, match="sparse_vocab_size"):
        ModelConfig(name="madral", sparse_vocab_size=100)


def test_madral_with_a_sparse_head_scores_by_equation_1(catalog, tokenizer, vocabularies, texts):
    model = sparse_madral(catalog, tokenizer, vocabularies)
    eye = torch.eye(TINY["hidden_size"])
    assert torch.equal(model.query_tower.mlm_head.dense.weight, eye), "no MLM checkpoint: the head starts as identity"
    with torch.no_grad():
        q = model.encode(*model.tokenize(texts["query"], "query").values(), "query")
        d = model.encode(*model.tokenize(texts["doc"], "doc").values(), "doc")
    assert q.aspect_logits, "MADRAL still predicts its aspects"
    nnz = (q.sparse > 0).sum(dim=1)
    assert int(nnz.max()) == 8 and int(nnz.min()) >= 1, "eval mode cuts to the top 8 terms"
    assert float(q.sparse[:, tokenizer.all_special_ids].abs().sum()) == 0.0, "special tokens carry no weight"
    cos = model.similarity(q.embedding, d.embedding)
    torch.testing.assert_close(model.hybrid_scores(q, d, 1.0), cos, msg="lam = 1: MADRAL's own cosine")
    torch.testing.assert_close(model.hybrid_scores(q, d, 0.0), q.sparse @ d.sparse.T)
    torch.testing.assert_close(model.hybrid_scores(q, d, 0.3), 0.3 * cos + 0.7 * (q.sparse @ d.sparse.T))


def test_lean_head_equals_the_full_head_on_its_terms_and_survives_save_load(catalog, tokenizer, vocabularies, texts,
                                                                            tmp_path):
    full = sparse_madral(catalog, tokenizer, vocabularies, top_k=None)
    lean = sparse_madral(catalog, tokenizer, vocabularies, top_k=None)
    terms = half_catalog_terms(catalog, tokenizer)
    kept = lean.restrict_sparse_terms(terms)
    assert kept == len(set(terms) - set(tokenizer.all_special_ids)) < len(tokenizer), "a strict subset: a weak test"
    assert lean.config.sparse_vocab_size == kept
    mask = torch.zeros(len(tokenizer))
    mask[lean.query_tower.sparse_ids] = 1.0
    _, want = encode_queries(full, texts["query"])
    dense, got = encode_queries(lean, texts["query"])
    np.testing.assert_allclose(got.to_dense(), want.to_dense() * mask.numpy(), rtol=1e-5, atol=1e-6)
    assert got.to_dense()[:, mask.numpy() == 0].sum() == 0 and got.nnz > 0
    loaded = BiEncoder.load(lean.save(tmp_path / "model")).eval()
    assert loaded.config.sparse_vocab_size == kept
    torch.testing.assert_close(loaded.query_tower.sparse_ids, lean.query_tower.sparse_ids)
    dense2, again = encode_queries(loaded, texts["query"])
    np.testing.assert_allclose(dense2, dense, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(again.to_dense(), got.to_dense(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="non-empty set of ids"):
        lean.restrict_sparse_terms([len(tokenizer) + 5])


@pytest.mark.parametrize("lean", [False, True])
def test_lean_query_encoder_and_searcher_give_the_reference(catalog, tokenizer, vocabularies, texts, lean):
    """Unit-length MADRAL vectors and the top-k terms as `encode_queries` gives them; the searcher's Eq. 1 top 10
    over the whole collection equals brute force with `BiEncoder.hybrid_scores`."""
    model = sparse_madral(catalog, tokenizer, vocabularies)
    if lean:
        model.restrict_sparse_terms(half_catalog_terms(catalog, tokenizer))
    want_dense, want_sparse = encode_queries(model, texts["query"])
    np.testing.assert_allclose(np.linalg.norm(want_dense, axis=1), 1.0, rtol=1e-5)
    got_dense, got_sparse = LeanQueryEncoder(model).encode(texts["query"])
    np.testing.assert_allclose(got_dense, want_dense, rtol=1e-5, atol=1e-6)
    assert np.array_equal(got_sparse.indices, want_sparse.indices) and np.array_equal(got_sparse.indptr,
                                                                                       want_sparse.indptr)
    np.testing.assert_allclose(got_sparse.values, want_sparse.values, rtol=1e-5, atol=1e-5)

    searcher = HybridSearcher.from_texts(model, texts["doc"])
    scores, ids = searcher.search_encoded(EncodedTexts(want_dense, want_sparse), k=10, candidates=len(texts["doc"]),
                                          lam=0.4)
    with torch.no_grad():
        q = model.encode(*model.tokenize(texts["query"], "query").values(), "query")
        d = model.encode(*model.tokenize(texts["doc"], "doc").values(), "doc")
        brute = model.hybrid_scores(q, d, 0.4)
    top = torch.topk(brute, 10, dim=1)
    np.testing.assert_allclose(scores, top.values.numpy(), rtol=1e-4, atol=1e-5)
    assert (ids == top.indices.numpy()).mean() > 0.97, "ties aside, the searcher's top 10 is brute force's"


def test_training_moves_the_sparse_head_and_lowers_its_loss(catalog, tokenizer, vocabularies):
    """Fine-tuning adds Eq. 3's sparse term and FLOPS to MADRAL's own loss: gradients reach the MLM head, and 30
    steps on one batch lower the sparse term."""
    model = sparse_madral(catalog, tokenizer, vocabularies).train()
    stage = StageConfig(aspect_weight=0.1, pointwise_weight=1.0, flops_query_weight=1e-3, flops_doc_weight=1e-3)
    qb, pb, nb, rel = finetune_batches(model, CatalogSampler(catalog, seed=3).finetune_batch(16))
    module = StageModule("finetune", stage, model, gather=False)
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    first = None
    for step in range(30):
        total, parts = module.loss(FinetuneBatch(qb, pb, nb, rel), step)
        assert {"sce", "sparse_sparse", "sparse_flops_q", "sparse_flops_d"} <= set(parts)
        opt.zero_grad()
        total.backward()
        if step == 0:
            first = parts["sparse_sparse"]
            assert float(model.query_tower.mlm_head.dense.weight.grad.abs().sum()) > 0
        opt.step()
    assert parts["sparse_sparse"] < 0.7 * first, (first, parts["sparse_sparse"])
