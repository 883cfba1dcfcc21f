"""`madr.search.fusion_tuning`: the grid search over the dense + BM25 fusion picks the point a brute-force
evaluation of the served fusion ranks best, deterministically."""

from __future__ import annotations

import numpy as np
import pytest

from madr.metrics import evaluate
from madr.search.fusion_tuning import lambda_grid, tune_fusion
from madr.search.params import SearchParams
from madr.search.sharded import fuse_candidates


def _lists(rng: np.random.Generator, queries: int, docs: int, good: np.ndarray, strength: float, scale: float):
    """Per-query candidate lists over `docs` ids where the relevant doc of query q (`good[q]`) gets a boost of
    `strength` (scores times `scale`: BM25-like raw ranges)."""
    scores = rng.normal(size=(queries, docs))
    scores[np.arange(queries), good] += strength
    order = np.argsort(-scores, axis=1)[:, :20]
    return (np.take_along_axis(scores, order, 1) * scale).astype(np.float32), order.astype(np.int64)


def test_tuning_matches_a_brute_force_evaluation_of_the_served_fusion():
    rng = np.random.default_rng(0)
    q, docs = 60, 200
    good = rng.integers(0, docs, size=q)
    qrels = {f"q{i}": {f"d{good[i]}": 1.0} for i in range(q)}
    dense = _lists(rng, q, docs, good, 1.6, 0.3)   # cosines: small range
    bm25 = _lists(rng, q, docs, good, 1.6, 12.0)   # raw BM25: large range
    shards = ([dense], [bm25])  # one shard each

    def to_run(fused):
        scores, ids = fused
        return {f"q{r}": {f"d{d}": float(s) for d, s in zip(ids[r], scores[r], strict=True) if d >= 0}
                for r in range(q)}

    grid = lambda_grid(0.25)
    choice = tune_fusion(*shards, to_run, qrels, "mrr@10", grid, ["minmax", "zscore", "none"], k=10,
                         metrics=["recall@10"])
    brute = {}
    for norm in ["minmax", "zscore", "none"]:
        for lam in grid:
            fused = fuse_candidates(*shards, lam, SearchParams(k=10, lam=lam, normalisation=norm))
            brute[(lam, norm)] = evaluate(to_run(fused), qrels, ["mrr@10"])["mrr@10"]
    best = max(brute.values())
    assert {(p.lam, p.normalisation): p.metrics["mrr@10"] for p in choice.grid} == brute  # each point as served
    assert choice.value == pytest.approx(best)
    assert brute[(choice.lam, choice.normalisation)] == pytest.approx(best)
    assert len(choice.grid) == 15 and all("recall@10" in p.metrics for p in choice.grid)
    # fused beats either half alone here (each half finds a different share of the relevant documents)
    assert best > max(brute[(0.0, "minmax")], brute[(1.0, "minmax")])
    # ties go to the first grid point: a metric every point scores the same picks (lam 0, first normalisation)
    flat = tune_fusion(*shards, lambda fused: {}, {"q0": {"nowhere": 1.0}}, "recall@10", grid, ["zscore", "minmax"],
                       k=10)
    assert (flat.lam, flat.normalisation) == (0.0, "zscore")


def test_grid_and_normalisations_are_checked():
    assert lambda_grid(0.1) == [round(i / 10, 10) for i in range(11)]
    with pytest.raises(ValueError, match="does not divide"):
        lambda_grid(0.3)
    with pytest.raises(ValueError, match="softmax"):
        tune_fusion([], [], dict, {}, "recall@10", [0.5], ["softmax"], k=10)
