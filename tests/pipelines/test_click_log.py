"""The click-log reader on Ray Data agrees with the in-process one row for row (impressions, counts, quarantine),
on a generated log with bad rows, a BOM and duplicates, and on the real UBI sample."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from madr.clicks.log import read_click_log
from madr.data import quarantine
from pipelines.data.click_log import ingest_click_log
from tests.madr.clicks.test_click_log import ubi, write_jsonl


def _key(row: dict) -> tuple:
    return row["search_id"], row["position"], row["doc_id"]


def _same(ray_out: Path, summary: dict, log) -> None:
    got = sorted(pq.read_table(ray_out / "impressions").to_pylist(), key=_key)
    want = sorted(log.impressions.to_pylist(), key=_key)
    assert got == want, "Ray Data and the in-process reader give the same impressions"
    assert summary["searches"] == log.summary()["searches"]
    assert summary["events"]["quarantined"] == log.summary()["events"]["quarantined"]


def test_ray_click_log_matches_in_process(ray_local, tmp_path: Path) -> None:
    events = [ubi("impression", f"q{i}", d, p) for i in range(30) for p, d in enumerate("ABCDE")]
    events += [ubi("impression", "q0", "A", 0), ubi("click", "q3", "C"), ubi("click", "q9", "Z"),
               "{broken", ubi("impression", "q4", "X")]
    path = write_jsonl(tmp_path / "events.jsonl", events, bom=True)
    summary = ingest_click_log("ubi", str(path), tmp_path / "out", tmp_path / "q")
    log = read_click_log(str(path), "ubi")
    _same(tmp_path / "out", summary, log)
    assert summary["searches"]["duplicate_events"] == 1 and summary["searches"]["no_position"] == 1
    assert quarantine.read_quarantine(str(tmp_path / "q" / "events")).num_rows == 2
    assert quarantine.read_quarantine(str(tmp_path / "q" / "searches")).column("row").to_pylist() == [153]


def test_ray_reads_the_real_ubi_sample(ray_local, shared_data: Path, tmp_path: Path) -> None:
    events, queries = (str(shared_data / "esci" / f"ubi_esci_{n}.parquet") for n in ("events", "queries"))
    summary = ingest_click_log("ubi", events, tmp_path / "out", tmp_path / "q", queries=queries)
    _same(tmp_path / "out", summary, read_click_log(events, "ubi", queries))
    assert summary["events"]["balanced"] and summary["searches"]["impressions"] > 1000
