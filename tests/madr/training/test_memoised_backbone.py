"""Cached encodings of a frozen backbone (`madr.training.memoised_backbone`): same outputs as the backbone, one
backbone pass per distinct text, refused while the backbone trains; the model's weights and state-dict keys stay
as they are; `train.<stage>.memoise_backbone` turns it on for a stage."""

import copy

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig, load_config
from madr.modeling.batching import make_batch
from madr.modeling.model import build_model
from madr.training.freezing import stage_frozen
from madr.training.loop import CatalogSampler, train_stage
from madr.training.memoised_backbone import (
    MemoisedBackbone,
    memo_stats,
    memoise_backbones,
    memoised_backbones,
)
from madr.training.objectives import pretrain_loss

FROZEN = StageConfig(freeze_backbone=True)
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _model(tokenizer, vocabularies, name="madral"):
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48,
                      shared_towers=True)
    return build_model(cfg, tokenizer, vocabularies).eval()


def test_memoised_outputs_equal_the_backbone_and_run_it_once_per_text(catalog, tokenizer, vocabularies):
    model = _model(tokenizer, vocabularies)
    texts = [catalog.product_text(p) for p in catalog.products[:6]]
    batch = make_batch(model, texts, "doc", [p.aspects for p in catalog.products[:6]])
    with torch.no_grad():
        want = model.encode(batch.input_ids, batch.attention_mask, "doc")
    with stage_frozen(model, FROZEN), memoised_backbones(model) as (memo,):
        assert isinstance(model.doc_tower.backbone.forward, MemoisedBackbone)
        assert model.query_tower.backbone.forward is memo  # shared towers: one memo
        with torch.no_grad():
            first = model.encode(batch.input_ids, batch.attention_mask, "doc")
            # the same texts in another batch (other padding width, other order) are read from the cache
            again = make_batch(model, texts[::-1][:3], "doc", None)
            second = model.encode(again.input_ids, again.attention_mask, "doc")
        assert (memo.misses, memo.hits) == (6, 3)
    assert not isinstance(model.doc_tower.backbone.forward, MemoisedBackbone)  # its own forward is back
    assert torch.allclose(first.embedding, want.embedding, atol=2e-3)
    for key in want.aspect_logits:
        assert torch.allclose(first.aspect_logits[key], want.aspect_logits[key], atol=2e-3)
    assert torch.allclose(second.embedding, want.embedding.flip(0)[:3], atol=2e-3)
    assert all(p.requires_grad for p in model.doc_tower.backbone.parameters())  # unfrozen on exit


def test_a_state_kept_while_training_is_the_eval_state(catalog, tokenizer, vocabularies):
    """No dropout draw is kept: the first visit in training mode keeps the backbone's eval-mode states, which
    a later evaluation (a dev point of a learning curve) reads back; the backbone keeps its mode."""
    model = _model(tokenizer, vocabularies)
    backbone = model.doc_tower.backbone
    assert backbone.config.hidden_dropout_prob > 0, "the check needs a backbone with dropout"
    batch = make_batch(model, [catalog.product_text(p) for p in catalog.products[:4]], "doc", None)
    mask = batch.attention_mask.bool()
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    with torch.no_grad():
        want = backbone(**inputs).last_hidden_state[mask]
    model.train()
    with stage_frozen(model, FROZEN), memoised_backbones(model) as (memo,):
        kept = model.doc_tower.backbone(**inputs).last_hidden_state[mask]
        assert backbone.training, "the backbone is back in training mode after the pass"
        model.eval()
        read = model.doc_tower.backbone(**inputs).last_hidden_state[mask]
    assert memo.misses == 4 and memo.hits == 4
    assert torch.allclose(kept, want, atol=2e-3), (kept - want).abs().max()
    assert torch.equal(read, kept)


def test_heads_train_through_a_memoised_backbone(catalog, tokenizer, vocabularies):
    model = _model(tokenizer, vocabularies).train()
    qs, ps = catalog.queries[:6], catalog.products[:6]
    qb = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(model, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    with stage_frozen(model, FROZEN), memoised_backbones(model):
        loss = pretrain_loss(model, qb, pb, StageConfig(aspect_weight=1.0, mlm_weight=0.0))
        loss.total.backward()
    assert model.doc_tower.head.aen.queries.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.doc_tower.backbone.parameters())


def test_refuses_a_training_backbone_and_aspect_token_models(catalog, tokenizer, vocabularies):
    model = _model(tokenizer, vocabularies)
    with pytest.raises(ValueError, match="requires grad"), memoised_backbones(model):
        pass
    mural = _model(tokenizer, vocabularies, name="mural")
    batch = make_batch(mural, [catalog.product_text(p) for p in catalog.products[:2]], "doc", None)
    with stage_frozen(mural, FROZEN), memoised_backbones(mural), pytest.raises(ValueError, match="MUR"):
        mural.encode(batch.input_ids, batch.attention_mask, "doc")


def test_the_model_keeps_its_weights_and_keys_while_memoised(catalog, tokenizer, vocabularies, tmp_path):
    """What a checkpoint, an export, DDP or DeepSpeed sees is the real backbone: the same state-dict keys and
    tensors; a saved model loads and encodes as the live one; a deep copy gets its own empty memo."""
    model = _model(tokenizer, vocabularies)
    keys = list(model.state_dict())
    batch = make_batch(model, [catalog.product_text(p) for p in catalog.products[:3]], "doc", None)
    with stage_frozen(model, FROZEN), memoised_backbones(model) as (memo,):
        with torch.no_grad():
            live = model.encode(batch.input_ids, batch.attention_mask, "doc").embedding
        assert list(model.state_dict()) == keys
        model.save(tmp_path / "m")
        twin = copy.deepcopy(model)
        twin_memo = twin.doc_tower.backbone.forward
        assert isinstance(twin_memo, MemoisedBackbone) and twin_memo is not memo and not twin_memo.states
        assert twin_memo.backbone is twin.doc_tower.backbone and len(memo.states) == 3
    loaded = type(model).load(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.allclose(loaded.encode(batch.input_ids, batch.attention_mask, "doc").embedding, live, atol=2e-3)


def test_states_past_the_memory_bound_are_computed_again(catalog, tokenizer, vocabularies):
    """`max_bytes`: the memo keeps what fits and runs the backbone for the rest; outputs are the same."""
    model = _model(tokenizer, vocabularies)
    texts = [catalog.product_text(p) for p in catalog.products[:4]]
    batch = make_batch(model, texts, "doc", None)
    with torch.no_grad():
        want = model.encode(batch.input_ids, batch.attention_mask, "doc").embedding
    with stage_frozen(model, FROZEN):
        first_row = int(batch.attention_mask[0].sum()) * TINY["hidden_size"] * 2  # fp16 bytes of row 0
        (memo,) = memoise_backbones(model, max_bytes=first_row)
        with torch.no_grad():
            for _ in range(2):
                got = model.encode(batch.input_ids, batch.attention_mask, "doc").embedding
                assert torch.allclose(got, want, atol=2e-3)
        assert len(memo.states) == 1 and memo.kept_bytes == first_row
        assert (memo.hits, memo.misses) == (1, 7)
        assert memo_stats(model) == {"memo_hits": 1.0, "memo_misses": 7.0, "memo_gib": first_row / 2**30}


def test_a_stage_with_memoise_backbone_runs_the_backbone_once_per_text(catalog, tokenizer, vocabularies):
    """`train.<stage>.memoise_backbone`: in `train_stage` the backbone's layers see each distinct text once;
    without it they see every row of every step; the heads train either way and the backbone is restored."""
    seen = {}
    for memoise in (False, True):
        model = _model(tokenizer, vocabularies)
        rows = []
        model.doc_tower.backbone.encoder.register_forward_hook(lambda m, i, o, rows=rows: rows.append(o[0].shape[0]))
        stage = StageConfig(steps=4, batch_size=8, learning_rate=1e-2, mlm_weight=0.0, log_every=1,
                            freeze_backbone=True, memoise_backbone=memoise)
        train_stage(model, CatalogSampler(catalog, "train", seed=0), stage, "pretrain", progress=False)
        seen[memoise] = sum(rows)
        assert not isinstance(model.doc_tower.backbone.__dict__.get("forward"), MemoisedBackbone)
    assert seen[False] >= 4 * 8 * 2  # queries and products of every step
    assert 0 < seen[True] < seen[False]


def test_memoise_backbone_is_refused_where_the_states_could_change():
    with pytest.raises(ValueError, match="memoise_backbone needs train.<stage>.freeze_backbone"):
        StageConfig(memoise_backbone=True)
    with pytest.raises(ValueError, match="memoise_backbone cannot hold for mural"):
        load_config(None, {"model.name": "mural", "train.pretrain.freeze_backbone": True,
                           "train.pretrain.memoise_backbone": True})
    cfg = load_config(None, {"model.name": "madral", "train.pretrain.freeze_backbone": True,
                             "train.pretrain.memoise_backbone": True})
    assert cfg.train.pretrain.memoise_backbone
