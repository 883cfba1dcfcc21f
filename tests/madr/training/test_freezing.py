"""`freeze_backbone`: the frozen weights get no gradient and do not move in a training step; the others do."""

from __future__ import annotations

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.batching import make_batch
from madr.modeling.model import build_model
from madr.training.freezing import freeze_backbone


def _model(tokenizer, shared: bool):
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", shared_towers=shared, backbone=BackboneConfig(
        tiny={"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 64,
              "max_position_embeddings": 64}), max_query_length=16, max_doc_length=16)
    return build_model(cfg, tokenizer, None)


@pytest.mark.parametrize("shared", [True, False])
def test_frozen_layers_get_no_gradient_and_stay(tokenizer, shared):
    model = _model(tokenizer, shared)
    n = freeze_backbone(model, word_embeddings=True, layers=2)
    bb = model.query_tower.backbone
    expected = sum(p.numel() for p in bb.embeddings.parameters()) + sum(
        p.numel() for block in bb.encoder.layer[:2] for p in block.parameters())
    assert n == expected * len(model.towers())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    q = make_batch(model, ["red nike socks", "white drill"], "query")
    d = make_batch(model, ["nike socks red", "cordless drill white"], "doc")
    qv = model.encode(q.input_ids, q.attention_mask, "query").embedding
    dv = model.encode(d.input_ids, d.attention_mask, "doc").embedding
    torch.nn.functional.cross_entropy(qv @ dv.T, torch.arange(2)).backward()
    opt.step()
    after = model.state_dict()
    for name, p in model.named_parameters():
        if ".backbone.embeddings." not in name and ".backbone.encoder." not in name:
            continue  # heads the loss does not reach (MLM head, pooler)
        moved = not torch.equal(before[name], after[name])
        frozen = ".embeddings." in name or any(f".encoder.layer.{i}." in name for i in range(2))
        assert (p.grad is None) == frozen, name
        assert not (frozen and moved), name


def test_word_embeddings_only_and_too_many_layers(tokenizer):
    model = _model(tokenizer, True)
    emb = model.query_tower.backbone.get_input_embeddings().weight
    assert freeze_backbone(model, word_embeddings=True, layers=0) == emb.numel()
    assert freeze_backbone(model, word_embeddings=True, layers=0) == 0  # already frozen
    with pytest.raises(ValueError, match="cannot freeze 4 layers of a 3-layer backbone"):
        freeze_backbone(model, word_embeddings=False, layers=4)


def test_a_stage_freezes_what_its_config_names_and_only_while_it_runs(catalog, tokenizer):
    """`train.<stage>.freeze_word_embeddings` / `freeze_layers` hold in the in-process loop for that stage; the
    next stage trains everything again."""
    from madr.config import StageConfig
    from madr.training.loop import CatalogSampler, train_stage

    model = _model(tokenizer, shared=False)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    sampler = CatalogSampler(catalog, "train", seed=0)
    stage = StageConfig(steps=3, batch_size=8, learning_rate=1e-2, aspect_weight=0.0, log_every=1,
                        freeze_word_embeddings=True, freeze_layers=1)
    train_stage(model, sampler, stage, "finetune", progress=False)
    after = model.state_dict()
    frozen = [k for k in after if ".backbone.embeddings." in k or ".backbone.encoder.layer.0." in k]
    moved = [k for k in after if ".backbone.encoder.layer.2." in k]
    assert all(torch.equal(after[k], start[k]) for k in frozen)
    assert any(not torch.equal(after[k], start[k]) for k in moved)
    assert all(p.requires_grad for p in model.parameters()), "the flags must come back after the stage"


def test_a_stage_that_keeps_the_backbone_trains_the_heads_alone(catalog, tokenizer, vocabularies):
    """`freeze_backbone` + `freeze_params`: an aspect model's pretraining moves its heads only; the backbone and the
    named weights (MADRAL's W^V) stay, in the in-process loop and for good with `freeze_stage` (the distributed
    job's model is built for one stage)."""
    from madr.config import StageConfig
    from madr.training.freezing import freeze_stage, stage_frozen_parameters
    from madr.training.loop import CatalogSampler, train_stage

    torch.manual_seed(0)
    tiny = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
            "max_position_embeddings": 64}
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=tiny), aspects=catalog.aspect_names,
                      max_query_length=16, max_doc_length=16)
    model = build_model(cfg, tokenizer, vocabularies)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    stage = StageConfig(steps=3, batch_size=8, learning_rate=1e-2, mlm_weight=0.0, log_every=1,
                        freeze_backbone=True, freeze_params=["aen.w_v"])
    train_stage(model, CatalogSampler(catalog, "train", seed=0), stage, "pretrain", progress=False)
    after = model.state_dict()
    kept = [k for k in after if ".backbone." in k or "aen.w_v" in k]
    heads = [k for k in after if k not in kept]
    assert kept and heads and all(torch.equal(after[k], start[k]) for k in kept)
    assert any(not torch.equal(after[k], start[k]) for k in heads), "no head trained"
    assert all(p.requires_grad for p in model.parameters()), "the flags must come back after the stage"

    n = freeze_stage(model, stage)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {name for name in dict(model.named_parameters()) if ".backbone." in name or "aen.w_v" in name}
    assert n == sum(p.numel() for name, p in model.named_parameters() if name in frozen)
    assert stage_frozen_parameters(model, stage) == [], "already frozen: nothing left to freeze"
