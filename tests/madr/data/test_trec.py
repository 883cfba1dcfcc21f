"""madr.data.trec: run and qrels files out (ranking order, ties, exact scores); qrels in, BEIR TSV or TREC
told apart by the first line. (ranx reading the evaluation job's files: tests/pipelines/test_evaluate.py.)"""

from __future__ import annotations

import pytest

from madr.data.trec import format_run, qrels_layout, qrels_of, read_qrels, write_qrels, write_run


def test_run_lines_follow_madrs_ranking_with_exact_scores() -> None:
    run = {"q2": {"b": 0.5, "a": 0.5, "c": 0.1 + 0.2}, "q1": {"d": -1.25}}
    lines = format_run(run, "bm25").splitlines()
    assert lines == ["q1 Q0 d 1 -1.25 bm25",
                     "q2 Q0 a 1 0.5 bm25", "q2 Q0 b 2 0.5 bm25",  # a tie: doc id ascending, as madr.metrics ranks
                     "q2 Q0 c 3 0.30000000000000004 bm25"]
    assert float(lines[-1].split()[4]) == run["q2"]["c"], "scores read back to the same float"
    with pytest.raises(ValueError, match="one word"):
        format_run(run, "two words")


def test_ids_with_whitespace_cannot_be_written(tmp_path) -> None:
    with pytest.raises(ValueError, match="holds whitespace"):
        write_run(tmp_path / "r.trec", {"q1": {"doc 1": 1.0}}, "x")
    with pytest.raises(ValueError, match="holds whitespace"):
        write_qrels(tmp_path / "q.trec", {"q 1": {"d": 1.0}})


def test_qrels_layouts(tmp_path) -> None:
    beir = tmp_path / "test.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    trec = write_qrels(tmp_path / "qrels.trec", {"q1": {"d2": 2.0, "d1": 0.0}})
    assert trec.read_text() == "q1 0 d1 0\nq1 0 d2 2\n"
    assert (qrels_layout(str(beir)), qrels_layout(trec.as_uri())) == ("beir", "trec")
    assert qrels_of(read_qrels(str(beir))) == {"q1": {"d1": 1.0}}
    assert qrels_of(read_qrels(str(trec))) == {"q1": {"d1": 0.0, "d2": 2.0}}
