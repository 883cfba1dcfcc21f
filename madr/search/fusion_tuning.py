"""Choosing the dense + BM25 fusion on held-out queries: the weight and the per-query normalisation.

The fused score is ``lam * norm(dense) + (1 - lam) * norm(bm25)`` over the union of both retrievers' candidates
(paper 002 Eq. 1 with BM25 in the sparse role; ``madr.search.score_fusion.weighted_fusion``). Neither ``lam`` nor
the normalisation transfers between models and catalogs: raw BM25 scores run to tens while cosines stay below
one, and min-max or z-scores change how much one strong match counts. So both are chosen on the dev queries by
a grid search over the same candidate lists the index serves (``ShardedIndex`` per-shard candidates, merged and
fused exactly as a search does): each retriever runs once, each grid point costs a fusion only.

Ties on the tuning metric go to the first grid point in order (normalisations as given, ``lam`` rising), so the
choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from madr.metrics import Qrels, Run, evaluate
from madr.search.params import NORMALISATIONS, SearchParams
from madr.search.protocol import TopK
from madr.search.sharded import fuse_candidates


def lambda_grid(step: float) -> list[float]:
    """``0, step, 2 step, ..., 1`` (both ends included), rounded to clean decimals."""
    if not 0.0 < step <= 1.0:
        raise ValueError(f"lambda step must be in (0, 1], got {step}")
    n = int(round(1.0 / step))
    if abs(n * step - 1.0) > 1e-9:
        raise ValueError(f"lambda step {step} does not divide [0, 1] evenly")
    return [round(i * step, 10) for i in range(n + 1)]


@dataclass(frozen=True)
class FusionPoint:
    """One grid point and its dev metrics."""

    lam: float
    normalisation: str
    metrics: dict[str, float]


@dataclass(frozen=True)
class FusionChoice:
    """The chosen point, what it was chosen by, and the whole grid (for the report and its plot)."""

    lam: float
    normalisation: str
    metric: str
    value: float
    grid: list[FusionPoint]

    def to_dict(self) -> dict:
        return asdict(self)


def tune_fusion(dense: Sequence[TopK], bm25: Sequence[TopK], to_run: Callable[[TopK], Run], qrels: Qrels,
                metric: str, lambdas: Sequence[float], normalisations: Sequence[str], k: int,
                candidates: int | None = None, metrics: Sequence[str] = (), relevance_threshold: float = 1.0,
                gains: str = "exp2") -> FusionChoice:
    """The (lam, normalisation) of the grid with the highest mean `metric` over `qrels`' queries.

    `dense` / `bm25`: per-shard candidate lists of the same queries (``Shard.candidates``); `to_run` maps a fused
    [Q, k] result to a ``madr.metrics`` run (index ids to the qrels' document keys). `metrics`: also reported per
    grid point. Fusion as served: ``madr.search.sharded.fuse_candidates``.
    """
    for norm in normalisations:
        if norm not in NORMALISATIONS:
            raise ValueError(f"normalisation {norm!r} is not one of {', '.join(NORMALISATIONS)}")
    if not lambdas or not normalisations:
        raise ValueError("the fusion grid is empty: give at least one lam and one normalisation")
    names = list(dict.fromkeys([metric, *metrics]))
    grid = []
    for norm in normalisations:
        for lam in lambdas:
            params = SearchParams(k=k, candidates=candidates, lam=lam, normalisation=norm)
            fused = fuse_candidates(list(dense), list(bm25), float(lam), params)
            values = evaluate(to_run(fused), qrels, names, relevance_threshold=relevance_threshold, gains=gains)
            grid.append(FusionPoint(float(lam), norm, {n: float(v) for n, v in values.items()}))
    best = max(range(len(grid)), key=lambda i: (grid[i].metrics[metric], -i))
    point = grid[best]
    return FusionChoice(point.lam, point.normalisation, metric, point.metrics[metric], grid)


def as_arrays(points: Sequence[FusionPoint], normalisation: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(lams, metric values) of one normalisation's curve, for the report's plot."""
    pts = [p for p in points if p.normalisation == normalisation]
    return np.array([p.lam for p in pts]), np.array([p.metrics[metric] for p in pts])
