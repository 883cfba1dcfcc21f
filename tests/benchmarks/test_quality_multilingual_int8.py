"""Wiring of benchmarks.quality.multilingual_int8 (issue 27 item 2) on the real sources with a tiny saved backbone
(a 2-layer BERT with the session's WordPiece stands in for multilingual-e5-small, as in
test_quality_multilingual_e5): the six variants, their metrics, kept fractions, paired tests against fp32, latency,
agreement, the reference check, the JSON and the plot. Not quality. Skips without ../shared."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
from benchmarks.quality import int8_variants as variants  # noqa: E402
from benchmarks.quality import multilingual_int8 as bench  # noqa: E402
from tests.benchmarks.tiny_backbone import save_tiny_bert

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)


def _small_real_data(shared_data, tmp_path) -> list[str]:
    """`--set`s of a small slice of the real sources and a run directory under `tmp_path`."""
    return [
        f"output_dir={tmp_path / 'run'}",
        f"real_data.data_dir={shared_data}",
        "real_data.parallel_languages=[deu,fra,spa]",
        "real_data.parallel_eval_per_language=3",
        "real_data.parallel_train_per_language=3",
        "real_data.snli_eval_fraction=0.1",
        "eval.batch_size=256",
    ]


@pytest.fixture(scope="module")
def tiny_e5(tokenizer, tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_e5"), tokenizer)


def test_variants_metrics_latency_and_outputs(shared_data, tiny_e5, tmp_path):
    sets = [
        f"model.backbone.name_or_path={tiny_e5}",
        "model.doc_layers=2",
        "bench.bootstrap=30",
        "bench.latency_texts=8",
        *_small_real_data(shared_data, tmp_path),
    ]
    threads = torch.get_num_threads()
    try:
        result = bench.main(
            [
                "--threads",
                "1",
                "--rounds",
                "1",
                "--click-subset",
                "300",
                "--out-dir",
                str(tmp_path),
                "--tag",
                "smoke",
                *[a for s in sets for a in ("--set", s)],
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert list(result["variants"]) == list(variants.VARIANTS)
    for name in variants.VARIANTS:
        assert f"| {name} |" in result["table"], name
        row = result["variants"][name]
        assert {"click_auc_qadsm", "click_auc_qam", "nli_auc_en", "xling_top1"} <= set(row["metrics"])
        assert all(lat > 0 for lat in result["latency"][name].values())
        assert result["agreement"][name]["query"]["min_cosine"] > 0.99
    assert result["variants"][variants.FP32]["kept"]["click_auc"] == 1.0
    paired = result["variants"][variants.ONNX_INT8]["paired_minus_fp32"]
    assert all(math.isfinite(v["diff"]) and 0.0 <= v["p_bootstrap"] <= 1.0 for v in paired.values())
    assert result["agreement"][variants.ONNX]["doc"]["min_cosine"] > 0.9999, "fp32 onnxruntime is the same model"
    assert result["reference_check"]["query"]["min_cosine"] > 0.9999, "madr's fp32 path is e5's own recipe"
    assert set(result["verdict"][variants.INT8]) == {"speed_up", "kept_click_auc", "kept_xling_top1", "meets"}
    assert (
        json.loads((tmp_path / "results" / "smoke.json").read_text())["variants"].keys()
        == result["variants"].keys()
    )
    assert (tmp_path / "plots" / "smoke.png").is_file()
    assert result["held_out_clicks"] == 300


def test_saved_teachers_per_seed(shared_data, tiny_e5, tmp_path):
    """--model-dir: a teacher trained and saved by multilingual_e5 (student.enabled false: no distillation) is
    evaluated fp32 / int8 with madr's sides, per seed (--ready-only: the seeds whose teacher is saved), against
    its fp32 and the untouched e5, which is timed in the same rounds; a rerun takes the seed from the cache, and
    --merge from an earlier result."""
    from benchmarks.quality import multilingual_e5

    sets = [
        f"model.backbone.name_or_path={tiny_e5}",
        "model.doc_layers=2",
        "steps=2",
        "student.enabled=false",
        "bench.save_models=true",
        "bench.bootstrap=30",
        "bench.latency_texts=8",
        "bench.fusion_held_in_clicks=60",
        "bench.fusion_held_in_per_language=1",
        *_small_real_data(shared_data, tmp_path),
    ]
    flags = [a for s in sets for a in ("--set", s)]
    threads = torch.get_num_threads()
    try:
        trained = multilingual_e5.main(
            ["--threads", "1", "--seeds", "0", "--out-dir", str(tmp_path), "--tag", "teacher", *flags]
        )
        argv = ["--threads", "1", "--rounds", "1", "--model-dir", str(tmp_path / "run"), "--seeds", "0", "1"]
        argv += ["--ready-only", "--variants", "onnx_int8_pc", "--out-dir", str(tmp_path), *flags]
        result = bench.main(argv)
        again = bench.main(argv)
        first = str(tmp_path / "results" / "real_multitask_e5_teacher_int8.json")
        merged = bench.main([*argv, "--merge", first, "--tag", "combined"])
    finally:
        torch.set_num_threads(threads)
    assert multilingual_e5.PAIR not in trained["mean"], "no serving pair without the student"
    assert (tmp_path / "run" / "seed0" / "teacher" / "heads.safetensors").is_file()
    assert not (tmp_path / "run" / "seed0" / "serving_pair").exists()
    assert result["seeds"] == [0] and result["variants"] == [variants.FP32, variants.ONNX_INT8_PC]
    run = result["runs"][0]
    teacher = trained["mean"][multilingual_e5.TEACHER]
    for key in ("click_auc", "nli_auc_all3", "xling_top1"):  # the same model, scored the same way
        assert run["rows"][variants.FP32][key] == pytest.approx(teacher[key], abs=1e-6), key
    assert result["untouched_e5"]["click_auc"] == pytest.approx(
        trained["mean"][multilingual_e5.E5]["click_auc"], abs=1e-6
    )
    for v in result["variants"]:
        paired = run["variants"][v]["paired_minus_e5"]
        assert all(math.isfinite(p["diff"]) and 0.0 <= p["p_bootstrap"] <= 1.0 for p in paired.values())
        assert f"| {v} |" in result["table"]
    assert set(run["latency"]) == {variants.FP32, variants.ONNX_INT8_PC, variants.E5_PEER}
    assert run["agreement"][variants.ONNX_INT8_PC]["query"]["mean_cosine"] > 0.9
    assert result["mean"][variants.FP32]["kept_click_auc"] == 1.0 and variants.E5_PEER in result["mean"]
    assert set(result["meets_every_seed"]) == {variants.FP32, variants.ONNX_INT8_PC}
    assert (tmp_path / "plots" / "real_multitask_e5_teacher_int8.png").is_file()
    assert again["runs"][0]["latency"] == run["latency"], "the seed comes from the cache"
    assert merged["seeds"] == [0] and merged["runs"][0]["latency"] == run["latency"], (
        "the seed comes from --merge"
    )
    assert (
        not (tmp_path / "results" / "combined.partial.json").exists()
        or not json.loads((tmp_path / "results" / "combined.partial.json").read_text())["runs"]
    ), "nothing run again"
