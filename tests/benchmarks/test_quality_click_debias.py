"""The click-debiasing study at a tiny size: a synthetic judged catalog, a random 2-layer BERT, two fine-tuning
steps per run; every row trains, the report has its paired tests and curve errors, and a second call resumes
from the per-run cache without training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.quality.click_debias import main

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)


def test_click_debias_tiny_and_resumable(tmp_path: Path) -> None:
    cfg = {"name": "tiny_clicks", "output_dir": str(tmp_path / "unused"),
           "data": {"tokenizer_vocab_size": 600},
           "model": {"name": "bibert", "backbone": {"name_or_path": None, "tiny": {
               "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
               "max_position_embeddings": 64}}, "shared_towers": True, "max_query_length": 12, "max_doc_length": 24},
           "train": {"pretrain": {"steps": 0}, "finetune": {"steps": 2, "batch_size": 8, "negatives": "mined",
                                                             "mined_depth": 5, "aspect_weight": 0.0}},
           "eval": {"relevance_threshold": 3.0}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    argv = ["--config", str(path), "--catalog", "synthetic", "--synthetic-products", "120", "--synthetic-queries",
            "60", "--sizes", "400", "--seeds", "0", "--top-k", "5", "--pool", "15", "--corpus-size", "0",
            "--draws", "200", "--threads", "1", "--out", str(tmp_path / "study"), "--results-dir", str(tmp_path)]
    first = main(argv)
    report = first["sizes"]["400"]
    assert set(report["means"]) == {"naive", "debiased", "filtered", "judgments"}
    assert set(report["tests"]) == {"debiased vs naive", "filtered vs naive", "judgments vs debiased",
                                    "judgments vs naive"}
    assert set(report["gap_recovered"]) == {"debiased", "filtered"}
    assert report["tests"]["debiased vs naive"]["recall@10"]["n"] > 0
    assert len(report["curve_max_abs_error"]) == 1 and len(report["estimated_curves"][0]) == 5
    assert set(report["curves"]) == {"em", "harvest"} and len(report["curves"]["em"]["max_abs_error"]) == 1
    assert (tmp_path / "results" / "click_debias.json").is_file()
    second = main(argv)
    assert all(r["cached"] for rows in second["runs"].values() for rs in rows.values() for r in rs), \
        "a second call reads every run from its cache"
    assert second["sizes"] == first["sizes"]


def test_curves_only_reports_both_estimators_without_training(tmp_path: Path) -> None:
    """`--curves-only`: the logs are simulated and both estimators' curves compared with the truth, nothing is
    trained; a log is kept per simulation setting (a new swap share is a new log, not the old one reused)."""
    path = _untrained_config(tmp_path, "tiny_curves")
    argv = ["--config", str(path), "--catalog", "synthetic", "--synthetic-products", "120", "--synthetic-queries",
            "60", "--sizes", "3000", "--seeds", "0", "--top-k", "5", "--pool", "15", "--noise", "0",
            "--min-interventions", "5", "--curves-only", "--out", str(tmp_path / "study"), "--results-dir",
            str(tmp_path)]
    swapped = main([*argv, "--swap-share", "0.5"])["sizes"]["3000"]["curves"]
    assert swapped["harvest"]["max_abs_error"][0] < 0.1 and swapped["em"]["max_abs_error"][0] is not None, swapped
    fixed = main([*argv, "--swap-share", "0"])["sizes"]["3000"]["curves"]
    assert fixed["harvest"]["max_abs_error"] == [None] and "cannot place ranks" in fixed["harvest"]["refused"][0]
    assert len(list((tmp_path / "study" / "logs").glob("n3000-seed0-*.jsonl"))) == 2
    assert not (tmp_path / "study" / "runs").exists(), "nothing is trained"
    assert json.loads((tmp_path / "results" / "click_debias_curves.json").read_text())["args"]["curves_only"]
    assert not (tmp_path / "results" / "click_debias.json").exists(), "the trained study's results stay"


def test_weights_only_reports_where_each_weighting_puts_the_positives(tmp_path: Path) -> None:
    """`--weights-only`: per log, the share of the click positives' weight on relevant and on grade-0 products
    for naive, estimated-curve and true-curve weights, and the affine correction with the estimated and the true
    click-noise floor; with no noise clicks (epsilon 0) no positive is grade 0."""
    path = _untrained_config(tmp_path, "tiny_weights")
    argv = ["--config", str(path), "--catalog", "synthetic", "--synthetic-products", "120", "--synthetic-queries",
            "60", "--sizes", "3000", "--seeds", "0", "--top-k", "5", "--pool", "15", "--noise", "0.5",
            "--swap-share", "0.5", "--min-interventions", "5", "--estimator", "harvest", "--weights-only",
            "--out", str(tmp_path / "study"), "--results-dir", str(tmp_path)]
    noisy = main([*argv, "--epsilon", "0.3"])["sizes"]["3000"]["positive_mass"][0]
    floor = noisy.pop("click_noise")
    assert floor["true"] == 0.3 and 0 < floor["estimated"] < 1
    filters = {f"{w}, posterior rate filter (G 0.75)" for w in ("naive", "ipw (estimated curve)")}
    assert set(noisy) == {"naive", "ipw (estimated curve)", "ipw (true curve)", "affine (estimated curve and floor)",
                          "affine (true curve and floor)", *filters}
    assert all(0 < noisy[f]["positives"] < noisy["naive"]["positives"] for f in filters), "the filter drops some"
    ipw = [noisy[k]["positives"] for k in ("naive", "ipw (estimated curve)", "ipw (true curve)")]
    assert len(set(ipw)) == 1, "inverse propensity changes weights, not positives"
    assert noisy["affine (true curve and floor)"]["positives"] < ipw[0], "clicks within the noise are no positives"
    assert noisy["affine (true curve and floor)"]["grade0_share"] < noisy["ipw (true curve)"]["grade0_share"]
    assert all(0 < m["relevant_share"] < 1 for m in noisy.values()), noisy
    clean = main([*argv, "--epsilon", "0"])["sizes"]["3000"]["positive_mass"][0]
    assert clean.pop("click_noise")["true"] == 0
    assert all(m["grade0_share"] == 0 for m in clean.values()), clean
    assert not (tmp_path / "study" / "runs").exists(), "nothing is trained"
    assert (tmp_path / "results" / "click_debias_weights.json").is_file()


def _untrained_config(tmp_path: Path, name: str) -> Path:
    """A config for the runs that train nothing (a tiny random backbone, only its tokenizer is used)."""
    cfg = {"name": name, "output_dir": str(tmp_path / "unused"), "data": {"tokenizer_vocab_size": 600},
           "model": {"name": "bibert", "backbone": {"name_or_path": None, "tiny": {
               "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
               "max_position_embeddings": 64}}}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
