"""Smoke test of benchmarks.quality.multilingual on the real sources with a tiny random encoder.

A 2-layer BERT over a WordPiece trained in process, 3 steps per model and a 1-layer query student distilled
for 2 steps: this checks the wiring (rows, the student row and its paired test, JSON, plot), not quality.
Skips when ../shared/data is absent (the real sources are read).
"""

from __future__ import annotations

import json
import math

import torch

from benchmarks.quality import multilingual as bench


def test_student_row_is_distilled_evaluated_and_tested_against_its_teacher(shared_data, tmp_path):
    sets = ["model.backbone.name_or_path=null", "model.doc_layers=2", "model.projection_dim=32", "steps=3",
            "student.enabled=true", "student.steps=2", "student.num_layers=1", "bench.bootstrap=50",
            "bench.pooling=cls", f"output_dir={tmp_path / 'run'}", f"real_data.data_dir={shared_data}",
            "real_data.parallel_train_per_language=20", "real_data.parallel_eval_per_language=10"]
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--threads", "1", "--no-reference", "--seeds", "0", "--out-dir", str(tmp_path),
                             "--tag", "smoke", *[a for s in sets for a in ("--set", s)]])
    finally:
        torch.set_num_threads(threads)
    student = "Multi-task (click + nli + translation), 1-layer query student"
    assert student in result["mean"] and f"| {student} |" in result["table"]
    run = result["runs"][0]
    assert run["training"][student]["query_student_layers"] == 1.0
    assert run["training"][student]["query_held_out_l2_before"] > 0.0, "a 1-layer student starts away from its teacher"
    paired = run["paired_student_minus_multi"]
    assert set(paired) == {"click_auc", "nli_auc_en", "nli_auc_xx", "nli_auc_all3", "xling_top1"}
    assert all(math.isfinite(v["diff"]) and 0.0 <= v["p_bootstrap"] <= 1.0 for v in paired.values()), paired
    saved = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert saved["seeds"] == [0] and (tmp_path / "plots" / "smoke.png").is_file()
    assert not (tmp_path / "results" / "smoke.partial.json").exists(), "the partial file is removed at the end"
