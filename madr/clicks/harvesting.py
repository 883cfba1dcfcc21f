"""The examination curve estimated by intervention harvesting (Agarwal et al., "Estimating Position Bias without
Intrusive Interventions", WSDM'19), the second estimator beside the EM of `madr.clicks.examination`.

Position-based model: P(C = 1 | q, d, k) = p_k rel(q, d). Instead of fitting a relevance per pair (EM), the
estimator uses only the query-document pairs the log shows at two different ranks k != k' (the interventions a log
holds anyway: ranker updates, A/B tests, noise). For such a pair its click rate at k over its click rate at k' is
p_k / p_k' whatever its relevance.

* Harvesting (Sec. 3): the interventional set S_{k,k'} holds every pair (q, d) shown at rank k in some searches of
  q and at rank k' in others. Each pair enters with its query's share of the log's searches, Pr(q), times its click
  rate at k (the paper's weighting w(q, d, k), the number of times the pair was shown at k, divides the clicks at k,
  so that a pair weighs the same at both ranks): c[k, k'] = sum over S_{k,k'} of Pr(q) CTR(q, d, k), and likewise
  n[k, k'] with the non-click rate. Then E c[k, k'] = p_k r_{k,k'} with r_{k,k'} = r_{k',k} = sum Pr(q) rel(q, d).
* AllPairs extremum estimator (Sec. 4): maximise over p, r in [0, 1] (r symmetric)
  sum_{k != k'} c[k, k'] log(p_k r_{k,k'}) + n[k, k'] log(1 - p_k r_{k,k'}),
  every rank pair at once rather than only (1, k). Solved here by exact coordinate ascent (the objective is concave
  in r for fixed p and in p for fixed r; each coordinate's optimum is the root of a decreasing derivative, found by
  bisection). Only p_k / p_1 is identified; the curve reports that.

A rank is placed relative to rank 1 only through a chain of rank pairs with enough harvested pairs;
`estimate_harvested` refuses a log without one and names the ranks and their counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from madr.clicks.examination import EPS, ExaminationCurve, _encode_pairs

METHOD = "intervention harvesting, AllPairs extremum estimator (Agarwal et al., WSDM'19)"


@dataclass(frozen=True)
class Interventions:
    """Harvested interventions (Sec. 3), ranks 0-based: `clicks[k, k']` / `skips[k, k']` the query-weighted click /
    non-click rates at k of the pairs shown at both k and k', `pairs[k, k']` how many such pairs (symmetric); and
    the log's impressions and clicks per rank, its number of pairs and of pairs shown at several ranks."""

    clicks: np.ndarray
    skips: np.ndarray
    pairs: np.ndarray
    impressions: np.ndarray
    hits: np.ndarray
    n_pairs: int
    several: int

    def counts(self) -> dict[str, int]:
        """Harvested pairs per rank pair, 1-based: {"k-k'": n} for k < k' with n > 0 (the JSON's record)."""
        k, k2 = np.nonzero(np.triu(self.pairs, 1))
        return {f"{a + 1}-{b + 1}": int(self.pairs[a, b]) for a, b in zip(k, k2, strict=True)}


def harvest_interventions(queries: Any, docs: Any, positions: Any, clicked: Any, max_rank: int) -> Interventions:
    """The interventional sets of a log's impressions at ranks 1..`max_rank` (module docstring, Sec. 3)."""
    positions = np.asarray(positions, dtype=np.int64)
    keep = (positions >= 1) & (positions <= max_rank)
    if not keep.any():
        raise ValueError(f"no impression at ranks 1..{max_rank}")
    q = np.unique(np.asarray(queries)[keep].astype(str), return_inverse=True)[1]
    pair = _encode_pairs(np.asarray(queries)[keep], np.asarray(docs)[keep])
    k, c = positions[keep] - 1, np.asarray(clicked, dtype=np.float64)[keep]
    n_pairs = int(pair.max()) + 1
    cells, cell = np.unique(pair * max_rank + k, return_inverse=True)  # the (pair, rank)s shown: sparse
    pair_of, rank_of = cells // max_rank, cells % max_rank
    several = np.bincount(pair_of, minlength=n_pairs) > 1
    harvested = several[pair_of]
    row = np.cumsum(several)[pair_of[harvested]] - 1  # dense rows for the pairs at several ranks only
    shown = np.zeros((int(several.sum()), max_rank))
    hits = np.zeros_like(shown)
    shown[row, rank_of[harvested]] = np.bincount(cell, minlength=len(cells))[harvested]
    hits[row, rank_of[harvested]] = np.bincount(cell, weights=c, minlength=len(cells))[harvested]
    query_of_pair = np.zeros(n_pairs, dtype=np.int64)
    query_of_pair[pair] = q
    weight = _query_shares(q)[query_of_pair[several]][:, None]  # Pr(q) of Sec. 3
    at = (shown > 0).astype(np.float64)
    ctr = hits / np.maximum(shown, 1)
    other = 1 - np.eye(max_rank)  # the same rank twice is no intervention
    return Interventions(clicks=(weight * ctr * at).T @ at * other, skips=(weight * (1 - ctr) * at).T @ at * other,
                         pairs=((at.T @ at) * other).astype(np.int64), impressions=np.bincount(k, minlength=max_rank),
                         hits=np.bincount(k, weights=c, minlength=max_rank), n_pairs=n_pairs,
                         several=int(several.sum()))


def _query_shares(query: np.ndarray) -> np.ndarray:
    """Each query's share of the impressions, per query index: Pr(q) of Sec. 3 when every search shows as many
    results (otherwise Pr(q) times the query's mean page length)."""
    counts = np.bincount(query).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def unplaced_ranks(pairs: np.ndarray, min_interventions: int) -> list[int]:
    """0-based ranks no chain of rank pairs, each with >= `min_interventions` harvested pairs, links to rank 1."""
    linked = pairs >= min_interventions
    reached = np.zeros(len(pairs), dtype=bool)
    reached[0] = True
    while True:
        grown = reached | linked[reached].any(axis=0)
        if (grown == reached).all():
            return [int(r) for r in np.nonzero(~reached)[0]]
        reached = grown


def _bisect(derivative: Any, upper: np.ndarray, steps: int = 60) -> np.ndarray:
    """Per element, the root in (EPS, upper) of a decreasing `derivative` (the upper end where it stays positive)."""
    lo, hi = np.full_like(upper, EPS), upper.copy()
    for _ in range(steps):
        mid = (lo + hi) / 2
        positive = derivative(mid) > 0
        lo, hi = np.where(positive, mid, lo), np.where(positive, hi, mid)
    return (lo + hi) / 2


def allpairs_propensities(iv: Interventions, iterations: int = 500,
                          tolerance: float = 1e-9) -> tuple[np.ndarray, int, float]:
    """The AllPairs extremum estimate (Sec. 4) by coordinate ascent: (p relative to p_1, iterations, objective)."""
    c, n = iv.clicks, iv.skips
    p = np.ones(len(c))
    previous, done, objective = -np.inf, 0, 0.0
    while done < iterations:
        done += 1
        r = _r_step(c, n, p)
        p = _p_step(c, n, r)
        objective = _objective(p, r, c, n)
        if objective - previous <= tolerance * max(abs(objective), 1.0):
            break
        previous = objective
    return p / p[0], done, objective


def _r_step(c: np.ndarray, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """argmax over the symmetric r[k, k'] of its terms for (k, k') and (k', k), every rank pair at once."""
    pk, pk2 = p[:, None], p[None, :]

    def derivative(x: np.ndarray) -> np.ndarray:
        return (c + c.T) / x - n * pk / np.maximum(1 - pk * x, EPS) - n.T * pk2 / np.maximum(1 - pk2 * x, EPS)

    return _bisect(derivative, np.full((len(c), len(c)), 1 - EPS))


def _p_step(c: np.ndarray, n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """argmax over p_k of sum_k' c[k, k'] log p_k + n[k, k'] log(1 - p_k r[k, k']), every k at once."""
    clicks = c.sum(axis=1)

    def derivative(x: np.ndarray) -> np.ndarray:
        return clicks / x - (n * r / np.maximum(1 - x[:, None] * r, EPS)).sum(axis=1)

    return _bisect(derivative, np.full(len(c), 1 - EPS))


def _objective(p: np.ndarray, r: np.ndarray, c: np.ndarray, n: np.ndarray) -> float:
    """The AllPairs log-likelihood (Sec. 4) at (p, r)."""
    q = np.clip(p[:, None] * r, EPS, 1 - EPS)
    return float(np.sum(c * np.log(q) + n * np.log(1 - q)))


def estimate_harvested(queries: Any, docs: Any, positions: Any, clicked: Any, max_rank: int = 10,
                       min_interventions: int = 20, iterations: int = 500) -> ExaminationCurve:
    """The examination curve by intervention harvesting (module docstring). Raises ValueError when some rank is
    not linked to rank 1 by rank pairs with >= `min_interventions` harvested pairs each."""
    iv = harvest_interventions(queries, docs, positions, clicked, max_rank)
    missing = unplaced_ranks(iv.pairs, min_interventions)
    if missing:
        counts = ", ".join(f"{k + 1}: {int(iv.pairs[k].sum())} / {int(iv.pairs[k].max())}" for k in missing)
        raise ValueError(f"intervention harvesting cannot place ranks {[k + 1 for k in missing]} relative to rank 1: "
                         f"no chain of rank pairs, each with >= {min_interventions} query-document pairs shown at "
                         f"both ranks, reaches them (harvested pairs per rank, over all other ranks / with its "
                         f"best-linked rank: {counts}); the log needs more interventions (the same pair shown at "
                         "different ranks), or estimator: em, or a lower min_interventions or max_rank")
    propensity, done, objective = allpairs_propensities(iv, iterations)
    ctr = iv.hits / np.maximum(iv.impressions, 1)
    return ExaminationCurve(propensity=propensity.round(6).tolist(), theta=propensity.round(6).tolist(),
                            impressions=iv.impressions.astype(int).tolist(), clicks=iv.hits.astype(int).tolist(),
                            ctr=ctr.round(6).tolist(), iterations=done, log_likelihood=round(objective, 6),
                            pairs=iv.n_pairs, pairs_at_several_ranks=iv.several, method=METHOD, estimator="harvest",
                            interventions=iv.counts())


def harvest_from_table(impressions: Any, max_rank: int = 10, min_interventions: int = 20) -> ExaminationCurve:
    """`estimate_harvested` on an impressions table (`madr.clicks.collapse.IMPRESSION_SCHEMA`)."""
    cols = {n: impressions.column(n).to_numpy(zero_copy_only=False) for n in ("query", "doc_id", "position",
                                                                            "clicked")}
    return estimate_harvested(cols["query"], cols["doc_id"], cols["position"], cols["clicked"], max_rank,
                              min_interventions)
