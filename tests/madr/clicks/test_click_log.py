"""The click-log readers in one process: UBI events + queries and the plain impressions layout, validated with
quarantine (bad rows, BOMs, duplicates, missing positions) and collapsed into impressions; the real UBI sample."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.clicks.log import read_click_log
from madr.data import quarantine
from madr.data.validation import StrictModeError


def write_jsonl(path: Path, rows: list, bom: bool = False) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + ("\n".join(lines) + "\n").encode("utf-8"))
    return path


def ubi(action: str, qid: str, doc: str | None = None, pos: int | None = None, **extra) -> dict:
    row = {"action_name": action, "query_id": qid, "session_id": "s1", "user_query": "red drill",
           "object_id": doc, "position": pos, "timestamp": extra.pop("ts", "2024-01-01T00:00:00Z")}
    row.update(extra)
    return row


def test_ubi_events_bom_duplicates_bad_rows_and_missing_positions(tmp_path: Path) -> None:
    events = [
        ubi("impression", "q1", "A", 0), ubi("impression", "q1", "B", 1), ubi("impression", "q1", "C", 2),
        ubi("impression", "q1", "B", 1),                      # duplicate beacon: dropped and counted
        ubi("click", "q1", "B", None, ts="2024-01-01T00:00:05Z"),  # no position: placed by B's impression
        ubi("add_to_cart", "q1", "B", 1, ts="2024-01-01T00:00:09Z"),
        ubi("impression", "q1", "D"),                         # an impression without position: quarantined
        ubi("click", "q2", "Z"),                              # a click nobody placed: quarantined at collapse
        ubi("brand_filter", "q1"),                            # another action: skipped, counted
        "{not json",                                          # bad JSON: quarantined
        ubi("impression", None, "E", 3),                      # no search id: quarantined
        ubi("impression", "q1", "F", -1),                     # negative position: quarantined
    ]
    path = write_jsonl(tmp_path / "events.jsonl", events, bom=True)
    log = read_click_log(str(path), "ubi")
    s = log.summary()
    assert s["events"]["balanced"] and s["events"]["rows"] == len(events), s
    assert s["events"]["skipped"] == {"other_action": 1}
    assert s["events"]["quarantined"] == {"missing_field": 2, "bad_json": 1, "bad_value": 1}, s
    assert s["searches"]["duplicate_events"] == 1 and s["searches"]["no_position"] == 1, s["searches"]
    rows = {r["doc_id"]: r for r in log.impressions.to_pylist()}
    assert sorted(rows) == ["A", "B", "C"], "the BOM line's impression is kept; D and Z are not placed"
    assert [rows[d]["position"] for d in "ABC"] == [1, 2, 3], "0-based UBI positions become 1-based ranks"
    assert rows["B"]["clicked"] and rows["B"]["clicks"] == 1 and rows["B"]["purchased"]
    assert not rows["A"]["clicked"] and rows["A"]["session_id"] == "s1"
    bad = {(b["row"], b["reason"], b["field"]) for b in log.files[0].bad}
    assert (7, "missing_field", "position") in bad and (11, "missing_field", "query_id") in bad, bad
    assert log.collapsed.bad[0]["row"] == 8 and log.collapsed.bad[0]["reason"] == "no_position"
    log.write(tmp_path / "out", tmp_path / "q")
    assert quarantine.read_quarantine(str(tmp_path / "q" / "events")).num_rows == 4
    assert quarantine.read_quarantine(str(tmp_path / "q" / "searches")).num_rows == 1
    with pytest.raises(StrictModeError, match=r"events.jsonl: line 7: field 'position'"):
        read_click_log(str(path), "ubi", strict=True)


def test_ubi_queries_give_the_text_and_nested_attributes_are_read(tmp_path: Path) -> None:
    events = [{"action_name": "impression", "query_id": "q1", "client_id": "c",
               "event_attributes": {"object": {"object_id": "A"}, "position": {"ordinal": 1}, "session_id": "s9"}},
              {"action_name": "click", "query_id": "q1",
               "event_attributes": {"object": {"object_id": "A"}, "position": {"ordinal": 1}}}]
    queries = pa.table({"query_id": ["q1", "q1"], "user_query": ["old text", "cordless drill"],
                        "timestamp": ["2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z"]})
    pq.write_table(queries, tmp_path / "queries.parquet")
    log = read_click_log(str(write_jsonl(tmp_path / "e.jsonl", events)), "ubi", str(tmp_path / "queries.parquet"))
    (row,) = log.impressions.to_pylist()
    assert row["query"] == "cordless drill", "the latest queries-table text names the search"
    assert row["position"] == 1 and row["clicked"] and row["session_id"] == "s9"


def test_plain_impressions_layout(tmp_path: Path) -> None:
    rows = [{"query": "drill", "doc_id": "A", "position": 1, "clicked": 0, "session_id": "s1"},
            {"query": "drill", "doc_id": "B", "position": 2, "clicked": 1, "dwell_time": 31.5, "session_id": "s1"},
            {"query": "drill", "doc_id": "B", "position": 2, "clicked": 1, "dwell_time": 31.5, "session_id": "s1"},
            {"query": "drill", "doc_id": "C", "clicked": True},                   # missing position
            {"query": "drill", "doc_id": "D", "position": 3, "clicked": "maybe"},  # unknown flag
            {"query": "saw", "doc_id": "A", "position": 1, "clicked": True, "purchased": True},
            {"query": "saw", "doc_id": "A", "position": 1, "clicked": True, "purchased": True}]
    log = read_click_log(str(write_jsonl(tmp_path / "log.jsonl", rows)), "impressions")
    s = log.summary()
    assert s["events"]["quarantined"] == {"missing_field": 1, "unknown_label": 1}, s
    assert s["searches"]["duplicate_events"] == 1, "the session's repeated row is a duplicate"
    got = sorted((r["query"], r["doc_id"], r["position"], r["clicked"]) for r in log.impressions.to_pylist())
    assert got == [("drill", "A", 1, False), ("drill", "B", 2, True), ("saw", "A", 1, True), ("saw", "A", 1, True)], \
        "rows without a search or session id are searches of their own (never merged as duplicates)"
    assert log.files[0].bad[0]["row"] == 4 and log.files[0].bad[0]["field"] == "position"


def test_real_ubi_sample(shared_data: Path) -> None:
    esci = shared_data / "esci"
    log = read_click_log(str(esci / "ubi_esci_events.parquet"), "ubi", str(esci / "ubi_esci_queries.parquet"))
    s = log.summary()
    assert s["events"]["balanced"] and s["events"]["rows"] == 3448 + 473
    assert s["events"]["quarantined"].get("missing_field", 0) >= 2, "Chorus search events without a query_id"
    assert s["searches"]["impressions"] == log.impressions.num_rows > 1000
    assert s["searches"]["clicked_impressions"] > 100 and s["sessions"] > 100, s
    positions = log.impressions.column("position").to_pylist()
    assert min(positions) == 1, "both the 0-based and the 1-based applications start at rank 1"
