"""The examination curve estimated from a simulated log comes close to the curve the log was made with; the
naive click-through rate (which mixes in the old ranker's relevance ordering) does not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from madr.clicks.examination import curve_error, estimate_examination, write_curve
from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)

TOLERANCE = 0.05


def simulated(searches: int = 20_000, noise: float = 0.3, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    candidates = {}
    for q in range(200):
        grades = rng.integers(0, 5, 20)
        scores = grades + rng.normal(0, 0.5, 20)  # the old ranker knows the grades, noisily
        candidates[f"query {q}"] = [(f"d{q}-{i}", float(s), int(g))
                                    for i, (s, g) in enumerate(zip(scores, grades, strict=True))]
    truth = power_law_examination(10, eta=1.0)
    sim = ClickSimulation(searches, 10, truth, graded_attractiveness(4), noise=noise, seed=seed)
    return simulate_impressions(candidates, sim), truth


def test_em_recovers_the_simulated_examination_curve(tmp_path: Path) -> None:
    rows, truth = simulated()
    cols = {k: np.array([r[k] for r in rows]) for k in ("query", "doc_id", "position", "clicked")}
    curve = estimate_examination(cols["query"], cols["doc_id"], cols["position"], cols["clicked"], max_rank=10)
    error = curve_error(curve, truth)
    assert error < TOLERANCE, f"estimated {curve.propensity} vs true {list(truth)}: max error {error:.3f}"
    naive = np.asarray(curve.ctr) / curve.ctr[0]
    assert np.max(np.abs(naive - truth)) > TOLERANCE, "the naive CTR curve misses the same tolerance: the test can fail"
    assert curve.pairs_at_several_ranks > 1000
    curve.truth = truth.tolist()
    json_path, png_path = write_curve(curve, tmp_path)
    assert json.loads(json_path.read_text())["propensity"][0] == 1.0 and png_path.stat().st_size > 1000


def test_a_log_without_interventions_is_reported() -> None:
    rows, _ = simulated(searches=2000, noise=0.0)
    cols = {k: np.array([r[k] for r in rows]) for k in ("query", "doc_id", "position", "clicked")}
    curve = estimate_examination(cols["query"], cols["doc_id"], cols["position"], cols["clicked"])
    assert curve.pairs_at_several_ranks == 0, "a fixed ranker shows each pair at one rank only"


def test_no_impression_in_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="no impression at ranks 1..10"):
        estimate_examination(["q"], ["d"], [11], [True])
