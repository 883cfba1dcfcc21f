"""MURAL's protocol (paper 001): dot product and one shared encoder by default (Eq. 10, Sec. 5.3.1), one config
(`configs/mural_paper.yaml`: pretraining L_MLM + lambda L_A, Eq. 9, then L_SCE with one hard negative, Eq. 10),
and the in-process trainer and the Ray Train stage module computing the same losses and gradients from it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from madr.config import ExperimentConfig, ModelConfig, StageConfig, from_dict, load_config
from madr.modeling.model import build_model
from madr.training.loop import CatalogSampler, finetune_step, pretrain_step, train_stage
from madr.training.stage_module import StageModule
from pipelines.train.engine import DDPEngine
from pipelines.train.examples import decode_batch

PAPER_CONFIG = Path(__file__).resolve().parents[4] / "configs" / "mural_paper.yaml"
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}
BATCH = 8
SAMPLER_SEED, MASK_SEED = 3, 11


def _paper_cfg(**stage_changes: object) -> ExperimentConfig:
    """The paper config with a tiny dropout-free backbone and short inputs (the protocol fields untouched)."""
    cfg = load_config(PAPER_CONFIG, {"model.backbone.tiny": TINY, "model.max_query_length": 16,
                                     "model.max_doc_length": 32})
    for kind in ("pretrain", "finetune"):
        stage = getattr(cfg.train, kind)
        setattr(cfg.train, kind, dataclasses.replace(stage, batch_size=BATCH, steps=1, **stage_changes))
    return cfg


def _model(cfg: ExperimentConfig, tokenizer, vocabularies):
    torch.manual_seed(0)
    return build_model(cfg.model, tokenizer, vocabularies)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}


def _assert_same_grads(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str,
                       rtol: float = 1e-6, atol: float = 1e-9) -> None:
    """Default tolerance: both paths run the same float32 kernels in the same order (equal to the bit on the
    dev machine); the margin is a few float32 ulps."""
    assert ref and set(ours) == set(ref), f"{what}: different parameters got gradients"
    for k, g in ref.items():
        torch.testing.assert_close(ours[k], g, rtol=rtol, atol=atol, msg=f"{what}: {k} differs")


def _pretrain_rows(catalog) -> dict[str, np.ndarray]:
    """The rows the Ray job streams for the pretraining batch the in-process sampler draws."""
    queries, products = CatalogSampler(catalog, seed=SAMPLER_SEED).pretrain_batch(BATCH)
    return {"row_id": np.arange(BATCH), "query": np.array([q.text for q in queries], dtype=object),
            "query_aspects": np.array([json.dumps(q.aspects) for q in queries], dtype=object),
            "doc": np.array([catalog.product_text(p) for p in products], dtype=object),
            "doc_aspects": np.array([json.dumps(p.aspects) for p in products], dtype=object)}


def _finetune_rows(catalog) -> dict[str, np.ndarray]:
    """The rows the Ray job streams for the fine-tuning batch the in-process sampler draws."""
    examples = CatalogSampler(catalog, seed=SAMPLER_SEED).finetune_batch(BATCH)
    cols = {"row_id": np.arange(BATCH), "negative_relevance": np.array([e.negative_relevance for e in examples])}
    for name in ("query", "positive", "negative"):
        cols[name] = np.array([getattr(e, name) for e in examples], dtype=object)
        cols[f"{name}_aspects"] = np.array([json.dumps(getattr(e, f"{name}_aspects")) for e in examples], dtype=object)
    return cols


def _ray_engine(kind: str, stage: StageConfig, model) -> DDPEngine:
    module = StageModule(kind, stage, model)
    return DDPEngine(module, stage, torch.device("cpu"))


def test_mural_defaults_are_dot_product_and_one_shared_encoder(tokenizer, vocabularies):
    for name in ("mur", "mural"):
        cfg = ModelConfig(name=name)
        assert (cfg.similarity, cfg.shared_towers) == ("dot", True), f"{name}: paper 001 Eq. 10 / Sec. 5.3.1"
        loaded = load_config(None, {"model.name": name}).model
        assert (loaded.similarity, loaded.shared_towers) == ("dot", True), "a YAML naming the model gets its defaults"
    for name in ("bibert", "madral"):
        assert (ModelConfig(name=name).similarity, ModelConfig(name=name).shared_towers) == ("cosine", False)
    explicit = ModelConfig(name="mural", similarity="cosine", shared_towers=False)
    assert (explicit.similarity, explicit.shared_towers) == ("cosine", False), "an explicit value wins"
    cfg = ModelConfig(name="mural", backbone=dataclasses.replace(ModelConfig().backbone, tiny=TINY),
                      max_query_length=16, max_doc_length=32)
    assert from_dict(ModelConfig, dataclasses.asdict(cfg)) == cfg, "a saved config reloads unchanged"
    model = build_model(cfg, tokenizer, vocabularies)
    assert model.doc_tower is model.query_tower, "one encoder for queries and items"
    q, d = torch.randn(3, 32), torch.randn(4, 32)
    torch.testing.assert_close(model.similarity(q, d), q @ d.T, msg="MURAL scores by dot product, unnormalised")


def test_paper_config_is_paper_001_protocol():
    cfg = load_config(PAPER_CONFIG)
    m, pre, fin = cfg.model, cfg.train.pretrain, cfg.train.finetune
    assert m.name == "mural" and m.similarity == "dot" and m.shared_towers
    assert pre.steps > 0 and pre.aspect_weight == pytest.approx(0.1), "Eq. 9 with lambda = 0.1 (Sec. 5.3.1)"
    assert fin.steps > 0 and fin.aspect_weight == 0 and fin.pointwise_weight == 0, "Eq. 10: L_SCE only"
    assert fin.hard_negatives == 1, "Sec. 5.3.2: one hard negative besides the in-batch negatives"


def test_pretrain_step_in_process_equals_ray_stage(catalog, tokenizer, vocabularies):
    """Eq. 9 (L_MLM + 0.1 L_A on queries and items) from the paper config: `madr.training.loop.pretrain_step` and the
    training job's StageModule (rows decoded as the workers decode them, same masking seed) agree."""
    cfg = _paper_cfg()
    stage = cfg.train.pretrain
    ours = _model(cfg, tokenizer, vocabularies)
    ref = pretrain_step(ours, CatalogSampler(catalog, seed=SAMPLER_SEED), stage,
                        torch.Generator().manual_seed(MASK_SEED))
    ref.total.backward()
    p = ref.parts
    assert p["query_aspect"] > 0 and p["doc_aspect"] > 0, p
    assert p["loss"] == pytest.approx(p["query_mlm"] + p["doc_mlm"] + 0.1 * (p["query_aspect"] + p["doc_aspect"]),
                                      rel=1e-5), "Eq. 9 with lambda = 0.1"
    model = _model(cfg, tokenizer, vocabularies)
    engine = _ray_engine("pretrain", stage, model)
    parts = engine.accumulate([decode_batch("pretrain", _pretrain_rows(catalog), model, seed=MASK_SEED)], step=0)
    for key in ("loss", "query_mlm", "doc_mlm", "query_aspect", "doc_aspect"):
        assert parts[key] == pytest.approx(p[key], rel=1e-5), key
    _assert_same_grads(_grads(model), _grads(ours), "pretrain")


@pytest.mark.parametrize("aspect_weight", [0.0, 0.1], ids=["eq10", "eq10+aspect"])
def test_finetune_step_in_process_equals_ray_stage(catalog, tokenizer, vocabularies, aspect_weight):
    """Eq. 10 (dot-product in-batch softmax + one hard negative, shared encoder) from the paper config, and with
    the optional lambda L_A at fine-tuning: the Ray stage accepts what the in-process trainer accepts, with the
    same loss and gradients."""
    cfg = _paper_cfg(aspect_weight=aspect_weight)
    stage = cfg.train.finetune
    ours = _model(cfg, tokenizer, vocabularies)
    module = StageModule("finetune", stage, ours, gather=False)
    ref = finetune_step(module, CatalogSampler(catalog, seed=SAMPLER_SEED), stage, step=0)
    ref.total.backward()
    expected = {"sce", "loss"} | ({"query_aspect", "doc_aspect"} if aspect_weight else set())
    assert set(ref.parts) == expected, ref.parts
    model = _model(cfg, tokenizer, vocabularies)
    engine = _ray_engine("finetune", stage, model)
    parts = engine.accumulate([decode_batch("finetune", _finetune_rows(catalog), model)], step=0)
    assert expected <= set(parts), parts
    for key in expected:
        assert parts[key] == pytest.approx(ref.parts[key], rel=1e-5), key
    _assert_same_grads(_grads(model), _grads(ours), f"finetune (aspect weight {aspect_weight})")


def test_gradcache_step_with_mural_aspect_loss_equals_plain_step(catalog, tokenizer, vocabularies):
    """MURAL's fine-tuning L_A through GradCache (chunks of 3 of 8 rows): the value scores h . E_a^g are cached
    representations like the embeddings, and the step's gradients are plain backprop's. In float64: in float32
    the [CLS] / position-0 embedding rows, which sum every row's LayerNorm backward, differ by up to ~0.3% of their
    norm between the two summation orders (the same for L_SCE alone), while in float64 the two agree to ~1e-12."""
    grads, parts = {}, {}
    for chunk in (0, 3):
        cfg = _paper_cfg(aspect_weight=0.1, gradcache_chunk=chunk)
        model = _model(cfg, tokenizer, vocabularies).double()
        engine = _ray_engine("finetune", cfg.train.finetune, model)
        parts[chunk] = engine.accumulate([decode_batch("finetune", _finetune_rows(catalog), model)], step=0)
        grads[chunk] = _grads(model)
    assert parts[3]["query_aspect"] == pytest.approx(parts[0]["query_aspect"], rel=1e-12)
    assert parts[3]["loss"] == pytest.approx(parts[0]["loss"], rel=1e-6), "float32 loss terms (StageModule casts)"
    _assert_same_grads(grads[3], grads[0], "GradCache vs plain backprop", rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["pretrain", "finetune"])
def test_one_optimiser_step_in_process_equals_ray_stage(catalog, tokenizer, vocabularies, kind):
    """`madr.training.loop.train_stage` and the job's engine (AdamW, warm-up schedule, clipping to norm 1) leave the
    same weights after one step of the paper config's stage."""
    cfg = _paper_cfg()
    stage = getattr(cfg.train, kind)
    ours = _model(cfg, tokenizer, vocabularies)
    train_stage(ours, CatalogSampler(catalog, seed=SAMPLER_SEED), stage, kind, seed=MASK_SEED, progress=False)
    model = _model(cfg, tokenizer, vocabularies)
    rows = _pretrain_rows(catalog) if kind == "pretrain" else _finetune_rows(catalog)
    torch.manual_seed(MASK_SEED)
    _ray_engine(kind, stage, model).train_step([decode_batch(kind, rows, model, seed=MASK_SEED)], step=0)
    start = _model(cfg, tokenizer, vocabularies).state_dict()
    after, ref = model.state_dict(), ours.state_dict()
    moved = [k for k in ref if not torch.equal(ref[k], start[k])]
    assert moved, "the in-process step changed nothing"
    for k in ref:
        torch.testing.assert_close(after[k], ref[k], rtol=1e-6, atol=1e-9, msg=f"{kind}: {k} differs after one step")
