"""Choosing the dense + BM25 fusion on held-out queries: the weight and the per-query normalisation.

The fused score is ``lam * norm(dense) + (1 - lam) * norm(bm25)`` over the union of both retrievers' candidates
(paper 002 Eq. 1 with BM25 in the sparse role; ``madr.search.score_fusion.weighted_fusion``). Neither ``lam`` nor
the normalisation transfers between models and catalogs: raw BM25 scores run to tens while cosines stay below
one, and min-max or z-scores change how much one strong match counts. So both are chosen on the dev queries by
a grid search over the same candidate lists the index serves (``ShardedIndex`` per-shard candidates, merged and
fused exactly as a search does): each retriever runs once, each grid point costs a fusion only.

Ties on the tuning metric go to the first grid point in order (normalisations as given, ``lam`` rising), so the
choice is deterministic.

Indexes with aspect data add a third signal, the aspect-match score (``madr.search.aspect_match``), fused into the
chosen dense + BM25 ranking at ``aspect_weight``; ``tune_aspect_weight`` picks it from a small grid that holds 0,
so "the aspects do not help on dev" is a possible answer (ties go to the smaller weight). A weight > 0 must also
earn its place: the best weight's per-query ``metric`` against weight 0's, a paired randomisation test
(``madr.significance.paired_tests``), must be better with p below ``max_p``; a dev gain of the size of the noise
keeps 0, so the aspects cost no ranking they have not shown they buy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from madr.metrics import Qrels, Run, evaluate, query_means
from madr.search.aspect_match import AspectStore, aspect_rescore
from madr.search.params import NORMALISATIONS, SearchParams
from madr.search.protocol import TopK
from madr.search.score_fusion import fuse_candidates as fuse_weighted
from madr.search.sharded import fusion_inputs


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
    grid point. Fusion as served (``madr.search.sharded.fuse_candidates``), its lists merged and normalised once
    per normalisation (``fusion_inputs``).
    """
    for norm in normalisations:
        if norm not in NORMALISATIONS:
            raise ValueError(f"normalisation {norm!r} is not one of {', '.join(NORMALISATIONS)}")
    if not lambdas or not normalisations:
        raise ValueError("the fusion grid is empty: give at least one lam and one normalisation")
    names = list(dict.fromkeys([metric, *metrics]))
    grid = []
    for norm in normalisations:
        inputs = fusion_inputs(list(dense), list(bm25), SearchParams(k=k, candidates=candidates, normalisation=norm))
        for lam in lambdas:
            fused = fuse_weighted(inputs, [float(lam), 1.0 - float(lam)], k)
            values = evaluate(to_run(fused), qrels, names, relevance_threshold=relevance_threshold, gains=gains)
            grid.append(FusionPoint(float(lam), norm, {n: float(v) for n, v in values.items()}))
    best = max(range(len(grid)), key=lambda i: (grid[i].metrics[metric], -i))
    point = grid[best]
    return FusionChoice(point.lam, point.normalisation, metric, point.metrics[metric], grid)


@dataclass(frozen=True)
class AspectChoice:
    """The chosen aspect weight, what it was chosen by, and every grid point's metrics (weight -> metrics)."""

    aspect_weight: float
    metric: str
    value: float
    grid: dict[float, dict[str, float]]
    best_weight: float = 0.0  # the best mean's weight, before the significance rule
    p_value: float | None = None  # the best weight > 0 against 0, paired per query (None: the best is 0)
    max_p: float = 1.0

    def to_dict(self) -> dict:
        return {"aspect_weight": self.aspect_weight, "metric": self.metric, "value": self.value,
                "best_weight": self.best_weight, "p_value": self.p_value, "max_p": self.max_p,
                "grid": [{"aspect_weight": w, "metrics": m} for w, m in self.grid.items()]}


def check_aspect_weights(weights: Sequence[float], where: str = "aspect weights") -> list[float]:
    """The grid as floats: non-empty, each in [0, 1], 0 among them (the choice may be "no help")."""
    out = [float(w) for w in weights]
    if not out or any(not 0.0 <= w <= 1.0 for w in out) or 0.0 not in out:
        raise ValueError(f"{where} must be a non-empty list of weights in [0, 1] that holds 0, got {list(weights)}")
    return out


def tune_aspect_weight(base: TopK, query_aspects: dict, store: AspectStore, to_run: Callable[[TopK], Run],
                       qrels: Qrels, metric: str, weights: Sequence[float], k: int, metrics: Sequence[str] = (),
                       relevance_threshold: float = 1.0, gains: str = "exp2", max_p: float = 1.0) -> AspectChoice:
    """The weight of ``weights`` whose aspect-match fusion (``aspect_rescore`` of the ``base`` candidates, the
    chosen dense + BM25 fusion's whole pool per query, with the queries' top-k aspect values) has the highest mean
    ``metric`` (ties go to the smaller weight), if it beats weight 0 per query with paired randomisation p below
    ``max_p`` (1.0: the best mean wins); else 0."""
    from madr.significance import paired_tests

    if not 0.0 < max_p <= 1.0:
        raise ValueError(f"max_p must be in (0, 1], got {max_p}")
    names = list(dict.fromkeys([metric, *metrics]))
    grid: dict[float, dict[str, float]] = {}
    per_query: dict[float, dict[str, float]] = {}
    for w in sorted(set(check_aspect_weights(weights))):
        values = evaluate(to_run(aspect_rescore(base, query_aspects, store, w, k)), qrels, names,
                          relevance_threshold=relevance_threshold, gains=gains, per_query=True)
        grid[w] = query_means(values)
        per_query[w] = values[metric]
    best = max(grid, key=lambda w: (grid[w][metric], -w))
    p_value = None
    chosen = best
    if best > 0:
        p_value = float(paired_tests(per_query[best], per_query[0.0])["p_randomisation"])
        if max_p < 1.0 and not p_value < max_p:
            chosen = 0.0
    return AspectChoice(chosen, metric, grid[chosen][metric], grid, best, p_value, max_p)


def as_arrays(points: Sequence[FusionPoint], normalisation: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(lams, metric values) of one normalisation's curve, for the report's plot."""
    pts = [p for p in points if p.normalisation == normalisation]
    return np.array([p.lam for p in pts]), np.array([p.metrics[metric] for p in pts])
