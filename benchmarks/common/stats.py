"""The statistics every quality benchmark reports: mean ± sample std over seeds, the paired tests of two rows
over the same test items (two-sided sign-flip randomisation and Student's paired t-test, the papers' test),
and the paired bootstrap of a metric that is not a mean over items (an AUC).

One implementation of each. `paired_tests` merges the two copies the Home Depot and hetPQA scripts had:
the same test on the same draws, with the stricter edge cases of the Home Depot copy (an empty or constant
difference) and a refusal of two sides that do not hold the same items (the hetPQA copy paired a's items
and raised a KeyError only when b lacked one; the Home Depot copy silently paired the shared items).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

TOL = 1e-12  # differences closer than this count as equal


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0.0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def format_mean_std(values: Sequence[float], digits: int = 3) -> str:
    """"0.512" for one value, "0.512 ± 0.013" (sample std) for several."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def seed_mean_std(per_seed: Sequence[Mapping[str, Mapping[str, float]]]) -> tuple[dict, dict]:
    """{row: {metric: value}} per seed -> ({row: {metric: mean}}, {row: {metric: sample std}}) over the seeds,
    for the rows and metrics of the first seed."""
    mean: dict[str, dict[str, float]] = {}
    std: dict[str, dict[str, float]] = {}
    for row, metrics in per_seed[0].items():
        pairs = {m: mean_std([s[row][m] for s in per_seed]) for m in metrics}
        mean[row] = {m: p[0] for m, p in pairs.items()}
        std[row] = {m: p[1] for m, p in pairs.items()}
    return mean, std


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


def paired_bootstrap(statistic: Callable[[np.ndarray], float], n: int, draws: int, rng: np.random.Generator
                     ) -> dict[str, float]:
    """Resample the `n` paired items with replacement `draws` times (`rng.integers(0, n, n)` each);
    `statistic(idx)` is a - b on the resampled items. Returns the 95% percentile interval of the draws and
    the two-sided p of "a - b = 0" (twice the smaller tail, at most 1)."""
    boot = np.array([statistic(rng.integers(0, n, n)) for _ in range(draws)])
    p = 2 * min((boot <= 0).mean(), (boot >= 0).mean())
    return {"ci_low": float(np.quantile(boot, 0.025)), "ci_high": float(np.quantile(boot, 0.975)),
            "p_bootstrap": float(min(1.0, p))}
