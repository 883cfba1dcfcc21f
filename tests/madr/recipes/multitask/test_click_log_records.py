"""A raw click log as the multi-task recipe's click task (`madr.recipes.multitask.click_log`): a log simulated with a
known examination curve gives one click record per (query, shown document) pair, clicked pairs weighted by the
clipped inverse propensity of their clicks (more at low-examination ranks; all 1 with `debias: false`), the query's
skip negatives attached, documents without text and evaluation queries left out and counted, the curve written."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from madr.clicks.examination import ExaminationCurve, curve_error
from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)
from madr.config import ClickLogConfig
from madr.data.records import ClickRecord, MultilingualData
from madr.recipes.multitask.click_log import MAX_SKIP_NEGATIVES, apply_click_log
from madr.recipes.multitask.config import load_multitask_config

TOP_K, NO_TEXT, EVAL_QUERY = 6, "q00-d7", "query 01"


def _candidates() -> dict[str, list[tuple[str, float, int]]]:
    rng = np.random.default_rng(3)
    out = {}
    for q in range(12):
        grades = rng.integers(0, 4, 8)
        out[f"query {q:02d}"] = [(f"q{q:02d}-d{d}", float(g + rng.normal(0, 1.0)), int(g))
                                 for d, g in enumerate(grades)]
    return out


@pytest.fixture(scope="module")
def log_file(tmp_path_factory) -> Path:
    """Impressions of 3000 searches (top 6, examination 1/k; grade 0 never clicked: skip negatives), every
    document titled but one."""
    sim = ClickSimulation(searches=3000, top_k=TOP_K, examination=power_law_examination(TOP_K),
                          attractiveness=graded_attractiveness(3, epsilon=0.0), noise=0.6, seed=1)
    rows = simulate_impressions(_candidates(), sim)
    for r in rows:
        if r["doc_id"] != NO_TEXT:
            r["title"] = f"product {r['doc_id'].replace('-', ' ')}"
    path = tmp_path_factory.mktemp("log") / "impressions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sets() -> MultilingualData:
    """Held-out click candidates of one query that the log also has (`EVAL_QUERY`), nothing else needed."""
    held = [ClickRecord("Query  01", {"title": "held out"}, False, doc_id="x", relevance=2)]
    return MultilingualData([ClickRecord("old", {"title": "old"}, True)], held, [], [], [], [])


def _clicked_ranks(path: Path) -> dict[tuple[str, str], list[int]]:
    ranks = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["clicked"]:
            ranks[r["query"], r["doc_id"]].append(r["position"])
    return ranks


def _apply(log_file: Path, out: Path, **settings: object) -> tuple[list[ClickRecord], dict]:
    clicks = ClickLogConfig(path=str(log_file), format="impressions", max_rank=TOP_K, **settings)
    data, summary = apply_click_log(_sets(), clicks, out)
    return data.clicks_train, summary


def test_debiased_weights_follow_the_estimated_curve(log_file, tmp_path):
    records, summary = _apply(log_file, tmp_path)
    curve = ExaminationCurve.from_dict(json.loads((tmp_path / "examination.json").read_text()))
    assert (tmp_path / "examination.png").stat().st_size > 0, "the curve's plot is written"
    assert curve_error(curve, power_law_examination(TOP_K)) < 0.15, f"EM misses 1/k: {curve.propensity}"
    clicked = [r for r in records if r.clicked]
    assert clicked and all(r.fields == {"title": f"product {r.doc_id.replace('-', ' ')}"} for r in records)
    ranks = _clicked_ranks(log_file)
    raw = {(r.query, r.doc_id): np.mean([min(1 / curve.at(k), 10.0) for k in ranks[r.query, r.doc_id]])
           for r in clicked}
    mean = np.mean(list(raw.values()))
    for r in clicked:
        assert r.weight == pytest.approx(raw[r.query, r.doc_id] / mean, rel=1e-6), r
        assert r.clicks == len(ranks[r.query, r.doc_id]) and r.position <= min(ranks[r.query, r.doc_id])
    top = [r.weight for r in clicked if np.mean(ranks[r.query, r.doc_id]) < 1.5]
    low = [r.weight for r in clicked if np.mean(ranks[r.query, r.doc_id]) >= 3]
    assert top and low and min(low) > max(top), "a click at a rarely examined rank must weigh more than at rank 1"
    assert np.mean([r.weight for r in clicked]) == pytest.approx(1.0), "weights are normalised to mean 1"
    with_negatives = [r for r in clicked if r.negatives]
    assert with_negatives and all(len(r.negatives) <= MAX_SKIP_NEGATIVES for r in with_negatives)
    assert all(not r.negatives for r in records if not r.clicked), "skip negatives ride on clicked records only"
    assert summary["records"]["clicked_pairs"] == len(clicked) and summary["debiased"] is True


def test_documents_without_text_and_evaluation_queries_are_left_out_and_counted(log_file, tmp_path):
    records, summary = _apply(log_file, tmp_path)
    rows = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert not any(r.doc_id == NO_TEXT or r.query == EVAL_QUERY for r in records)
    eval_rows = [r for r in rows if r["query"] == EVAL_QUERY]
    no_text = [r for r in rows if r["doc_id"] == NO_TEXT]
    assert summary["left_out"]["evaluation_query_impressions"] == len(eval_rows) > 0
    assert summary["left_out"]["impressions_without_text"] == len(no_text) > 0
    kept = sum(r.impressions for r in records)
    assert kept + len(eval_rows) + len(no_text) == len(rows), "every impression is kept or counted"
    assert json.loads((tmp_path / "report.json").read_text())["left_out"] == summary["left_out"]


def test_without_debiasing_every_clicked_pair_weighs_one(log_file, tmp_path):
    records, summary = _apply(log_file, tmp_path, debias=False, skip_negatives=False)
    clicked = [r for r in records if r.clicked]
    assert clicked and all(r.weight == 1.0 for r in records), "debias: false is the naive weighting"
    assert not any(r.negatives for r in records) and summary["debiased"] is False
    assert (tmp_path / "examination.json").is_file(), "the curve is estimated and written all the same"


def test_unknown_click_log_keys_fail_naming_them():
    with pytest.raises(ValueError, match=r"data\.clicks\.bogus"):
        load_multitask_config(None, {"data.clicks": {"path": "log.jsonl", "bogus": 1}})
    with pytest.raises(ValueError, match="skip_negatives"):
        load_multitask_config(None, {"data.clicks": {"path": "log.jsonl"}, "tasks.click.field_attention": "additive"})
    cfg = load_multitask_config(None, {"data.clicks": {"path": "log.jsonl", "format": "impressions"}})
    assert isinstance(cfg.data.clicks, ClickLogConfig) and cfg.data.clicks.format == "impressions"
