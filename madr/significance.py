"""Paired significance of two rankers over the same queries: the test the papers report beside every comparison
(Student's paired t-test) and the two-sided sign-flip randomisation test (Smucker et al., CIKM'07: the paired
test IR evaluation recommends), on per-query metric values; and a paired bootstrap of the difference in ROC AUC of
two scorings of the same labelled items (`paired_auc_bootstrap`), where no per-query value exists."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

TOL = 1e-12  # differences closer than this count as equal


def paired_tests(a: Mapping[str, float], b: Mapping[str, float], draws: int = 10000, seed: int = 0
                 ) -> dict[str, float]:
    """Mean difference a - b over the items (query ids) both map, with the two-sided paired randomisation p
    (`draws` random sign flips of the per-item differences, (hits + 1) / (draws + 1)) and Student's paired
    t-test p. A constant difference gives p_t 1.0 (zero) or 0.0 (non-zero), where t is 0 or infinite; no
    items give NaNs and n 0. `a` and `b` must hold the same items (ValueError otherwise)."""
    if set(a) != set(b):
        raise ValueError(f"a paired test needs the same items on both sides: {len(set(a) - set(b))} only in a, "
                         f"{len(set(b) - set(a))} only in b")
    keys = sorted(a)
    diff = np.array([a[k] - b[k] for k in keys], dtype=np.float64)
    if len(diff) == 0:
        return {"diff": math.nan, "p_randomisation": math.nan, "p_ttest": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    observed, hits, done = abs(diff.mean()), 0, 0
    while done < draws:  # chunks keep the sign matrix small (the same draws as one big matrix)
        n = min(1000, draws - done)
        signs = rng.choice((-1.0, 1.0), size=(n, len(diff)))
        hits += int(np.sum(np.abs(signs @ diff) / len(diff) >= observed - TOL))
        done += n
    p_t = math.nan
    if np.ptp(diff) > TOL and len(diff) > 1:
        from scipy.stats import ttest_rel

        p_t = float(ttest_rel([a[k] for k in keys], [b[k] for k in keys]).pvalue)
    elif len(diff) > 1:  # a constant difference: t is 0 or infinite
        p_t = 1.0 if abs(diff.mean()) <= TOL else 0.0
    return {"diff": float(diff.mean()), "p_randomisation": float((hits + 1) / (draws + 1)), "p_ttest": p_t,
            "n": len(diff)}


def paired_auc_bootstrap(a: np.ndarray, b: np.ndarray, labels: np.ndarray, draws: int = 2000, seed: int = 0
                         ) -> dict[str, float]:
    """ROC AUC of scores `a` minus that of `b` on the same items (`labels`: relevant or not), with a 95% interval and
    a two-sided p from `draws` paired resamples of the items (a resample with one class only is skipped)."""
    from madr.metrics import roc_auc

    labels = np.asarray(labels, dtype=bool)
    diff = roc_auc(a, labels) - roc_auc(b, labels)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(draws):
        rows = rng.integers(0, labels.size, labels.size)
        if labels[rows].all() or not labels[rows].any():
            continue
        samples.append(roc_auc(a[rows], labels[rows]) - roc_auc(b[rows], labels[rows]))
    d = np.asarray(samples)
    p = min(1.0, 2 * min(float((d <= 0).mean()), float((d >= 0).mean()))) if d.size else math.nan
    low, high = np.quantile(d, [0.025, 0.975]) if d.size else (math.nan, math.nan)
    return {"diff": float(diff), "low": float(low), "high": float(high), "p_bootstrap": p, "n": int(labels.size)}
