"""`weighted_fusion` and `reciprocal_rank_fusion` against ranx's `fuse` on random top lists (ranx interpreted:
tests/ranx_oracle.py), and by hand."""

from __future__ import annotations

import numpy as np
import pytest

from madr.search.protocol import PAD_ID
from madr.search.score_fusion import hybrid_merge, reciprocal_rank_fusion, weighted_fusion
from tests.ranx_oracle import interpreted_ranx


def _lists(seed: int, n_lists: int = 3, queries: int = 6, k: int = 8, docs: int = 20):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_lists):
        ids = np.stack([rng.choice(docs, k, replace=False) for _ in range(queries)]).astype(np.int64)
        scores = np.sort(rng.normal(size=(queries, k)), axis=1)[:, ::-1].astype(np.float32)
        ids[0, -2:] = PAD_ID  # a short list
        scores[0, -2:] = -np.inf
        out.append((scores, ids))
    return out


def _as_dict(pair) -> dict[str, dict[str, float]]:
    scores, ids = pair
    return {f"q{q}": {f"d{d}": float(s) for s, d in zip(scores[q], ids[q], strict=True) if d != PAD_ID}
            for q in range(scores.shape[0])}


def _ranx_fuse(lists, **kw) -> dict[str, dict[str, float]]:
    with interpreted_ranx() as ranx:
        return ranx.fuse([ranx.Run(_as_dict(p)) for p in lists], **kw).to_dict()


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_fusion_equals_ranx_wsum_of_minmax(seed):
    lists, weights = _lists(seed), [0.5, 0.3, 0.2]
    ours = _as_dict(weighted_fusion(lists, weights, k=100, normalisation="minmax"))
    theirs = _ranx_fuse(lists, norm="min-max", method="wsum", params={"weights": weights})
    assert theirs.keys() == ours.keys()
    for q, docs in theirs.items():
        assert set(ours[q]) == set(docs)
        for d, s in docs.items():
            assert ours[q][d] == pytest.approx(s, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_rrf_equals_ranx(seed):
    lists = _lists(seed)
    ours = _as_dict(reciprocal_rank_fusion(lists, k=100, rrf_k=60))
    theirs = _ranx_fuse(lists, norm=None, method="rrf", params={"k": 60})
    assert theirs.keys() == ours.keys()
    for q, docs in theirs.items():
        assert set(ours[q]) == set(docs)
        for d, s in docs.items():
            assert ours[q][d] == pytest.approx(s, abs=1e-6)


def test_two_lists_equal_hybrid_merge():
    dense, sparse = _lists(3, n_lists=2)
    a = weighted_fusion([dense, sparse], [0.7, 0.3], k=5, normalisation="minmax")
    b = hybrid_merge(dense, sparse, lam=0.7, k=5, normalisation="minmax")
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(a[0], b[0], atol=1e-6)


def test_by_hand_missing_candidate_and_ties():
    a = (np.array([[3.0, 1.0]], np.float32), np.array([[7, 2]]))
    b = (np.array([[5.0, 4.0, 1.0]], np.float32), np.array([[2, 9, 7]]))
    scores, ids = weighted_fusion([a, b], [0.5, 0.5], k=4)
    # a: 7 -> 1, 2 -> 0, 9 -> 0 (absent: a's minimum); b: 2 -> 1, 9 -> 0.75, 7 -> 0
    assert ids.tolist() == [[2, 7, 9, PAD_ID]]  # 2 and 7 tie at 0.5: id ascending
    np.testing.assert_allclose(scores[0, :3], [0.5, 0.5, 0.375])
    rrf_scores, rrf_ids = reciprocal_rank_fusion([a, b], k=3, rrf_k=1)
    assert rrf_ids.tolist() == [[2, 7, 9]]  # 2: 1/3 + 1/2; 7: 1/2 + 1/4; 9: 1/3
    np.testing.assert_allclose(rrf_scores[0], [1 / 3 + 1 / 2, 1 / 2 + 1 / 4, 1 / 3])


def test_rejects_mismatched_weights():
    with pytest.raises(ValueError, match="2 lists but 1 weights"):
        weighted_fusion(_lists(0, n_lists=2), [1.0], k=3)


def test_errors_name_the_function_and_the_list():
    a, b = _lists(0, n_lists=2)
    with pytest.raises(ValueError, match="reciprocal_rank_fusion: the lists have different query counts"):
        reciprocal_rank_fusion([a, (b[0][:2], b[1][:2])], k=3)
    repeated = (np.array([[1.0, 0.5]], np.float32), np.array([[7, 7]]))
    with pytest.raises(ValueError, match="weighted_fusion: list 1 list of query 0 repeats a document id"):
        weighted_fusion([(a[0][:1], a[1][:1]), repeated], [0.5, 0.5], k=3)
    with pytest.raises(ValueError, match="hybrid_merge: sparse list of query 0 repeats a document id"):
        hybrid_merge((a[0][:1], a[1][:1]), repeated, lam=0.5, k=3)
