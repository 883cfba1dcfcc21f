"""Aspect heads on a frozen BiBERT (`madr.training.aspect_heads`) and the pipeline's aspects stage
(`pipelines.aspect_heads`): the heads learn the annotations, the text vectors (so every ranking) stay exactly the
BiBERT's, the saved model is calibrated and read by the encode job as an aspect model, and wrong inputs are refused
with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from madr.config import (
    AspectHeadsConfig,
    BackboneConfig,
    ExperimentConfig,
    IndexConfig,
    ModelConfig,
    StageConfig,
    TrainConfig,
)
from madr.layout import RunLayout, mark_prepared
from madr.modeling.model import BiEncoder, build_model
from madr.recipes.aspects.calibration import dev_texts
from madr.recipes.aspects.evaluation import phrase_logits
from madr.training.aspect_heads import FrozenVectors, train_aspect_heads, with_aspect_heads
from pipelines.aspect_heads import main, run_aspect_heads
from pipelines.encode.resume import model_aspects

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _model_config(name: str, aspects: list[str]) -> ModelConfig:
    return ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), aspects=aspects,
                       pooling="mean" if name == "bibert" else "cls", shared_towers=True, max_query_length=16,
                       max_doc_length=48)


@pytest.fixture(scope="module")
def bibert_dir(catalog, tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    return build_model(_model_config("bibert", catalog.aspect_names), tokenizer).save(tmp_path_factory.mktemp("b"))


def _vectors(model: BiEncoder, catalog) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [catalog.product_text(p) for p in catalog.products[:64]]
    return model.encode_texts([q.text for q in catalog.queries[:64]], "query"), model.encode_texts(texts, "doc")


def test_heads_learn_the_annotations_and_leave_every_vector_as_it_was(bibert_dir, catalog, vocabularies, tmp_path):
    bibert = BiEncoder.load(bibert_dir).eval()
    model = with_aspect_heads(bibert_dir, vocabularies).eval()
    assert model.config.name == "mtbert" and model.predicts_aspect_values
    texts, annotations = dev_texts(catalog, "train")
    report = train_aspect_heads(model, texts, annotations, AspectHeadsConfig(epochs=40, learning_rate=5e-2))
    assert set(report) == set(catalog.aspect_names)
    for key, r in report.items():
        assert r["items"] > 0 and r["loss_after"] < 0.8 * r["loss_before"], key
    for before, after in zip(_vectors(bibert, catalog), _vectors(model.eval(), catalog), strict=True):
        assert torch.equal(before, after)  # the ranking is the BiBERT's, exactly
    saved = model.save(tmp_path / "m")
    values, calibrated = model_aspects(str(saved))  # what the encode job stores per product
    assert set(values) == set(catalog.aspect_names) and not calibrated
    loaded = BiEncoder.load(saved).eval()
    enc = loaded.tokenize([q.text for q in catalog.queries[:8]], "query")
    with torch.no_grad():
        ours = model.aspect_predictor(model.encode(enc["input_ids"], enc["attention_mask"], "query").aspect_repr)
        theirs = loaded.aspect_predictor(loaded.encode(enc["input_ids"], enc["attention_mask"], "query").aspect_repr)
    assert all(torch.allclose(ours[k], theirs[k]) for k in ours)


def test_frozen_vectors_encode_each_distinct_text_once_and_give_the_models_logits(bibert_dir, catalog,
                                                                                   vocabularies, monkeypatch):
    model = with_aspect_heads(bibert_dir, vocabularies).eval()
    encoded: list[int] = []
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda ids, mask, side: encoded.append(len(ids)) or encode(ids, mask, side))
    vectors = FrozenVectors(model, batch_size=16)
    queries = [q.text for q in catalog.queries[:40]]
    vectors.add(queries + queries[:10], "query")
    first = len(set(queries))
    assert sum(encoded) == first  # distinct texts only
    again = vectors(list(reversed(queries)) + ["a text not seen yet"], "query")
    assert sum(encoded) == first + 1  # only the new one
    monkeypatch.undo()
    direct = phrase_logits(model, queries, "query")
    held = vectors.phrase_logits(queries, "query")
    assert set(held) == set(direct) == set(catalog.aspect_names)
    for key in direct:  # longest-first batches pad differently: equal up to float rounding
        assert torch.allclose(held[key], direct[key], atol=1e-5), key
    assert next(iter(again.values())).shape[0] == len(queries) + 1


def test_only_a_bibert_with_aspects_gets_heads(catalog, tokenizer, vocabularies, tmp_path):
    madral = build_model(_model_config("madral", catalog.aspect_names), tokenizer, vocabularies).save(tmp_path / "a")
    with pytest.raises(ValueError, match="a madral model; aspect heads on a frozen encoder are for bibert"):
        with_aspect_heads(madral, vocabularies)
    bare = build_model(_model_config("bibert", []), tokenizer).save(tmp_path / "b")
    with pytest.raises(ValueError, match="model.aspects is empty"):
        with_aspect_heads(bare, vocabularies)


def test_config_refuses_heads_without_a_bibert_and_an_index_of_a_stage_that_does_not_run():
    heads = TrainConfig(aspects=AspectHeadsConfig(epochs=3))
    with pytest.raises(ValueError, match="model.name is 'madral': aspect heads on a frozen encoder are for bibert"):
        ExperimentConfig(model=ModelConfig(name="madral"), train=heads)
    with pytest.raises(ValueError, match="index.model_stage is aspects, but train.aspects.epochs is 0"):
        ExperimentConfig(model=ModelConfig(name="bibert"), index=IndexConfig(model_stage="aspects"))
    with pytest.raises(ValueError, match="train.finetune.steps is 0; set train.aspects.init_from"):
        ExperimentConfig(model=ModelConfig(name="bibert"), train=TrainConfig(
            finetune=StageConfig(steps=0), aspects=AspectHeadsConfig(epochs=3)))
    with pytest.raises(ValueError, match="train.aspects.learning_rate must be > 0"):
        AspectHeadsConfig(epochs=1, learning_rate=0)


def test_stage_saves_a_calibrated_model_the_encode_job_reads_as_an_aspect_model(bibert_dir, catalog, vocabularies,
                                                                               tmp_path, capsys):
    cfg = ExperimentConfig(output_dir=str(tmp_path / "run"), model=_model_config("bibert", catalog.aspect_names),
                           train=TrainConfig(aspects=AspectHeadsConfig(epochs=20, learning_rate=5e-2)),
                           index=IndexConfig(model_stage="aspects"))
    layout = RunLayout.of(cfg)
    catalog.write(layout.catalog)
    mark_prepared(cfg, {"products": len(catalog.products)})
    vocabularies.save(layout.vocab)
    with pytest.raises(ValueError, match="not a madr model directory"):  # no fine-tune export yet
        run_aspect_heads(cfg, log=lambda *_: None)
    BiEncoder.load(bibert_dir).save(layout.model("finetune"))
    lines: list[str] = []
    result = run_aspect_heads(cfg, log=lines.append)
    assert any("texts encoded" in line for line in lines)  # long work shows its progress
    saved = layout.model("aspects")
    assert json.loads((saved.parent / "result.json").read_text()) == json.loads(json.dumps(result))
    assert "split dev" in result["calibration"]["fitted_on"]
    assert {k.split("/")[0] for k in result["calibration"]["report"]} == {"query", "doc"}
    loaded = BiEncoder.load(saved)
    assert loaded.calibration is not None and model_aspects(str(saved))[1]  # calibrated, as /explain reports it
    for before, after in zip(_vectors(BiEncoder.load(bibert_dir).eval(), catalog), _vectors(loaded.eval(), catalog),
                             strict=True):
        assert torch.equal(before, after)
    config = tmp_path / "cfg.yaml"
    cfg.train.aspects.epochs = 0
    config.write_text(json.dumps(cfg.to_dict() | {"index": cfg.to_dict()["index"] | {"model_stage": "finetune"}}))
    assert main(["--config", str(config)]) == 1
    assert "train.aspects.epochs is 0" in capsys.readouterr().err


def test_the_saved_backbones_are_read_once_per_tower(bibert_dir, vocabularies, monkeypatch):
    import madr.modeling.model as model_module

    reads: list[str] = []
    load = model_module.load_pretrained_backbone
    monkeypatch.setattr(model_module, "load_pretrained_backbone", lambda path, *a, **k: reads.append(path) or load(
        path, *a, **k))
    model = with_aspect_heads(bibert_dir, vocabularies)
    assert reads and len(reads) == len(set(reads)) == len(model.towers()), reads
