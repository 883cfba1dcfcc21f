"""benchmarks.quality.hetpqa_topk: the paper 002 Table 3 rows e-i table from per-k runs.

The per-k runs are benchmarks.quality.hetpqa results (real hetPQA, minutes each); here two seeds of
made-up per-row means in that result's layout check the table: every k row, mean ± std over seeds, the
paper's values beside the rows it reports, the per-k paired tests, and the plot.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.common.config import ROOT
from benchmarks.quality import hetpqa_topk as topk


def _result(k: int) -> dict:
    rows = ("random", "bm25", "dense_alone", "sparse_alone", "dense_part", "sparse_part", "hybrid", "source_prior")
    seeds = [{row: {m: 0.5 + 0.01 * i + 0.0001 * k + 0.02 * seed for m in topk.pqa.PQA_METRICS}
              for i, row in enumerate(rows)} for seed in (0, 1)]
    test = {"diff": 0.01 * k / 128, "p_randomisation": 0.2, "p_ttest": 0.25, "n": 78}
    nnz = {"hybrid": {"query": min(k, 20.0), "doc": min(k, 40.0)}, "sparse": {"query": 18.0, "doc": 36.0}}
    return {"fine_tuned": {"test": seeds, "chosen": [{"nnz": nnz}, {"nnz": nnz}]},
            "significance_mrr@5": {"fine_tuned_seed_mean": {f"{a}|{b}": test for a, b in topk.pqa.COMPARISONS}}}


def test_table_has_each_k_row_with_seed_spread_and_the_papers_values(tmp_path):
    results = {k: _result(k) for k in (128, 256, 512)}
    table = topk.topk_table(results).splitlines()
    assert len(table) == 2 + len(topk.ONCE) + len(topk.PER_K) * 3
    hybrid_512 = next(line for line in table if line.startswith(f"| {topk.pqa.LABELS['hybrid']} | 512 |"))
    mean = 0.5 + 0.01 * 6 + 0.0001 * 512 + 0.01  # row index 6, seeds 0 and 1 -> +0.00 / +0.02
    assert f"{mean:.3f} ± 0.014" in hybrid_512 and "0.782 (h)" in hybrid_512, hybrid_512
    sparse_256 = next(line for line in table if line.startswith(f"| {topk.pqa.LABELS['sparse_alone']} | 256 |"))
    assert sparse_256.endswith("| - | - |"), "the paper has no sparse row at k=256"
    tests = topk.tests_table(results).splitlines()
    assert [line.split(" |")[0] for line in tests[2:]] == ["| 128", "| 256", "| 512"]
    assert "+0.040 (p_rand 0.200, p_t 0.250)" in tests[-1]
    assert topk.nnz_table({16: _result(16), 128: _result(128)}).splitlines()[2:] == [
        "| 16 | 16.0 | 16.0 | 18.0 | 36.0 |", "| 128 | 20.0 | 40.0 | 18.0 | 36.0 |"]
    assert topk.plot(results, tmp_path / "k.png", "title") and (tmp_path / "k.png").stat().st_size > 0


def test_reuse_needs_the_same_top_k_placement(tmp_path, monkeypatch):
    """A per-k JSON from before issue 20 (no `sparse_top_k_in_training`: cut in training) is reused only for a
    run that asks for the cut in training; the default (cut at inference only) runs again."""
    config = str(ROOT / "configs" / "real" / "hetpqa.yaml")
    monkeypatch.setattr(topk, "RESULTS", tmp_path / "benchmarks" / "results")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    old = {"config": {"model": {"sparse_top_k": 16}, "seeds": [0]}}
    (tmp_path / "benchmarks" / "results" / "t_k16.json").write_text(json.dumps(old))
    ran = []
    monkeypatch.setattr(topk.pqa, "main", lambda argv: ran.append(argv) or {"ran": True})
    args = argparse.Namespace(tag="t", reuse=True, config=config, set=[], seeds=[0], threads=1)
    assert topk.run_for_k(16, args) == {"ran": True} and "model.sparse_top_k=16" in ran[0]
    args.set = ["model.sparse_top_k_in_training=true"]
    assert topk.run_for_k(16, args) == old and len(ran) == 1
