"""`python -m pipelines.calibrate` and the in-process experiment's dev-split calibration: a saved aspect model gets
its temperatures (read back by `BiEncoder.load`), a held-out split is scored with them, a model without aspect
predictions is refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.calibration import CALIBRATION_FILE
from madr.modeling.model import BiEncoder, build_model
from madr.recipes.aspects.experiment import calibrate_on_dev
from pipelines.calibrate import main

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _model(name: str, tokenizer, vocabularies) -> BiEncoder:
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48)
    return build_model(cfg, tokenizer, vocabularies if name != "bibert" else None)


@pytest.fixture(scope="module")
def catalog_dir(catalog, tmp_path_factory):
    return catalog.write(tmp_path_factory.mktemp("catalog"))


def test_cli_fits_saves_and_checks_on_a_held_out_split(catalog_dir, tokenizer, vocabularies, tmp_path, capsys):
    model_dir = _model("madral", tokenizer, vocabularies).save(tmp_path / "m")
    out = tmp_path / "report.json"
    assert main([str(model_dir), "--catalog", str(catalog_dir), "--check", "test", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    loaded = BiEncoder.load(model_dir)
    assert loaded.calibration is not None and "split dev" in loaded.calibration.fitted_on
    for key, r in report["fit"].items():
        side, aspect = key.split("/", 1)
        assert r["temperature"] == pytest.approx(loaded.calibration.temperature(side, aspect))
        assert r["nll_after"] <= r["nll_before"]
        assert r["confident_at"] == 0.7 and 0.0 <= r["confident_share"] <= 1.0
    assert set(report["check"]) <= set(report["fit"]) and report["check"]
    assert all(r["items"] > 0 for r in report["check"].values())
    printed = capsys.readouterr().out
    assert "fitted on" in printed and "held out: split test" in printed


def test_cli_refuses_a_model_without_aspects(catalog_dir, tokenizer, tmp_path, capsys):
    model_dir = _model("bibert", tokenizer, None).save(tmp_path / "b")
    assert main([str(model_dir), "--catalog", str(catalog_dir)]) == 2
    assert "predicts no aspect values" in capsys.readouterr().err
    assert not (model_dir / CALIBRATION_FILE).exists()


def test_experiment_calibrates_aspect_models_only(catalog, tokenizer, vocabularies):
    madral = _model("madral", tokenizer, vocabularies)
    report = calibrate_on_dev(madral, catalog)
    assert madral.calibration is not None and report
    assert {k.split("/")[0] for k in report} == {"query", "doc"}
    bibert = _model("bibert", tokenizer, vocabularies)
    assert calibrate_on_dev(bibert, catalog) == {} and bibert.calibration is None
