"""LeanQueryEncoder (what Serve encodes queries with) against the reference query encoding
`madr.index.encode.encode_queries`.

Tiny random-init BERTs over the session tokenizer (no download). The reference is the hybrid head of paper 002
(log1p(ReLU(mlm_logits)) pooled over tokens, special tokens zeroed, top-k); the lean encoder must give the same
dense vectors (1e-6) and the same sparse top-k term ids and weights (1e-5), without switching the model's mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.index import build_index
from madr.index.encode import encode_documents, encode_queries
from madr.modeling.model import BiEncoder, build_model
from madr.search.hybrid import EncodedTexts, HybridSearcher, encode_corpus
from madr.search.query_encoder import LeanQueryEncoder
from madr.search.sharded import ShardedIndex, sparse_term_ids
from madr.search.sparse import InvertedIndex, SparseBatch

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def hybrid_model(tokenizer, pooling: str = "max", top_k: int | None = 16, seed: int = 0) -> BiEncoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=top_k, sparse_pooling=pooling,
                      max_query_length=24, max_doc_length=48)
    return build_model(cfg, tokenizer).eval()


@pytest.fixture(scope="module")
def queries(catalog) -> list[str]:
    """Queries of varied lengths (padding inside a batch), one duplicate, one very short."""
    qs = [q.text for q in catalog.queries[:30]]
    return qs + [qs[0], "oak"]


@pytest.fixture(scope="module")
def doc_texts(catalog) -> list[str]:
    return [catalog.product_text(p) for p in catalog.products[:60]]


def full_weights(model: BiEncoder, texts: list[str]) -> np.ndarray:
    """The reference's pooled weights before the top-k cut, [N, V] (the head's k lifted for one call)."""
    head = model.query_tower.head
    k, head.top_k = head.top_k, None
    try:
        return encode_queries(model, texts)[1].to_dense()
    finally:
        head.top_k = k


def assert_same_sparse(got: SparseBatch, want: SparseBatch, what: str) -> None:
    assert got.vocab_size == want.vocab_size, f"{what}: vocab_size {got.vocab_size} != {want.vocab_size}"
    assert np.array_equal(got.indptr, want.indptr), f"{what}: terms per query differ"
    assert np.array_equal(got.indices, want.indices), f"{what}: top-k term ids differ"
    np.testing.assert_allclose(got.values, want.values, rtol=1e-5, atol=1e-5, err_msg=f"{what}: weights differ")


@pytest.mark.parametrize("pooling", ["max", "sum"])
@pytest.mark.parametrize("top_k", [16, None])
@pytest.mark.parametrize("batch_size", [64, 5])
def test_lean_equals_reference_encoding(tokenizer, queries, pooling, top_k, batch_size):
    model = hybrid_model(tokenizer, pooling, top_k)
    want_dense, want_sparse = encode_queries(model, queries, batch_size=batch_size)
    got_dense, got_sparse = LeanQueryEncoder(model, batch_size=batch_size).encode(queries)
    np.testing.assert_allclose(got_dense, want_dense, rtol=1e-6, atol=1e-6, err_msg="dense vectors differ")
    assert_same_sparse(got_sparse, want_sparse, f"{pooling} pooling, k={top_k}")
    if top_k is not None:
        assert np.diff(got_sparse.indptr).max() == top_k, "the top-k cut did not bind: a weak test"


def test_one_query_at_a_time_equals_the_batch(tokenizer, queries):
    """What a served request does (one text per call) gives the batched rows."""
    model = hybrid_model(tokenizer)
    enc = LeanQueryEncoder(model)
    dense, sparse = enc.encode(queries)
    for i in (0, 7, len(queries) - 1):
        d, s = enc.encode([queries[i]])
        np.testing.assert_allclose(d[0], dense[i], rtol=1e-5, atol=1e-6, err_msg=f"query {i}: dense")
        assert np.array_equal(s.indices, sparse.row(i)[0]), f"query {i}: term ids"
        np.testing.assert_allclose(s.values, sparse.row(i)[1], rtol=1e-5, atol=1e-5, err_msg=f"query {i}: weights")


@pytest.mark.parametrize("pooling", ["max", "sum"])
def test_index_vocabulary_projection(tokenizer, queries, doc_texts, pooling):
    """Projected onto the index's terms: every weight is the reference's pre-cut weight of that term, the kept
    terms are the top-k of the reference's weights over the index's terms, and when the index holds every term
    of the reference's top-k, the output is the reference's."""
    model = hybrid_model(tokenizer, pooling)
    index = InvertedIndex.build(encode_documents(model, doc_texts)[1])
    terms = index.term_ids()
    assert 0 < terms.size < len(tokenizer), "the index vocabulary should be a strict subset of the vocabulary"
    want_dense, want_sparse = encode_queries(model, queries)
    enc = LeanQueryEncoder(model, terms)
    assert enc.num_terms == np.setdiff1d(terms, tokenizer.all_special_ids).size
    got_dense, got_sparse = enc.encode(queries)
    np.testing.assert_allclose(got_dense, want_dense, rtol=1e-6, atol=1e-6, err_msg="dense vectors differ")
    assert np.isin(got_sparse.indices, terms).all(), "a projected query holds a term the index does not have"

    full = full_weights(model, queries)
    k = model.query_tower.head.top_k
    for i in range(len(queries)):
        ids, w = got_sparse.row(i)
        np.testing.assert_allclose(w, full[i, ids], rtol=1e-5, atol=1e-5, err_msg=f"query {i}: weights")
        restricted = np.zeros_like(full[i])
        restricted[terms] = full[i, terms]
        expect = np.sort(np.argsort(-restricted, kind="stable")[:k])
        expect = expect[restricted[expect] > 0]
        assert np.array_equal(ids, expect), f"query {i}: not the top-{k} over the index's terms"
        ref_ids, _ = want_sparse.row(i)
        assert np.isin(ref_ids[np.isin(ref_ids, terms)], ids).all(), f"query {i}: lost a reference index term"

    assert any(not np.array_equal(got_sparse.row(i)[0], want_sparse.row(i)[0]) for i in range(len(queries))), \
        "no reference top-k held a term outside the index: the cut over the index's terms went untested"
    # An index vocabulary holding every reference top-k term: identical to the reference.
    covering = np.union1d(terms, want_sparse.indices)
    assert_same_sparse(LeanQueryEncoder(model, covering).encode(queries)[1], want_sparse, "covering vocabulary")


def test_projection_without_a_cut_equals_the_reference_restricted_to_the_index(tokenizer, queries, doc_texts):
    model = hybrid_model(tokenizer, top_k=None)
    terms = InvertedIndex.build(encode_documents(model, doc_texts)[1]).term_ids()
    want = encode_queries(model, queries)[1].to_dense()
    restricted = np.zeros_like(want)
    restricted[:, terms] = want[:, terms]
    got = LeanQueryEncoder(model, terms).encode(queries)[1]
    assert_same_sparse(got, SparseBatch.from_dense(restricted), "k=None, restricted to the index")


def test_no_mode_switch_per_call_and_inference_mode(tokenizer, queries):
    """Eval mode is set once at construction; encoding switches no module's mode and runs in inference mode."""
    model = hybrid_model(tokenizer)
    switches, grad_modes = [], []
    def counting(module: torch.nn.Module):
        original = module.train

        def train(mode: bool = True) -> torch.nn.Module:
            switches.append((type(module).__name__, mode))
            return original(mode)

        return train

    for module in model.modules():  # count every train()/eval() on any submodule (eval() calls train(False))
        module.train = counting(module)
    model.query_tower.backbone.register_forward_hook(
        lambda *_: grad_modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled())))

    encode_queries(model, queries[:3])
    assert switches, "the counting hook sees the reference's eval()/train() toggles"
    switches.clear()
    grad_modes.clear()
    enc = LeanQueryEncoder(model)
    switches.clear()
    for _ in range(3):
        enc.encode(queries[:4])
        enc.encode([queries[5]])
    assert switches == [], f"the lean encoder switched modes per call: {switches[:4]}"
    assert not any(m.training for m in model.modules()), "a module is in training mode"
    assert grad_modes and all(g == (True, False) for g in grad_modes), f"not under inference_mode: {grad_modes}"


def test_a_model_put_back_in_training_mode_is_refused(tokenizer, queries):
    model = hybrid_model(tokenizer)
    enc = LeanQueryEncoder(model)
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        enc.encode(queries[:2])
    model.eval()
    assert enc.encode(queries[:2])[0].shape == (2, model.embedding_dim)


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_dense_models_equal_the_reference(tokenizer, queries, similarity):
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), similarity=similarity,
                      max_query_length=24, max_doc_length=48)
    model = build_model(cfg, tokenizer).eval()
    want, _ = encode_queries(model, queries)
    got, sparse = LeanQueryEncoder(model).encode(queries)
    assert sparse is None
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{similarity}: dense vectors differ")
    with pytest.raises(ValueError, match="no sparse vectors"):
        LeanQueryEncoder(model, [5, 6])


def test_bad_input(tokenizer):
    model = hybrid_model(tokenizer)
    enc = LeanQueryEncoder(model)
    with pytest.raises(ValueError, match="one string"):
        enc.encode("oak table")
    with pytest.raises(ValueError, match=r"term_ids must lie in"):
        LeanQueryEncoder(model, [len(tokenizer)])
    dense, sparse = enc.encode([])
    assert dense.shape == (0, model.embedding_dim) and len(sparse) == 0 and sparse.vocab_size == len(tokenizer)


def test_index_term_ids_from_memory_files_and_manifest(tokenizer, doc_texts, tmp_path):
    """The index vocabulary: `InvertedIndex.term_ids`, read back from a saved file without the postings, and
    over a sharded index's shards (`sparse_term_ids`), all equal to the terms the documents hold."""
    model = hybrid_model(tokenizer)
    corpus = encode_corpus(model, doc_texts)
    want = np.unique(corpus.sparse.indices).astype(np.int64)
    index = InvertedIndex.build(corpus.sparse, corpus.ids)
    assert np.array_equal(index.term_ids(), want)
    index.save(tmp_path / "one.npz")
    assert np.array_equal(InvertedIndex.saved_term_ids(tmp_path / "one.npz"), want)
    manifest = build_index(corpus.dense, corpus.ids, tmp_path / "index", num_shards=3, index_factory="Flat",
                           sparse=corpus.sparse, hybrid_lambda=0.5)
    assert np.array_equal(sparse_term_ids(manifest), want)
    assert np.array_equal(ShardedIndex.open(manifest).sparse_term_ids(), want)
    dense_only = build_index(corpus.dense, corpus.ids, tmp_path / "dense", num_shards=2, index_factory="Flat")
    assert sparse_term_ids(dense_only) is None


def test_hybrid_searcher_results_unchanged(tokenizer, queries, doc_texts):
    """HybridSearcher encodes an eval-mode model's queries with the lean encoder, a training-mode model's with
    the reference (and leaves it in training mode): the same results either way."""
    model = hybrid_model(tokenizer)
    searcher = HybridSearcher.from_texts(model, doc_texts)
    got = searcher.search(queries, k=10, candidates=60)
    assert searcher._query_encoder is not None, "an eval-mode model should go through the lean encoder"
    enc = encode_queries(model, queries)
    want = searcher.search_encoded(EncodedTexts(*enc), k=10, candidates=60)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert np.array_equal(got[1], want[1])
    model.train()
    again = searcher.search(queries, k=10, candidates=60)
    assert model.training, "HybridSearcher left a training model in eval mode"
    np.testing.assert_allclose(again[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("projected", [False, True])
def test_decoder_copy_follows_in_place_weight_updates(tokenizer, queries, doc_texts, projected):
    """The encoder's transposed decoder copy is rebuilt when the model's weights change in place (an optimizer
    step), so an encoder kept across training (HybridSearcher) never serves stale term weights."""
    model = hybrid_model(tokenizer)
    terms = InvertedIndex.build(encode_documents(model, doc_texts)[1]).term_ids() if projected else None
    enc = LeanQueryEncoder(model, terms)
    before = enc.encode(queries)[1]
    with torch.no_grad():
        model.query_tower.word_embeddings.mul_(1.5)
        model.query_tower.mlm_head.bias.add_(0.25)
    after = enc.encode(queries)[1]
    fresh = LeanQueryEncoder(model, terms).encode(queries)[1]
    assert not np.allclose(before.to_dense(), after.to_dense()), "the weight update did not reach the encoder"
    assert_same_sparse(after, fresh, "after an in-place update")
