"""benchmarks.quality.row_export: per-query metrics of rows trained on another machine come back per key and
seed; the same key and seed from two folders (two runs mixed) is refused, naming the file."""

from __future__ import annotations

import pytest

from benchmarks.quality.row_export import read_rows, write_row


def _write(folder, seed: int, value: float):
    per_query = {"bibert": {"recall@10": {"q1": value, "q2": 0.5}}, "bm25+bibert": {"recall@10": {"q1": 1.0, "q2": 0.0}}}
    labels = {"bibert": "BiBERT (trained, multilingual-e5-small)", "bm25+bibert": "BM25 + BiBERT"}
    return write_row(folder, "bibert", seed, per_query, labels, {"bibert": {"train_s": 3.0}, "bm25+bibert": None},
                     "cpu")


def test_rows_come_back_per_key_and_seed_from_several_folders(tmp_path):
    _write(tmp_path / "gpu", 0, 1.0)
    _write(tmp_path / "cpu", 1, 0.0)
    per_seed, labels, info, machines = read_rows([tmp_path / "gpu", tmp_path / "cpu"])
    assert per_seed["bibert"] == {0: {"recall@10": {"q1": 1.0, "q2": 0.5}}, 1: {"recall@10": {"q1": 0.0, "q2": 0.5}}}
    assert set(per_seed["bm25+bibert"]) == {0, 1}
    assert labels["bibert"] == "BiBERT" and labels["bm25+bibert"] == "BM25 + BiBERT"
    assert info == {"bibert": {0: {"train_s": 3.0}, 1: {"train_s": 3.0}}}
    assert {m["device"] for m in machines.values()} == {"cpu"} and len(machines) == 2


def test_a_key_exported_twice_for_one_seed_is_refused(tmp_path):
    _write(tmp_path / "a", 0, 1.0)
    path = _write(tmp_path / "b", 0, 0.0)
    with pytest.raises(SystemExit, match=f"{path}: bibert seed 0 is exported twice"):
        read_rows([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(SystemExit, match="no seed"):
        read_rows([tmp_path / "empty"])
