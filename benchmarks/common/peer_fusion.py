"""The fusion a search engineer writes by hand for the peers of the speed benchmarks (`speed.recipe_serving`,
`speed.pipeline_vs_peer`): the same rule as `madr.search.score_fusion`, in a few lines of numpy, so the peers do
not import madr's search code."""

from __future__ import annotations

import numpy as np


def normalised(x: np.ndarray, how: str) -> np.ndarray:
    """Min-max or z-score (population std) of one score vector, in float64; all equal: zeros; "none": as is."""
    x = x.astype(np.float64)
    if how == "minmax":
        span = x.max() - x.min()
        return (x - x.min()) / span if span > 0 else np.zeros_like(x)
    if how == "zscore":
        return (x - x.mean()) / x.std() if x.std() > 0 else np.zeros_like(x)
    return x


def fuse(dense: tuple[np.ndarray, np.ndarray], bm25: tuple[np.ndarray, np.ndarray], lam: float, how: str,
         k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (ids, scores) of `lam * dense + (1 - lam) * bm25` over the union, each normalised (a miss: its min)."""
    cand = np.union1d(dense[0], bm25[0])

    def column(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        col = np.full(cand.size, scores.min() if scores.size else 0.0, np.float64)
        col[np.searchsorted(cand, ids)] = scores
        return normalised(col, how)

    final = lam * column(*dense) + (1.0 - lam) * column(*bm25)
    top = np.lexsort((cand, -final))[:k]
    return cand[top], final[top]
