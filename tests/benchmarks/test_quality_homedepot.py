"""Smoke test of benchmarks.quality.homedepot: every row of the table on a tiny synthetic catalog.

A random 2-layer BERT over a WordPiece tokenizer trained on the catalog, 2 fine-tuning steps per model: this
checks the wiring (rows, metrics, tests, JSON, plot), not quality. The Home Depot run is the script's job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np
import pytest
import torch

from benchmarks.quality import homedepot as bench
from benchmarks.quality.aspect_models.data import EvalSet, load_config
from benchmarks.quality.aspect_models.rows import DEFAULT_MODELS, model_config
from benchmarks.quality.aspect_models.training import row_fingerprint
from madr.config import config_hash


def test_table_has_a_row_per_model_with_metrics_in_unit_interval(tiny_aspects_config, tmp_path):
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--config", str(tiny_aspects_config), "--out-dir", str(out), "--tag", "smoke",
                             "--threads", "1", "--set", "bench.corpus_size=150"])
    finally:
        torch.set_num_threads(threads)  # main() sets the process-wide count
    rows = DEFAULT_MODELS
    saved = json.loads((out / "results" / "smoke.json").read_text())
    assert (out / "plots" / "smoke.png").is_file(), "the plot is written"
    assert set(saved["mean"]) == set(rows) == set(saved["rows"]), saved["rows"]
    metrics = ["recall@10", "recall@50", "mrr@10", "ndcg@5", "ndcg@10", "auc"]
    for key in rows:
        assert list(saved["mean"][key]) == metrics, (key, saved["mean"][key])
        for m, v in saved["mean"][key].items():
            assert math.isfinite(v) and 0.0 <= v <= 1.0, (key, m, v)
        assert f"| {saved['rows'][key]} |" in saved["table"], f"row {key} missing from the printed table"
    assert 150 <= saved["data"]["corpus"] < saved["data"]["products"], saved["data"]
    assert set(saved["tests"]["vs_baseline"]) == set(rows) - {"bibert"}, "every row is tested against BiBERT"
    for key, per_metric in saved["tests"]["vs_baseline"].items():
        for m, t in per_metric.items():
            assert 0.0 < t["p_randomisation"] <= 1.0 and t["n"] == saved["data"]["evaluated_test_queries"], (key, m, t)
    assert set(saved["tests"]["fusion_vs_weighted_sum"]) == {"madral_pw", "madral_cls"}
    assert set(saved["tests"]["vs_madral"]) == {"madr", "mur", "mural"}, "paper 001 Table 3: relative to MADRAL"
    assert "paper 001 Table 3 shape" in saved["table"]
    aspect_rows = {k for k, v in saved["aspect_accuracy"].items() if v}
    assert aspect_rows == {"mtbert", "madral_ws", "madral_pw", "madral_cls", "mural"}, aspect_rows
    for key in aspect_rows:
        assert all(0.0 <= v <= 1.0 for v in saved["aspect_accuracy"][key].values()), saved["aspect_accuracy"][key]
    assert saved["training"]["0"]["bibert"]["finetune"]["steps"] == 2
    assert result["seeds"] == [0]


def test_a_rerun_keeps_finished_rows_and_retrains_when_the_settings_change(tiny_aspects_config, tmp_path, capsys):
    """Rows are cached per seed under <output_dir>/seed<seed>/<row>/result.json with a fingerprint of their
    settings: adding a seed trains only that seed; another fine-tuning budget trains everything again."""
    config, out = tiny_aspects_config, tmp_path / "out"
    common = ["--config", str(config), "--out-dir", str(out), "--threads", "1", "--models", "bibert", "madral_pw",
              "--set", "bench.corpus_size=150", "--set", "bench.save_models=[madral_pw]"]
    threads = torch.get_num_threads()
    try:
        first = bench.main([*common, "--tag", "first"])
        capsys.readouterr()
        second = bench.main([*common, "--tag", "second", "--seeds", "0", "1"])
        kept = capsys.readouterr().out
        third = bench.main([*common, "--tag", "third", "--set", "train.finetune.steps=3"])
        retrained = capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)
    assert kept.count("kept from") == 2 and "seed 1 BiBERT: {" in kept, kept[-2000:]
    assert second["seeds"] == [0, 1] and second["per_seed"][0] == first["per_seed"][0]
    assert second["seconds"]["seed0 bibert"] == first["seconds"]["seed0 bibert"], "seed 0 was not retrained"
    assert (tmp_path / "run" / "seed0" / "madral_pw" / "model").is_dir(), "the saved model is where the cache says"
    assert "kept from" not in retrained and third["training"][0]["bibert"]["finetune"]["steps"] == 3


def test_ablation_rows_train_their_variant_and_get_their_tables(tiny_aspects_config, tmp_path):
    """Paper 000 Table 6 (MADRAL minus one component) and paper 001 Table 5 (MURAL with one aspect or
    granularity): each ablation builds the model it names and is tested against its full model."""
    ablations = ["madral_no_brand", "madral_no_other", "madral_no_query", "mural_only_color", "mural_only_word"]
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--config", str(tiny_aspects_config), "--out-dir", str(tmp_path / "out"), "--threads", "1",
                             "--tag", "ablations", "--set", "bench.corpus_size=150",
                             "--models", "bibert", "madral_pw", "mural", *ablations])
    finally:
        torch.set_num_threads(threads)
    _, cfg, _ = load_config(tiny_aspects_config, [])
    built = {k: model_config(cfg, k) for k in ablations}
    assert built["madral_no_brand"].aspects == ["category", "color"] and built["madral_no_brand"].fusion == "presence"
    assert built["madral_no_other"].use_other is False and built["madral_no_query"].aspect_sides == ["doc"]
    assert built["mural_only_color"].aspects == ["color"] and built["mural_only_word"].granularities == ["word"]
    assert set(result["tests"]["ablations_vs_madral_pw"]) == {"madral_no_brand", "madral_no_other", "madral_no_query"}
    assert set(result["tests"]["ablations_vs_mural"]) == {"mural_only_color", "mural_only_word"}
    assert "paper 000 Table 6 shape" in result["table"] and "paper 001 Table 5 shape" in result["table"]
    acc = result["aspect_accuracy"]
    assert not any("brand" in c for c in acc["madral_no_brand"]) and set(acc["mural_only_color"]) == {
        "query_acc@1_color", "doc_acc@1_color"}, (acc["madral_no_brand"], acc["mural_only_color"])
    with pytest.raises(SystemExit, match="unknown row"):
        bench.main(["--config", str(tiny_aspects_config), "--models", "madral_no_size"])


def test_the_row_cache_key_is_the_documented_recipe(tiny_aspects_config):
    """Cached rows (<output_dir>/seed<seed>/<row>/result.json) hit only while `row_fingerprint` stays what it was
    when they were written: the config hash of the row, its model config, the other settings (not the name or
    output dir), the corpus's product ids, the seed and the frozen-embedding switch."""
    home, cfg, bench_cfg = load_config(tiny_aspects_config, ["bench.corpus_size=150"])
    ev = EvalSet(["p1", "p2"], ["a", "b"], [{}, {}], ["q1"], ["q"], [{}], {"q1": {"p1": 4.0}}, [np.array([0])])
    settings = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "output_dir")}
    for key, seed in (("bibert", 0), ("madral_pw", 1), ("madral_no_brand", 0)):
        expected = config_hash({"row": key, "model": dataclasses.asdict(model_config(cfg, key)), "settings": settings,
                                "corpus": hashlib.sha256(b"p1\np2").hexdigest(), "seed": seed,
                                "freeze_word_embeddings": True})
        assert row_fingerprint(key, seed, cfg, ev, bench_cfg) == expected
