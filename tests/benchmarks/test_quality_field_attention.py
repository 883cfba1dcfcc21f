"""Smoke test of benchmarks.quality.field_attention on the real sources with a tiny random encoder.

A 2-layer BERT over a WordPiece trained in process, 3 steps per variant: checks the wiring (both rows, the
attention weights on held-out pairs, the paired bootstrap, JSON), not quality. Skips when ../shared/data is
absent (the real sources are read).
"""

from __future__ import annotations

import json
import math

import pytest
import torch


def test_concatenation_and_attention_rows_with_their_paired_test(shared_data, tmp_path):
    from benchmarks.quality import field_attention as bench

    sets = ["model.backbone.name_or_path=null", "model.doc_layers=2", "model.projection_dim=32", "steps=3",
            "bench.bootstrap=50", "bench.pooling=cls", f"output_dir={tmp_path / 'run'}",
            f"real_data.data_dir={shared_data}", "real_data.parallel_train_per_language=20",
            "real_data.parallel_eval_per_language=10"]
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--threads", "1", "--seeds", "0", "--out-dir", str(tmp_path), "--tag", "smoke",
                             *[a for s in sets for a in ("--set", s)]])
        start = bench.main(["--threads", "1", "--seeds", "0", "--initial-weights", "--out-dir", str(tmp_path),
                            *[a for s in sets for a in ("--set", s)]])["initial_weights"][0]
        with pytest.raises(SystemExit, match="must be null here"):
            bench.main(["--seeds", "0", "--set", "tasks.click.field_attention=additive", "--out-dir", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    attention = bench.attention_label("additive")
    assert set(result["mean"]) == {bench.CONCAT, attention}
    run = result["runs"][0]
    assert run["rows"][bench.CONCAT]["click_auc"] != run["rows"][attention]["click_auc"], "two different models"
    weights = run["attention_weights"][attention]
    assert 0.0 < weights["alpha_title_mean"] < 1.0 and weights["pairs_with_every_field"] > 0.5, weights
    assert start.keys() == weights.keys() and start != weights, "the untrained attention, then the trained one"
    paired = run["paired_attention_minus_concat"]
    assert set(paired) == {"click_auc", "nli_auc_en", "nli_auc_xx", "nli_auc_all3", "xling_top1"}
    assert all(math.isfinite(v["diff"]) and 0.0 <= v["p_bootstrap"] <= 1.0 for v in paired.values()), paired
    saved = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert saved["seeds"] == [0] and not (tmp_path / "results" / "smoke.partial.json").exists()
