"""benchmarks.quality.distil_e5 (issue 27) end to end on the real sources with a tiny saved backbone: arms of
query students on cached teacher targets, their curves, top-1 kept, the JSON / plot and a rerun that reuses
every finished arm. Not quality. Skips without ../shared."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.quality import distil_e5 as bench
from tests.benchmarks.tiny_backbone import save_tiny_bert


@pytest.fixture(scope="module")
def tiny_e5(tokenizer, tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("tiny_e5"), tokenizer, layers=3)


def _run(shared_data, tiny_e5, out, arms):
    sets = [
        f"model.backbone.name_or_path={tiny_e5}",
        "model.doc_layers=3",
        "student.steps=4",
        "student.eval_every=2",
        "student.probe_sources=20",
        f"output_dir={out / 'run'}",
        f"real_data.data_dir={shared_data}",
        "real_data.parallel_languages=[deu,fra,afr]",
        "real_data.parallel_train_per_language=10",
        "real_data.parallel_eval_per_language=10",
    ]
    threads = torch.get_num_threads()
    try:
        return bench.main(
            [
                "--threads",
                "1",
                "--out-dir",
                str(out),
                "--tag",
                "smoke",
                "--max-texts",
                "200",
                "--held-out-texts",
                "50",
                *[a for s in sets for a in ("--set", s)],
                *[a for arm in arms for a in ("--arm", arm)],
            ]
        )
    finally:
        torch.set_num_threads(threads)


def test_arms_curves_kept_and_rerun(shared_data, tiny_e5, tmp_path):
    result = _run(shared_data, tiny_e5, tmp_path, ["first:mse:0", "spread_cos:cosine+kl:2"])
    assert [a["name"] for a in result["arms"]] == ["first", "spread_cos"] and result["training_texts"] == 200
    assert result["held_out_sources"] == 30 and result["probe_sources"] == 20
    for arm in result["arms"]:
        assert [p["step"] for p in arm["curve"]] == [0.0, 2.0, 4.0], arm["name"]
        assert 0.0 <= arm["xling_top1"] <= 1.0 and arm["xling_top1_kept"] == pytest.approx(
            arm["xling_top1"] / result["teacher_xling_top1"]
        ), arm["name"]
    assert (tmp_path / "plots" / "smoke.png").is_file()
    assert json.loads((tmp_path / "results" / "smoke.json").read_text())["arms"] == result["arms"]
    again = _run(shared_data, tiny_e5, tmp_path, ["first:mse:0", "spread_cos:cosine+kl:2"])
    assert again["teacher_target_seconds"] == 0.0, "the teacher targets are read back, not recomputed"
    assert [a["seconds"] for a in again["arms"]] == [a["seconds"] for a in result["arms"]], "arms reused"


def test_bad_arm_is_refused_naming_it():
    for text, message in (("a:mse", "NAME:LOSS:LAYERS"), ("a:l1:0,1", "loss 'l1'"), ("a:mse:0,x", "comma")):
        with pytest.raises(SystemExit, match=message):
            bench.parse_arm(text)
