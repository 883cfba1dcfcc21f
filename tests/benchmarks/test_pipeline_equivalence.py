"""benchmarks.quality.pipeline_equivalence: the pipeline's TREC runs are scored per query against its qrels and
paired with the benchmark's exported per-query metrics on the queries the benchmark evaluates."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from benchmarks.quality.pipeline_equivalence import compare, compare_seeds, main, over_seeds, write_row


def _pipeline_dir(tmp_path):
    out = tmp_path / "run"
    (out / "data" / "eval").mkdir(parents=True)
    (out / "evaluation").mkdir()
    (out / "_stages").mkdir()
    pq.write_table(pa.table({"query_id": ["q1", "q1", "q2", "q3"], "product_id": ["a", "b", "c", "d"],
                             "relevance": [4, 0, 3, 1]}), out / "data" / "eval" / "qrels.parquet")
    # fused: q1 finds a at rank 1, q2 misses c; dense alone: q1 finds a at rank 2, q2 finds c at rank 1
    (out / "evaluation" / "bibert.trec").write_text("q1 Q0 a 1 0.9 bibert\nq1 Q0 b 2 0.5 bibert\nq2 Q0 x 1 0.9 bibert\n")
    (out / "evaluation" / "bibert-dense.trec").write_text(
        "q1 Q0 b 1 0.9 d\nq1 Q0 a 2 0.8 d\nq2 Q0 c 1 0.7 d\nq3 Q0 d 1 0.7 d\n")
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": "bibert"}, "eval": {"relevance_threshold": 3.0}}))
    (out / "_stages" / "evaluate.done.json").write_text(json.dumps({"config": str(config)}))
    return out


def test_pipeline_runs_pair_with_the_benchmark_rows_per_query(tmp_path):
    out = _pipeline_dir(tmp_path)
    per_query = {"bm25+bibert_mined": {"mrr@10": {"q1": 1.0, "q2": 0.0}},  # what the pipeline's fusion scores
                 "bibert_mined": {"mrr@10": {"q1": 1.0, "q2": 1.0}}}       # q1 differs from the pipeline's 0.5
    write_row(tmp_path / "export", "bibert_mined", 0, per_query, {k: k for k in per_query}, {}, "cpu")
    result = compare(out, tmp_path / "export", "bibert_mined", 0, draws=200)
    fused, dense = result["fused"]["mrr@10"], result["encoder alone"]["mrr@10"]
    assert (fused["pipeline"], fused["benchmark"], fused["diff"], fused["n"]) == (0.5, 0.5, 0.0, 2)
    assert fused["runs"] == ["bibert", "bm25+bibert_mined"]
    assert dense["pipeline"] == pytest.approx(0.75) and dense["diff"] == pytest.approx(-0.25)
    assert dense["n"] == 2, "q3 has no relevant product: the benchmark does not evaluate it"


def test_two_seeds_of_the_benchmark_pair_with_each_other(tmp_path):
    """The yardstick: the benchmark's seed 0 against its seed 1."""
    for seed, q1 in ((0, 1.0), (1, 0.5)):
        per_query = {"bm25+bibert_mined": {"mrr@10": {"q1": q1, "q2": 0.0}},
                     "bibert_mined": {"mrr@10": {"q1": 1.0, "q2": 1.0}}}
        write_row(tmp_path / "export", "bibert_mined", seed, per_query, {k: k for k in per_query}, {}, "cpu")
    result = compare_seeds(tmp_path / "export", "bibert_mined", [0, 1], draws=200)
    bench = result["benchmark seed 0 vs 1: fused"]["mrr@10"]
    assert (bench["pipeline"], bench["benchmark"], bench["diff"]) == (0.5, 0.25, 0.25)
    assert result["benchmark seed 0 vs 1: encoder alone"]["mrr@10"]["diff"] == 0.0
    # the benchmark's seeds alone, from the command line (no pipeline runs)
    assert main(["--between-seeds", "--export", str(tmp_path / "export"), "--seed", "0", "1", "--draws", "200",
                 "--out-dir", str(tmp_path / "out"), "--tag", "seeds"]) == 0
    written = json.loads((tmp_path / "out" / "results" / "seeds.json").read_text())["pairs"]
    assert sorted(written) == ["benchmark seed 0 vs 1: encoder alone", "benchmark seed 0 vs 1: fused"]
    assert written["benchmark seed 0 vs 1: fused"]["mrr@10"]["diff"] == 0.25


def test_the_multilingual_run_pairs_with_the_published_teacher_per_language(tmp_path):
    from benchmarks.quality.pipeline_equivalence import compare_multilingual

    out = tmp_path / "ml"
    out.mkdir()
    ours = {"click_auc": 0.78, "xling_top1_deu": 0.9, "xling_top1_fra": 0.7, "xling_top1": 0.8}
    (out / "metrics.json").write_text(json.dumps({"rows": {"multitask": ours, "untrained": {}}}))
    teacher = "multi-task e5 teacher (12 layers)"
    published = tmp_path / "published.json"
    published.write_text(json.dumps({"runs": [
        {"seed": 0, "rows": {teacher: {"click_auc": 0.77, "xling_top1_deu": 0.8, "xling_top1_fra": 0.7}}},
        {"seed": 1, "rows": {teacher: {"click_auc": 0.5, "xling_top1_deu": 0.0, "xling_top1_fra": 0.0}}}]}))
    result = compare_multilingual(out, published, seed=0, draws=200)
    assert result["click_auc"]["diff"] == pytest.approx(0.01) and result["click_auc"]["n"] == 1
    xling = result["xling_top1 (per language)"]
    assert xling["n"] == 2 and xling["diff"] == pytest.approx(0.05), "paired over the published seed's languages"
    assert (xling["pipeline"], xling["benchmark"]) == (pytest.approx(0.8), pytest.approx(0.75))


def test_the_multilingual_runs_of_several_seeds_pair_by_seed(tmp_path):
    from benchmarks.quality.pipeline_equivalence import main

    teacher = "multi-task e5 teacher (12 layers)"
    published = tmp_path / "published.json"
    published.write_text(json.dumps({"runs": [
        {"seed": s, "rows": {teacher: {"click_auc": 0.70 + s / 100, "xling_top1_deu": 0.8, "xling_top1_fra": 0.6}}}
        for s in (0, 1)]}))
    dirs = []
    for s in (0, 1):
        dirs.append(tmp_path / f"ml{s}")
        dirs[-1].mkdir()
        ours = {"click_auc": 0.72 + s / 100, "xling_top1_deu": 0.8, "xling_top1_fra": 0.7}
        (dirs[-1] / "metrics.json").write_text(json.dumps({"rows": {"multitask": ours}}))
    argv = ["--pipeline-dir", *map(str, dirs), "--multilingual", str(published), "--seed", "0", "1",
            "--draws", "100", "--out-dir", str(tmp_path / "out"), "--tag", "ml"]
    assert main(argv) == 0
    pairs = json.loads((tmp_path / "out" / "results" / "ml.json").read_text())["pairs"]
    assert pairs["seed 1"]["click_auc"]["benchmark"] == pytest.approx(0.71), "each run against its own seed's row"
    over = pairs["over seeds"]["click_auc"]
    assert over["n"] == 2 and over["diff"] == pytest.approx(0.02), f"paired by seed: {over}"
    assert pairs["over seeds"]["xling_top1 (per language)"]["diff"] == pytest.approx(0.05)
    with pytest.raises(SystemExit):
        main(["--pipeline-dir", str(dirs[0]), "--multilingual", str(published), "--seed", "0", "1"])


def test_several_seeds_comparisons_pair_by_seed(tmp_path):
    """--over-seeds: each side's mean over the seeds and the test paired by seed, from the per-seed JSONs."""
    paths = []
    for seed, (ours, theirs) in enumerate(((0.50, 0.52), (0.51, 0.52), (0.49, 0.50))):
        row = {"pipeline": ours, "benchmark": theirs, "diff": ours - theirs, "n": 1548}
        path = tmp_path / f"pipeline_equivalence_seed{seed}.json"
        path.write_text(json.dumps({"pairs": {"fused": {"recall@10": row}}}))
        paths.append(path)
    r = over_seeds(paths, draws=200)["fused"]["recall@10"]
    assert r["n"] == 3 and r["pipeline"] == pytest.approx(0.50) and r["benchmark"] == pytest.approx(1.54 / 3)
    assert r["diff"] == pytest.approx(-0.0133, abs=1e-4) and 0 < r["p_ttest"] < 0.1
    assert r["p_randomisation"] >= 0.25 - 1e-9, "3 seeds: the sign-flip test cannot go below 2/8"
