"""The product-search fusion benchmark's list helpers: the weight grid, fusion of top lists and of judged
scores, dev tuning picking the better weights, and the .npz cache (kept while the key matches)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.quality.aspect_models.evaluation import (
    EvalSet,
    Lists,
    cached_lists,
    fuse,
    rrf,
    tune_weights,
    weight_grid,
)
from madr.config import ExperimentConfig


def _ev() -> EvalSet:
    """2 queries over 4 products; q0 wants p1, q1 wants p2."""
    pids = ["p0", "p1", "p2", "p3"]
    qrels = {"q0": {"p1": 4.0, "p0": 0.0}, "q1": {"p2": 4.0, "p3": 0.0}}
    return EvalSet(pids, ["a", "b", "c", "d"], [{}] * 4, ["q0", "q1"], ["x", "y"], [{}] * 2, qrels,
                   [np.array([1, 0]), np.array([2, 3])])


def _lists(order: list[list[int]], judged: list[list[float]]) -> Lists:
    ids = np.array(order, dtype=np.int64)
    scores = np.tile(np.arange(ids.shape[1], 0, -1, dtype=np.float32), (ids.shape[0], 1))
    return Lists(scores, ids, np.array(judged, dtype=np.float64))


def _cfg() -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.eval.retrieval_metrics, cfg.eval.rerank_metrics = ["recall@1", "mrr@10"], ["ndcg@10"]
    cfg.eval.relevance_threshold = 3.0
    return cfg


def test_weight_grid_covers_the_simplex():
    grid = weight_grid(3, 0.1)
    assert len(grid) == 66 and len(set(grid)) == 66
    assert all(abs(sum(w) - 1) < 1e-9 and min(w) >= 0 for w in grid)
    assert weight_grid(2, 0.5) == [(0.0, 1.0), (0.5, 0.5), (1.0, 0.0)]


def test_tuning_picks_the_list_that_ranks_the_relevant_first():
    good = _lists([[1, 0, 2], [2, 3, 0]], [[2.0, 1.0], [2.0, 1.0]])  # relevant first for both queries
    bad = _lists([[0, 1, 3], [3, 2, 1]], [[1.0, 2.0], [1.0, 2.0]])
    (norm, weights), seen = tune_weights([bad, good], _ev(), _cfg(), "recall@1", 0.5, 3)
    assert (norm, weights) == ("minmax", (0.0, 1.0))
    assert seen[("minmax", (0.0, 1.0))] == 1.0 and seen[("minmax", (1.0, 0.0))] == 0.0
    fused = fuse([bad, good], weights, 3)
    np.testing.assert_array_equal(fused.ids[:, 0], [1, 2])
    np.testing.assert_allclose(fused.judged, [[1.0, 0.0], [1.0, 0.0]])  # min-max over the judged
    (norm, weights), seen = tune_weights([bad, good], _ev(), _cfg(), "recall@1", 0.5, 3, ["zscore", "minmax"])
    assert (norm, weights) == ("zscore", (0.0, 1.0)), "ties go to the first normalisation"
    assert set(seen) == {(n, w) for n in ("zscore", "minmax") for w in weight_grid(2, 0.5)}
    z = fuse([bad, good], weights, 3, "zscore")
    np.testing.assert_allclose(z.judged, [[1.0, -1.0], [1.0, -1.0]])  # z-scores over the judged
    both = rrf([bad, good], 3, rrf_k=60)
    assert both.ids.shape == (2, 3) and np.isfinite(both.judged).all()


def test_cache_is_kept_while_the_key_matches(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"test": _lists([[1, 0]], [[2.0, np.nan]])}

    first, spent = cached_lists(tmp_path / "x.npz", "k1", compute)
    again, kept = cached_lists(tmp_path / "x.npz", "k1", compute)
    assert len(calls) == 1 and kept == 0.0 and spent >= 0
    np.testing.assert_array_equal(again["test"].ids, first["test"].ids)
    np.testing.assert_array_equal(again["test"].judged, first["test"].judged)  # NaN padding kept
    cached_lists(tmp_path / "x.npz", "k2", compute)
    assert len(calls) == 2


def test_fusion_weights_must_match_the_lists():
    with pytest.raises(ValueError, match="2 lists but 1 weights"):
        fuse([_lists([[0]], [[1.0]]), _lists([[0]], [[1.0]])], [1.0], 1)
