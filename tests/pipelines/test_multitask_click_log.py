"""A raw click log through the multilingual recipe's data stage (`pipelines.multitask.data.prepare_data`, no Ray):
`data.clicks` replaces the click task's rows with the log's weighted (query, document) pairs, which survive the
Parquet round trip a train worker reads them through; the examination curve is written under `data/clicks/` and
the click summary lands in `data_summary.json`. `python -m pipelines.jobs plan` takes the setting from `--set`
and refuses an unknown key under it, naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)
from pipelines.jobs import cli
from pipelines.multitask.config import load_pipeline_config
from pipelines.multitask.data import SUMMARY, prepare_data, read_data_stage
from pipelines.multitask.records import columns_to_records, read_records

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multilingual.yaml"
SMALL = {"data.click_queries": 20, "data.click_products": 60, "data.nli_train": 40, "data.nli_eval": 20,
         "data.parallel_train": 40, "data.parallel_eval": 20, "model.tokenizer_vocab_size": 300}


@pytest.fixture(scope="module")
def log_file(tmp_path_factory) -> Path:
    candidates = {f"query {q}": [(f"q{q}-d{d}", float(d % 4), d % 4) for d in range(6)] for q in range(8)}
    sim = ClickSimulation(searches=600, top_k=5, examination=power_law_examination(5),
                          attractiveness=graded_attractiveness(3, epsilon=0.0), noise=1.0, seed=2)
    rows = [{**r, "title": f"item {r['doc_id'].replace('-', ' ')}"} for r in simulate_impressions(candidates, sim)]
    path = tmp_path_factory.mktemp("log") / "impressions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_stage_writes_the_logs_weighted_click_rows(log_file, tmp_path):
    clicks = {"path": str(log_file), "format": "impressions", "max_rank": 5}
    cfg = load_pipeline_config(CONFIG, {**SMALL, "output_dir": str(tmp_path), "data.clicks": clicks})
    stage = prepare_data(cfg)
    summary = json.loads((tmp_path / SUMMARY).read_text())
    assert summary["clicks"]["records"]["clicked_pairs"] == stage.sizes["click"] > 0, summary["clicks"]
    assert summary["clicks"]["debiased"] and summary["clicks"]["log"]["searches"]["searches"] == 600
    for name in ("examination.json", "examination.png", "report.json", "summary.json"):
        assert (tmp_path / "data" / "clicks" / name).is_file(), f"data/clicks/{name} is missing"
    expected = {r.doc_id + r.query: r for r in stage.sets.clicks_train if r.clicked}
    written = [r for f in sorted((tmp_path / "data" / "click").glob("part-*.parquet")) for r in read_records(str(f), "click")]
    assert {r.doc_id + r.query: r for r in written} == expected, "the click rows are the log's clicked pairs"
    assert len({round(r.weight, 6) for r in written}) > 1 and any(r.negatives for r in written)
    table = pq.read_table(next((tmp_path / "data" / "click").glob("part-*.parquet")))
    columns = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    assert columns_to_records(columns, "click") == table_records(table), "a worker's batch gives the same records"
    assert read_data_stage(cfg).sets.clicks_train == stage.sets.clicks_train, "later stages read the same sets"


def table_records(table) -> list:
    from pipelines.data.sources import to_record

    return [to_record(row, "click") for row in table.to_pylist()]


def test_plan_takes_the_click_log_setting_and_names_an_unknown_key(log_file, tmp_path, capsys):
    clicks = json.dumps({"path": str(log_file), "format": "impressions"})
    argv = ["plan", "--config", str(CONFIG), "--set", f"output_dir={tmp_path}"]
    assert cli.main([*argv, "--set", f"data.clicks={clicks}"]) == 0, capsys.readouterr().err
    bad = json.dumps({"path": str(log_file), "formt": "impressions"})
    assert cli.main([*argv, "--set", f"data.clicks={bad}"]) == 2
    assert "data.clicks.formt" in capsys.readouterr().err
