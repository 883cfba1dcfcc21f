"""madr.significance.paired_tests, the one paired test of the evaluate job and the benchmarks, and hetpqa's mean ±
std over seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.quality.hetpqa import format_mean_std, mean_std
from madr.significance import paired_tests


def test_paired_tests_detect_a_constant_shift():
    a = {f"q{i}": 0.5 + 0.01 * (i % 7) for i in range(60)}
    b = {q: v - 0.05 for q, v in a.items()}
    t = paired_tests(a, b, draws=500)
    assert t["diff"] == pytest.approx(0.05) and t["n"] == 60
    assert t["p_randomisation"] < 0.01 and t["p_ttest"] < 0.01, t
    same = paired_tests(a, dict(a), draws=500)
    assert same["diff"] == 0.0 and same["p_randomisation"] == 1.0 and same["p_ttest"] == 1.0, same


def test_paired_tests_draw_the_signs_of_one_big_matrix_in_chunks():
    """The sign flips come in chunks of 1,000 and count the same as one (draws x n) matrix of the same seed."""
    rng = np.random.default_rng(3)
    a = {f"q{i}": float(x) for i, x in enumerate(rng.random(41))}
    b = {q: v + float(rng.normal(0, 0.3)) for q, v in a.items()}
    keys = sorted(a)
    diff = np.array([a[k] - b[k] for k in keys])
    signs = np.random.default_rng(0).choice((-1.0, 1.0), size=(2500, len(diff)))
    hits = np.sum(np.abs((signs * diff).mean(1)) >= abs(diff.mean()) - 1e-12)
    t = paired_tests(a, b, draws=2500)
    assert t["p_randomisation"] == pytest.approx((hits + 1) / 2501) and t["n"] == 41
    from scipy.stats import ttest_rel

    assert t["p_ttest"] == pytest.approx(ttest_rel([a[k] for k in keys], [b[k] for k in keys]).pvalue)


def test_paired_tests_need_the_same_items_and_have_nans_for_none():
    with pytest.raises(ValueError, match="1 only in a, 0 only in b"):
        paired_tests({"q1": 0.1, "q2": 0.2}, {"q1": 0.3})
    empty = paired_tests({}, {})
    assert empty["n"] == 0 and all(math.isnan(empty[k]) for k in ("diff", "p_randomisation", "p_ttest"))
    one = paired_tests({"q1": 0.5}, {"q1": 0.25}, draws=100)
    assert one["diff"] == 0.25 and one["p_randomisation"] == 1.0 and math.isnan(one["p_ttest"])


def test_mean_std_is_the_sample_std_and_zero_for_one_seed():
    assert mean_std([0.5]) == (0.5, 0.0)
    mean, std = mean_std([0.5, 0.52])
    assert mean == pytest.approx(0.51) and std == pytest.approx(np.std([0.5, 0.52], ddof=1))
    assert format_mean_std([0.5]) == "0.500" and format_mean_std([0.5, 0.52]) == "0.510 ± 0.014"

