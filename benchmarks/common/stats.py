"""The statistics every quality benchmark reports: mean ± sample std over seeds, the paired tests of two rows
over the same test items (two-sided sign-flip randomisation and Student's paired t-test, the papers' test),
and the paired bootstrap of a metric that is not a mean over items (an AUC).

One implementation of each. `paired_tests` (`madr.significance`, which the evaluate job reports too) merges the
two copies the Home Depot and hetPQA scripts had: the same test on the same draws, with the stricter edge cases
of the Home Depot copy (an empty or constant difference) and a refusal of two sides that do not hold the same
items (the hetPQA copy paired a's items and raised a KeyError only when b lacked one; the Home Depot copy
silently paired the shared items).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from madr.significance import TOL, paired_tests  # noqa: F401  (the evaluate job reports the same test)


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


def paired_bootstrap(statistic: Callable[[np.ndarray], float], n: int, draws: int, rng: np.random.Generator
                     ) -> dict[str, float]:
    """Resample the `n` paired items with replacement `draws` times (`rng.integers(0, n, n)` each);
    `statistic(idx)` is a - b on the resampled items. Returns the 95% percentile interval of the draws and
    the two-sided p of "a - b = 0" (twice the smaller tail, at most 1)."""
    boot = np.array([statistic(rng.integers(0, n, n)) for _ in range(draws)])
    p = 2 * min((boot <= 0).mean(), (boot >= 0).mean())
    return {"ci_low": float(np.quantile(boot, 0.025)), "ci_high": float(np.quantile(boot, 0.975)),
            "p_bootstrap": float(min(1.0, p))}
