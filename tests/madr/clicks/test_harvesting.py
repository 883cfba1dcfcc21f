"""Intervention harvesting (Agarwal et al., WSDM'19) recovers the curve a log was simulated with from the pairs
its random swaps move, refuses a log without interventions naming the ranks, and is what `data.clicks.estimator:
harvest` runs on the judgments path."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from madr.clicks.collapse import IMPRESSION_SCHEMA
from madr.clicks.examination import curve_error, estimate_examination
from madr.clicks.harvesting import estimate_harvested, harvest_interventions, unplaced_ranks
from madr.clicks.judgments import judge_log_impressions
from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)
from madr.config import ClickLogConfig, load_config

TOLERANCE = 0.05


def swapped_log(searches: int, swap_share: float, noise: float = 0.0, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """A log whose old ranker knows the grades (noisily) and, without noise, shows each query's list in one order:
    only the swaps move a pair to another rank."""
    rng = np.random.default_rng(seed)
    candidates = {}
    for q in range(200):
        grades = rng.integers(0, 5, 20)
        scores = grades + rng.normal(0, 0.5, 20)
        candidates[f"query {q}"] = [(f"d{q}-{i}", float(s), int(g)) for i, (s, g) in enumerate(zip(scores, grades,
                                                                                                  strict=True))]
    truth = power_law_examination(10)
    sim = ClickSimulation(searches, 10, truth, graded_attractiveness(4), noise=noise, seed=seed, swap_share=swap_share)
    return simulate_impressions(candidates, sim), truth


def columns(rows: list[dict]) -> list[np.ndarray]:
    return [np.array([r[k] for r in rows]) for k in ("query", "doc_id", "position", "clicked")]


def test_harvesting_recovers_the_simulated_curve_from_swaps_alone() -> None:
    rows, truth = swapped_log(30_000, swap_share=0.5)
    curve = estimate_harvested(*columns(rows), max_rank=10)
    error = curve_error(curve, truth)
    assert error < TOLERANCE, f"harvested {curve.propensity} vs true {list(truth)}: max error {error:.3f}"
    assert curve.estimator == "harvest" and curve.propensity[0] == 1.0
    assert curve.interventions["1-2"] > 100 and set(curve.interventions) <= {f"{a}-{b}" for a in range(1, 11)
                                                                              for b in range(a + 1, 11)}
    naive = np.asarray(curve.ctr) / curve.ctr[0]
    assert np.max(np.abs(naive - truth)) > TOLERANCE, "the naive CTR curve misses the same tolerance: the test can fail"


def test_a_log_without_interventions_is_refused_naming_the_ranks() -> None:
    rows, _ = swapped_log(2000, swap_share=0.0)
    with pytest.raises(ValueError, match=r"cannot place ranks \[2, 3, 4, 5, 6, 7, 8, 9, 10\].*>= 20 query-document "
                                         r"pairs.*2: 0 / 0"):
        estimate_harvested(*columns(rows), max_rank=10)
    rows, _ = swapped_log(300, swap_share=1.0)
    iv = harvest_interventions(*columns(rows), max_rank=10)
    assert unplaced_ranks(iv.pairs, 1) == [] and unplaced_ranks(iv.pairs, 10_000) == list(range(1, 10))
    with pytest.raises(ValueError, match=r"cannot place ranks \[2, .*>= 10000 query-document pairs"):
        estimate_harvested(*columns(rows), max_rank=10, min_interventions=10_000)


def test_swaps_move_pairs_and_leave_a_log_without_them_unchanged() -> None:
    plain, _ = swapped_log(500, swap_share=0.0, noise=0.3)
    swapped, _ = swapped_log(500, swap_share=0.5, noise=0.3)
    moved = sum(a != b for a, b in zip(plain, swapped, strict=True))
    assert 0 < moved < len(plain) and [r["query"] for r in plain] == [r["query"] for r in swapped]
    with pytest.raises(ValueError, match="swap_share"):
        ClickSimulation(1, 1, np.ones(1), np.ones(2), swap_share=1.5)


def test_the_estimator_setting_is_validated_naming_the_key() -> None:
    assert ClickLogConfig(path="log.jsonl").estimator == "auto", "harvesting where the log allows it, else EM"
    with pytest.raises(ValueError, match=r"data.clicks.estimator: 'harvst' is not one of auto, harvest, em"):
        ClickLogConfig(path="log.jsonl", estimator="harvst")
    with pytest.raises(ValueError, match="data.clicks.min_interventions"):
        ClickLogConfig(path="log.jsonl", estimator="harvest", min_interventions=0)
    cfg = load_config(None, {"data.clicks": {"path": "log.jsonl", "format": "impressions", "estimator": "harvest"}})
    assert cfg.data.clicks.estimator == "harvest" and cfg.data.clicks.min_interventions == 20


def impressions_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{**r, "doc_text": None, "clicks": int(r["clicked"]), "purchased": False,
                                  "dwell": None} for r in rows], schema=IMPRESSION_SCHEMA)


@pytest.mark.parametrize("estimator", ["em", "harvest"])
def test_judgments_use_the_chosen_estimator(tmp_path: Path, estimator: str) -> None:
    rows, truth = swapped_log(5000, swap_share=0.5, noise=0.3)
    clicks = ClickLogConfig(path="log.jsonl", format="impressions", estimator=estimator, max_rank=10)
    curve, judgments = judge_log_impressions(impressions_table(rows), clicks, tmp_path)
    written = json.loads((tmp_path / "examination.json").read_text())
    assert curve.estimator == written["estimator"] == estimator
    assert (written["interventions"] is not None) == (estimator == "harvest")
    assert (tmp_path / "examination.png").stat().st_size > 1000 and judgments
    expected = estimate_harvested if estimator == "harvest" else estimate_examination
    assert curve.propensity == expected(*columns(rows), max_rank=10).propensity
    assert written["click_noise"] == {"epsilon": 0.0, "source": "set", "pairs": 0, "quantile": None}


def test_judgments_take_the_click_noise_floor_the_config_asks_for(tmp_path: Path) -> None:
    rows, _ = swapped_log(5000, swap_share=0.5, noise=0.3)
    log = impressions_table(rows)
    plain = ClickLogConfig(path="log.jsonl", format="impressions", estimator="harvest", max_rank=10)
    auto = ClickLogConfig(path="log.jsonl", format="impressions", estimator="harvest", max_rank=10, click_noise="auto")
    _, ipw = judge_log_impressions(log, plain, tmp_path / "plain")
    curve, affine = judge_log_impressions(log, auto, tmp_path / "auto")
    written = json.loads((tmp_path / "auto" / "examination.json").read_text())["click_noise"]
    assert written["source"] == "auto" and written["epsilon"] == curve.click_noise["epsilon"] > 0
    assert 0 < sum(j.relevant for j in affine) < sum(j.relevant for j in ipw), "clicks within the floor are dropped"
    with pytest.raises(ValueError, match="click_noise must be auto or a number"):
        ClickLogConfig(path="log.jsonl", format="impressions", click_noise="high")


def test_judgments_refuse_a_log_harvesting_cannot_use(tmp_path: Path) -> None:
    rows, _ = swapped_log(500, swap_share=0.0)
    clicks = SimpleNamespace(path="log.jsonl", estimator="harvest", max_rank=10, min_interventions=20)
    with pytest.raises(ValueError, match="cannot place ranks"):
        judge_log_impressions(impressions_table(rows), clicks, tmp_path)


def test_auto_harvests_where_the_log_allows_it_and_else_falls_back_to_em_saying_why(tmp_path: Path) -> None:
    rows, _ = swapped_log(5000, swap_share=0.5, noise=0.3)
    clicks = ClickLogConfig(path="log.jsonl", format="impressions", max_rank=10)
    curve, _ = judge_log_impressions(impressions_table(rows), clicks, tmp_path / "moved")
    assert curve.estimator == "harvest" and curve.fallback is None
    assert curve.propensity == estimate_harvested(*columns(rows), max_rank=10).propensity

    still, _ = swapped_log(500, swap_share=0.0)
    curve, judgments = judge_log_impressions(impressions_table(still), clicks, tmp_path / "still")
    written = json.loads((tmp_path / "still" / "examination.json").read_text())
    assert curve.estimator == written["estimator"] == "em" and judgments
    assert "cannot place ranks" in written["fallback"], written["fallback"]
    assert curve.propensity == estimate_examination(*columns(still), max_rank=10).propensity
