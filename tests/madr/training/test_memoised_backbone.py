"""Cached encodings of a frozen backbone (`madr.training.memoised_backbone`): same outputs as the backbone, one
backbone pass per distinct text, refused while the backbone trains."""

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.modeling.batching import make_batch
from madr.modeling.model import build_model
from madr.training.freezing import backbone_frozen
from madr.training.memoised_backbone import MemoisedBackbone, memoised_backbones
from madr.training.objectives import pretrain_loss

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
    with backbone_frozen(model), memoised_backbones(model) as (memo,):
        assert isinstance(model.doc_tower.backbone, MemoisedBackbone)
        with torch.no_grad():
            first = model.encode(batch.input_ids, batch.attention_mask, "doc")
            # the same texts in another batch (other padding width, other order) are read from the cache
            again = make_batch(model, texts[::-1][:3], "doc", None)
            second = model.encode(again.input_ids, again.attention_mask, "doc")
        assert (memo.misses, memo.hits) == (6, 3)
    assert not isinstance(model.doc_tower.backbone, MemoisedBackbone)  # the real one is back
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
    with backbone_frozen(model), memoised_backbones(model) as (memo,):
        kept = memo(**inputs).last_hidden_state[mask]
        assert backbone.training, "the backbone is back in training mode after the pass"
        model.eval()
        read = memo(**inputs).last_hidden_state[mask]
    assert memo.misses == 4 and memo.hits == 4
    assert torch.allclose(kept, want, atol=2e-3), (kept - want).abs().max()
    assert torch.equal(read, kept)


def test_heads_train_through_a_memoised_backbone(catalog, tokenizer, vocabularies):
    model = _model(tokenizer, vocabularies).train()
    qs, ps = catalog.queries[:6], catalog.products[:6]
    qb = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(model, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    with backbone_frozen(model), memoised_backbones(model):
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
    with backbone_frozen(mural), memoised_backbones(mural), pytest.raises(ValueError, match="MUR"):
        mural.encode(batch.input_ids, batch.attention_mask, "doc")
