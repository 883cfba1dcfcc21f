"""benchmarks.quality.hetpqa_compare: two hetPQA runs side by side with a paired test per model.

The real runs take minutes each; here two made-up results in benchmarks.quality.hetpqa's JSON layout (two seeds,
per-question seed means of 4 test questions) check the tables and that the paired test is over questions.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.quality import hetpqa_compare as cmp

ROWS = ("random", "bm25", "dense_alone", "sparse_alone", "dense_part", "sparse_part", "hybrid", "source_prior")


def _result(shift: float, questions: tuple[str, ...] = ("q1", "q2", "q3", "q4"), seeds=(0, 1)) -> dict:
    per_seed = [{row: {m: 0.5 + 0.01 * i + shift + 0.02 * s for m in cmp.pqa.PQA_METRICS}
                 for i, row in enumerate(ROWS)} for s in seeds]
    per_q = {m: {row: {q: 0.5 + 0.1 * j + (shift if row == "hybrid" else 0.0) for j, q in enumerate(questions)}
                 for row in ROWS} for m in cmp.pqa.PAIRED_METRICS}
    nnz = {"hybrid": {"query": 10.0 + 100 * shift, "doc": 20.0}, "sparse": {"query": 12.0, "doc": 24.0}}
    return {"config": {"seeds": list(seeds)},
            "fine_tuned": {"test": per_seed, "chosen": [{"nnz": nnz} for _ in seeds], "per_question_seed_mean": per_q}}


def test_tables_and_paired_tests_over_questions(tmp_path):
    a, b = _result(0.05), _result(0.0)
    cmp.check_comparable(a, b)
    tests = cmp.paired(a, b)
    assert tests["hybrid"]["mrr@5"]["diff"] == pytest.approx(0.05) and tests["hybrid"]["mrr@5"]["n"] == 4
    assert tests["dense_alone"]["mrr@5"]["diff"] == 0.0 and tests["dense_alone"]["mrr@5"]["p_randomisation"] == 1.0
    # 4 questions, every difference +0.05: the sign-flip test can do no better than 2 / 16 of the flips
    assert tests["hybrid"]["precision@1"]["p_randomisation"] == pytest.approx(0.125, abs=0.02)
    table = cmp.metrics_table({"inference only": a, "training too": b}).splitlines()
    assert len(table) == 2 + 2 * len(cmp.ROWS)
    hybrid_a = next(line for line in table if line.startswith(f"| {cmp.pqa.LABELS['hybrid']} | inference only |"))
    assert "0.620 ± 0.014" in hybrid_a, hybrid_a  # 0.5 + 0.06 + 0.05 + mean(0, 0.02), std of (0, 0.02)
    assert "+0.050 (" in cmp.tests_table(tests, ("A", "B")).splitlines()[2 + cmp.ROWS.index("hybrid")]
    assert cmp.nnz_table({"A": a, "B": b}).splitlines()[2:] == ["| A | 15.0 | 20.0 | 12.0 | 24.0 |",
                                                                "| B | 10.0 | 20.0 | 12.0 | 24.0 |"]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    out = cmp.main([str(pa), str(pb), "--out", str(tmp_path / "c.json")])
    assert json.loads((tmp_path / "c.json").read_text())["paired"]["hybrid"]["mrr@5"]["diff"] == pytest.approx(0.05)
    assert out["names"] == ["A", "B"]


def test_refuses_runs_that_cannot_be_paired(tmp_path):
    with pytest.raises(ValueError, match="seeds differ"):
        cmp.check_comparable(_result(0.0), _result(0.0, seeds=(0, 1, 2)))
    with pytest.raises(ValueError, match="not the same split"):
        cmp.check_comparable(_result(0.0), _result(0.0, questions=("q1", "q2", "q9", "q4")))
    old = _result(0.0)
    del old["fine_tuned"]["per_question_seed_mean"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="per_question_seed_mean"):
        cmp.load(tmp_path / "old.json")
