"""Hybrid dense + sparse merge (paper 002 Eq. 1) and the source-aware prior (paper 002 Sec. 6.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madr.search.score_fusion import (
    hybrid_merge,
    normalise,
    source_prior_rerank,
    source_priors_from_validation,
)
from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.vectors import SparseBatch

N_DOCS, N_QUERIES, DIM, VOCAB = 300, 6, 16, 100


@pytest.fixture(scope="module")
def retrievers():
    """Dense and sparse top-20 lists over the same docs (global ids 1000 + 3i) and an exact rescore."""
    rng = np.random.default_rng(0)
    ids = 1000 + 3 * np.arange(N_DOCS)
    dense = rng.normal(size=(N_QUERIES, DIM)) @ rng.normal(size=(N_DOCS, DIM)).T
    docs = SparseBatch.from_dense(rng.random((N_DOCS, VOCAB)) * (rng.random((N_DOCS, VOCAB)) < 0.1))
    queries = SparseBatch.from_dense(rng.random((N_QUERIES, VOCAB)) * (rng.random((N_QUERIES, VOCAB)) < 0.1))
    index = InvertedIndex.build(docs, ids)
    sparse_top = index.search(queries, k=20)
    order = np.argsort(-dense, axis=1, kind="stable")[:, :20]
    dense_top = (np.take_along_axis(dense, order, axis=1), ids[order])

    def rescore(q: int, cand: np.ndarray):
        rows = (cand - 1000) // 3
        return dense[q, rows], index.score(queries.select([q]), cand[None])[0]

    return dense_top, sparse_top, rescore


@pytest.mark.parametrize("normalisation", ["none", "minmax", "zscore"])
def test_lambda_one_is_dense_only_and_lambda_zero_is_sparse_only(retrievers, normalisation):
    dense_top, sparse_top, rescore = retrievers
    _, ids = hybrid_merge(dense_top, sparse_top, lam=1.0, k=10, normalisation=normalisation, rescore=rescore)
    np.testing.assert_array_equal(ids, dense_top[1][:, :10], err_msg="lam=1 must reproduce the dense ranking")
    _, ids = hybrid_merge(dense_top, sparse_top, lam=0.0, k=10, normalisation=normalisation, rescore=rescore)
    np.testing.assert_array_equal(ids, sparse_top[1][:, :10], err_msg="lam=0 must reproduce the sparse ranking")


def test_lambda_one_without_normalisation_returns_dense_scores(retrievers):
    dense_top, sparse_top, rescore = retrievers
    scores, _ = hybrid_merge(dense_top, sparse_top, lam=1.0, k=10, rescore=rescore)
    np.testing.assert_allclose(scores, dense_top[0][:, :10], rtol=1e-6)


def test_rescore_path_interpolates_exact_scores(retrievers):
    dense_top, sparse_top, rescore = retrievers
    scores, ids = hybrid_merge(dense_top, sparse_top, lam=0.3, k=5, rescore=rescore)
    d, s = rescore(2, ids[2])
    np.testing.assert_allclose(scores[2], 0.3 * d + 0.7 * s, rtol=1e-5, err_msg="final = lam*d + (1-lam)*s")


def _hand_lists():
    dense = (np.array([[0.9, 0.5, 0.1]]), np.array([[1, 2, 3]]))
    sparse = (np.array([[10.0, 6.0, -np.inf]]), np.array([[3, 4, -1]]))
    return dense, sparse


def test_missing_scores_get_the_list_minimum():
    dense, sparse = _hand_lists()
    # candidates 1..4; dense fills 4 with 0.1, sparse fills 1, 2 with 6 (padding -1 ignored)
    scores, ids = hybrid_merge(dense, sparse, lam=0.5, k=5)
    assert ids.tolist() == [[3, 1, 2, 4, -1]], f"by hand: 5.05, 3.45, 3.25, 3.05; got {ids}"
    np.testing.assert_allclose(scores[0, :4], [5.05, 3.45, 3.25, 3.05], rtol=1e-6)
    assert np.isneginf(scores[0, 4]), "fewer candidates than k: padded with -inf"


def test_minmax_merge_by_hand_with_tie_broken_by_id():
    dense, sparse = _hand_lists()
    # dense [0.9, 0.5, 0.1, 0.1] -> [1, 0.5, 0, 0]; sparse [6, 6, 10, 6] -> [0, 0, 1, 0]
    scores, ids = hybrid_merge(dense, sparse, lam=0.5, k=4, normalisation="minmax")
    assert ids.tolist() == [[1, 3, 2, 4]], f"1 and 3 tie at 0.5: lower id first; got {ids}"
    np.testing.assert_allclose(scores[0], [0.5, 0.5, 0.25, 0.0])


def test_normalise_by_hand():
    np.testing.assert_allclose(normalise(np.array([2.0, 4.0, 6.0]), "minmax"), [0.0, 0.5, 1.0])
    z = 2.0 / math.sqrt(8.0 / 3.0)  # population std of (2, 4, 6) is sqrt(8/3)
    np.testing.assert_allclose(normalise(np.array([[2.0, 4.0, 6.0, -np.inf]]), "zscore"),
                               [[-z, 0.0, z, -np.inf]], err_msg="z-score over finite entries, padding kept")
    np.testing.assert_array_equal(normalise(np.array([[3.0, 3.0], [1.0, 2.0]]), "minmax"), [[0, 0], [0, 1]])
    np.testing.assert_array_equal(normalise(np.array([5.0]), "zscore"), [0.0], err_msg="constant row -> 0")
    with pytest.raises(ValueError, match="method must be one of"):
        normalise(np.zeros(2), "l2")


def test_hybrid_merge_validates_input():
    dense, sparse = _hand_lists()
    with pytest.raises(ValueError, match="lam must be in"):
        hybrid_merge(dense, sparse, lam=1.5, k=2)
    with pytest.raises(ValueError, match="repeats a document id"):
        hybrid_merge((np.array([[1.0, 0.5]]), np.array([[7, 7]])), sparse, lam=0.5, k=2)
    with pytest.raises(ValueError, match="returned shapes"):
        hybrid_merge(dense, sparse, lam=0.5, k=2, rescore=lambda q, c: (np.zeros(1), np.zeros(1)))


def test_source_prior_multiplies_and_reranks_by_hand():
    scores = np.array([[0.8, 0.6, 0.5, -np.inf]])
    sources = [["review", "attribute", "cqa", None]]
    priors = {"review": 0.5, "attribute": 0.9, "cqa": 1.0}
    new, ids = source_prior_rerank(scores, sources, priors, ids=np.array([[11, 12, 13, -1]]))
    assert ids.tolist() == [[12, 13, 11, -1]], f"0.6*0.9=0.54 > 0.5*1.0 > 0.8*0.5=0.4; got {ids}"
    np.testing.assert_allclose(new[0, :3], [0.54, 0.5, 0.4], rtol=1e-6)
    assert np.isneginf(new[0, 3])
    _, cols = source_prior_rerank(scores[:, :3], [sources[0][:3]], priors)
    assert cols.tolist() == [[1, 2, 0]], "without ids the column order is returned"


def test_source_prior_rejects_bad_input():
    with pytest.raises(ValueError, match="no prior for source 'osp'"):
        source_prior_rerank(np.array([[1.0]]), [["osp"]], {"cqa": 1.0})
    assert source_prior_rerank(np.array([[1.0]]), [["osp"]], {}, default_prior=0.2)[0][0, 0] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="non-negative"):
        source_prior_rerank(np.array([[-0.5]]), [["cqa"]], {"cqa": 1.0})


def test_source_priors_from_validation_by_hand():
    doc_source = {"d1": "A", "d2": "A", "d3": "B", "d4": "B", "d5": "C"}
    qrels = {"q1": {"d1": 1, "d3": 1}, "q2": {"d2": 1}, "q3": {"d4": 1, "d5": 0}, "q4": {"d3": 2}}
    run = {"q1": {"d3": 0.9, "d9": 0.8, "d1": 0.7},  # top-2 d3, d9: B hit, A miss
           "q2": {"d7": 0.5, "d2": 0.5, "d6": 0.9},  # top-2 d6, then the tie goes to d2: A hit
           "q3": {"d5": 1.0, "d8": 0.9, "d4": 0.8}}  # top-2 d5, d8: B miss (d5 is not relevant)
    priors = source_priors_from_validation(run, qrels, doc_source, k=2)  # q4 absent from run: B miss
    assert priors == {"A": 0.5, "B": pytest.approx(1 / 3)}, f"A 1/2, B 1/3, C has no relevant doc: {priors}"
    with pytest.raises(ValueError, match="relevant doc 'd1' of query 'q1' has no source"):
        source_priors_from_validation(run, qrels, {}, k=2)
