"""Temperature scaling of the aspect confidences: the fit recovers a known temperature, brings confidence to
accuracy on an underconfident model, leaves the top value alone, and travels with a saved model to `/explain`."""

from __future__ import annotations

import json

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.calibration import (
    CALIBRATION_FILE,
    AspectCalibration,
    correct_top,
    expected_calibration_error,
    fit_temperature,
    top_confidence,
)
from madr.modeling.explain import explain_pair
from madr.modeling.model import BiEncoder, build_model
from madr.recipes.aspects.calibration import calibrate, dev_texts
from madr.recipes.aspects.evaluation import phrase_logits

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _sampled(n: int, v: int, scale: float, temperature: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and one label per row drawn from softmax(logits / temperature): T is the calibrating one."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=g) * scale
    labels = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)
    return logits, labels


@pytest.mark.parametrize("true_t", [0.05, 0.5, 4.0])
def test_fit_recovers_the_generating_temperature(true_t):
    logits, labels = _sampled(6000, 40, 3.0 * true_t if true_t < 1 else 3.0, true_t)
    assert fit_temperature(logits, labels) == pytest.approx(true_t, rel=0.1)


def test_underconfident_model_gets_confidence_near_its_accuracy():
    logits, labels = _sampled(5000, 2000, 0.02, 0.004, seed=1)  # right often, with near-uniform softmax
    has, right = correct_top(logits, labels)
    before, top_before = top_confidence(logits)
    t = fit_temperature(logits, labels)
    after, top_after = top_confidence(logits, t)
    acc = float(right.float().mean())
    assert t < 0.1 and float(before.mean()) < 0.01 < acc
    assert torch.equal(top_before, top_after)  # the ranking, hence Accuracy@1, is untouched
    assert float(after.mean()) == pytest.approx(acc, abs=0.05)
    assert expected_calibration_error(after, right) < 0.05 < expected_calibration_error(before, right)


def test_multi_label_rows_and_padding():
    logits = torch.tensor([[4.0, 3.0, 0.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    labels = torch.tensor([[1, 0], [1, -1], [-1, -1]])
    has, right = correct_top(logits, labels)
    assert has.tolist() == [True, True, False] and right.tolist() == [True, False, False]
    with pytest.raises(ValueError, match="no row has a label"):
        fit_temperature(logits[2:], labels[2:])


def test_expected_calibration_error_values():
    conf = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.3, 0.3])
    correct = torch.tensor([True, True, True, True, False, True])
    # bin 0.9: accuracy 1 vs 0.9 (4/6 of items), bin 0.3: accuracy 0.5 vs 0.3 (2/6)
    assert expected_calibration_error(conf, correct) == pytest.approx(4 / 6 * 0.1 + 2 / 6 * 0.2)


def test_the_filters_share_and_precision_count_only_the_confident_items():
    from madr.recipes.aspects.calibration import confident

    conf = torch.tensor([0.95, 0.8, 0.7, 0.69, 0.2])
    right = torch.tensor([True, False, True, True, False])
    assert confident(conf, right, 0.7) == {"confident_at": 0.7, "confident_share": pytest.approx(3 / 5),
                                           "confident_accuracy@1": pytest.approx(2 / 3)}
    none = confident(conf, right, 0.99)
    assert none["confident_share"] == 0.0 and none["confident_accuracy@1"] is None


def test_calibration_file_round_trip_and_bad_values(tmp_path):
    cal = AspectCalibration({"query": {"brand": 0.05}, "doc": {"brand": 0.1, "color": 2.0}}, "dev: 3 queries")
    cal.save(tmp_path)
    assert AspectCalibration.load(tmp_path) == cal
    assert cal.temperature("query", "color") == 1.0  # not fitted: unchanged softmax
    assert AspectCalibration.load(tmp_path / "nothing") is None
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"temperatures": {"query": {"brand": -1}}}))
    with pytest.raises(ValueError, match=r"aspect_calibration.json: temperatures.query.brand = -1"):
        AspectCalibration.load(tmp_path)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"temperatures": {"title": {}}}))
    with pytest.raises(ValueError, match="sides"):
        AspectCalibration.load(tmp_path)


def test_calibrate_a_model_then_explain_reads_it_after_save_and_load(catalog, tokenizer, vocabularies, tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48)
    model = build_model(cfg, tokenizer, vocabularies).eval()
    texts, annotations = dev_texts(catalog)
    assert texts["query"] and texts["doc"]
    cal, report = calibrate(model, texts, annotations, fitted_on="synthetic dev")
    assert set(cal.temperatures) == {"query", "doc"}
    for key, r in report.items():
        assert r["items"] > 0 and r["temperature"] == cal.temperature(*key.split("/", 1))
        assert r["nll_after"] <= r["nll_before"], key  # what the fit minimises (Eq. 3 on logits / T)

    query, doc = texts["query"][0], texts["doc"][0]
    plain = explain_pair(model, query, doc)
    model.calibration = cal
    path = model.save(tmp_path / "m")
    assert (path / CALIBRATION_FILE).is_file()
    loaded = BiEncoder.load(path).eval()
    assert loaded.calibration == cal
    shown = explain_pair(loaded, query, doc)
    logits = phrase_logits(loaded, [query], "query")
    for before, after in zip(plain["query"]["aspects"], shown["query"]["aspects"], strict=True):
        if "prediction" not in after:
            continue
        key = after["component"]
        expected, _ = top_confidence(logits[key], cal.temperature("query", key))
        assert after["prediction"] == before["prediction"] and after["calibrated"] and not before["calibrated"]
        assert after["confidence"] == pytest.approx(float(expected[0]), rel=1e-5)
    model.calibration = None
    model.save(path)  # saving without a calibration removes the stale file
    assert not (path / CALIBRATION_FILE).exists()


def test_calibrate_needs_an_aspect_model(catalog, tokenizer):
    model = build_model(ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), max_doc_length=48), tokenizer)
    with pytest.raises(ValueError, match="predicts no aspect values"):
        calibrate(model, *dev_texts(catalog))
