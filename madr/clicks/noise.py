"""The click-noise floor of a click log: how often users click a document they examined and found irrelevant.

Under the position-based model with click noise (Chapelle et al., CIKM'09; Ai et al., SIGIR'18) a document shown at
rank k is clicked with probability theta_k gamma_qd, and gamma_qd >= epsilon for every pair: some examined
irrelevant documents are clicked too. Inverse-propensity weights (Joachims et al., WSDM'17) undo theta_k for those
clicks as well, so the noise clicks on irrelevant documents shown at rarely examined ranks count in full. The
affine correction (Vardasbi et al., CIKM'20, "When Inverse Propensity Scoring does not Work: Affine Corrections
for Unbiased Learning to Rank", Eq. 11) removes the floor before undoing position: with P(C = 1 | k) =
alpha_k R + beta_k, alpha_k = theta_k (1 - epsilon) and beta_k = theta_k epsilon, each impression contributes
(c - beta_k) / alpha_k, an unbiased estimate of R whether or not it was clicked
(`madr.clicks.judgments.click_judgments`).

`estimate_click_noise` reads epsilon from the log itself: each pair's clicks C_j over its exposure E_j (the sum of
the propensities of the ranks it was shown at) is Poisson(gamma_j E_j); the distribution G of gamma over the log's
pairs is fitted by the nonparametric maximum likelihood estimate on a grid (Laird, JASA 1978, the EM of Sec. 3),
and epsilon is G's `quantile` (the floor most pairs sit on, unshrunk by their few impressions). Units are those of
the curve's propensities (relative to rank 1): epsilon is the click-through rate at rank 1 of an irrelevant
document.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from madr.clicks.examination import ExaminationCurve


@dataclass(frozen=True)
class ClickNoise:
    """The floor `epsilon` (in rank-1 click-through units) and how it was found: "auto" (`estimate_click_noise`:
    the fitted G's `quantile`, from `pairs` pairs) or "set" (the config's value)."""

    epsilon: float
    source: str
    pairs: int = 0
    quantile: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"epsilon": round(self.epsilon, 5), "source": self.source, "pairs": self.pairs,
                "quantile": self.quantile}


def pair_exposure(impressions: Any, curve: ExaminationCurve) -> tuple[np.ndarray, np.ndarray]:
    """Per (query, document) pair of the log: its clicks and its exposure (the sum of the propensities of the ranks
    it was shown at), in a fixed order (`pair_counts`'s)."""
    _, clicks, exposure = pair_counts(impressions, curve)
    return clicks, exposure


def pair_counts(impressions: Any, curve: ExaminationCurve) -> tuple[list[tuple[str, str]], np.ndarray, np.ndarray]:
    """The log's (query, document) pairs, sorted, with each one's clicks and exposure (`pair_exposure`)."""
    clicks: dict[tuple[str, str], int] = defaultdict(int)
    exposure: dict[tuple[str, str], float] = defaultdict(float)
    cols = [impressions.column(n).to_pylist() for n in ("query", "doc_id", "position", "clicked", "purchased")]
    for query, doc, rank, clicked, bought in zip(*cols, strict=True):
        exposure[query, doc] += curve.at(rank)
        clicks[query, doc] += int(bool(clicked or bought))
    keys = sorted(exposure)
    return keys, np.array([clicks[k] for k in keys], float), np.array([exposure[k] for k in keys], float)


def rate_likelihoods(clicks: np.ndarray, exposure: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """[pairs, grid] each pair's Poisson(gamma E_j) likelihood of its clicks at each rate of `grid`, scaled per pair
    (its largest is 1)."""
    log_lik = clicks[:, None] * np.log(grid[None, :] * np.maximum(exposure[:, None], 1e-12)) \
        - grid[None, :] * exposure[:, None]
    return np.exp(log_lik - log_lik.max(axis=1, keepdims=True))


def fit_npmle(clicks: np.ndarray, exposure: np.ndarray, grid: np.ndarray, iterations: int = 200) -> np.ndarray:
    """The mixing weights over `grid` of the NPMLE of gamma (Laird, JASA 1978): EM on pi_m with each pair's
    Poisson(gamma E_j) likelihood of its clicks (`rate_likelihoods`)."""
    lik = rate_likelihoods(clicks, exposure, grid)
    weights = np.full(len(grid), 1.0 / len(grid))
    for _ in range(iterations):
        post = lik * weights
        post /= post.sum(axis=1, keepdims=True)
        weights = post.mean(axis=0)
    return weights


def fitted_rates(clicks: np.ndarray, exposure: np.ndarray, max_pairs: int = 20000,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The grid of click rates and the NPMLE's weights over it (`fit_npmle`), fitted on the pairs with exposure (at
    most `max_pairs` of them, drawn with `seed`)."""
    keep = exposure > 0
    clicks, exposure = clicks[keep], exposure[keep]
    if len(clicks) == 0:
        raise ValueError("the click log shows no document at a rank the examination curve covers")
    if len(clicks) > max_pairs:
        pick = np.random.default_rng(seed).choice(len(clicks), max_pairs, replace=False)
        clicks, exposure = clicks[pick], exposure[pick]
    grid = np.linspace(0.005, 1.0, 200)
    return grid, fit_npmle(clicks, exposure, grid)


def pair_rates_above(impressions: Any, curve: ExaminationCurve, quantile: float) -> dict[tuple[str, str], float]:
    """Per (query, document) pair of the log: the posterior probability that its click rate gamma (clicks per
    examination, the rank's effect taken out by `curve`) is above t, the `quantile` of the log's fitted G
    (`fitted_rates`). Empirical Bayes (Robbins; the NPMLE prior of Laird, 1978): a pair with one click in a few
    impressions is shrunk toward the log's bulk instead of taken at face value, one with many keeps its own rate."""
    if not 0 < quantile < 1:
        raise ValueError(f"the rate quantile must be in (0, 1), got {quantile}")
    keys, clicks, exposure = pair_counts(impressions, curve)
    grid, weights = fitted_rates(clicks, exposure)
    threshold = grid[min(int(np.searchsorted(np.cumsum(weights), quantile)), len(grid) - 1)]
    post = rate_likelihoods(clicks, exposure, grid) * weights
    above = post[:, grid > threshold].sum(axis=1) / post.sum(axis=1)
    return {k: float(p) for k, p in zip(keys, above, strict=True)}


def likely_above(impressions: Any, curve: ExaminationCurve, quantile: float) -> set[tuple[str, str]]:
    """The (query, document) pairs whose click rate is more likely than not above the log's `quantile`
    (`pair_rates_above` > 0.5): the pairs `data.clicks.rate_quantile` lets be positives."""
    return {pair for pair, p in pair_rates_above(impressions, curve, quantile).items() if p > 0.5}


def estimate_click_noise(impressions: Any, curve: ExaminationCurve, quantile: float = 0.1,
                         max_pairs: int = 20000, seed: int = 0) -> ClickNoise:
    """epsilon of the log (module docstring): the `quantile` of the NPMLE of gamma over its pairs (at most
    `max_pairs` of them, drawn with `seed`)."""
    clicks, exposure = pair_exposure(impressions, curve)
    grid, weights = fitted_rates(clicks, exposure, max_pairs, seed)
    epsilon = float(grid[np.searchsorted(np.cumsum(weights), quantile)])
    return ClickNoise(epsilon, "auto", int(min((exposure > 0).sum(), max_pairs)), quantile)
