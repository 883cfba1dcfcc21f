"""Mean ± sample std over seeds, and the one paired test of two rows over the same items
(`madr.significance.paired_tests`: sign-flip randomisation and Student's paired t, as the evaluate job)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from madr.significance import paired_tests  # noqa: F401  (re-exported: the benchmarks' one paired test)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0.0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def format_mean_std(values: Sequence[float], digits: int = 3) -> str:
    """"0.512" for one value, "0.512 ± 0.013" for several."""
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
