"""Combined objectives: OTHER never receives an aspect loss; which terms each model gets."""

import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.modeling.batching import make_batch
from madr.modeling.model import build_model
from madr.training.loop import stage_runs
from madr.training.objectives import LossParts, aspect_loss, pretrain_loss
from madr.training.stage_module import FinetuneBatch, StageModule

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}



def _finetune(model, qb, pb, nb, stage, rel=None, step=0):
    """The fine-tuning objective every training path steps (`StageModule`), on one batch in one process."""
    rel = torch.zeros(len(qb.input_ids)) if rel is None else rel
    total, parts = StageModule("finetune", stage, model, gather=False).loss(FinetuneBatch(qb, pb, nb, rel), step)
    return LossParts(total, parts)

def _model(name, tokenizer, vocabularies, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48, **kw)
    return build_model(cfg, tokenizer, vocabularies)


def test_other_aspect_gets_no_aspect_loss(catalog, tokenizer, vocabularies):
    model = _model("madral", tokenizer, vocabularies, fusion="presence")
    prods = catalog.products[:8]
    batch = make_batch(model, [catalog.product_text(p) for p in prods], "doc", [p.aspects for p in prods])
    out = model.encode(batch.input_ids, batch.attention_mask, "doc")
    assert out.component_names[-1] == "other"
    loss, parts = aspect_loss(model, out, batch, "doc")
    assert {"ap_category", "ap_brand", "ap_color", "app"} <= set(parts), parts
    loss.backward()
    head = model.doc_tower.head
    q_grad = head.aen.queries.grad
    assert q_grad[-1].abs().sum() == 0, "OTHER's aspect query got a gradient from the aspect loss"
    assert q_grad[:-1].abs().sum(-1).min() > 0, "every explicit aspect query should get a gradient"
    p_grad = head.fusion.presence_weight.grad
    assert p_grad[-1].abs().sum() == 0, "OTHER's presence layer got a gradient from the presence loss"
    assert p_grad[:-1].abs().sum() > 0


def test_models_without_aspect_learning_get_zero_aspect_loss(catalog, tokenizer, vocabularies):
    for name in ("madr", "mur", "bibert", "mpbert"):
        model = _model(name, tokenizer, vocabularies)
        prods = catalog.products[:4]
        batch = make_batch(model, [catalog.product_text(p) for p in prods], "doc", [p.aspects for p in prods])
        out = model.encode(batch.input_ids, batch.attention_mask, "doc")
        loss, parts = aspect_loss(model, out, batch, "doc")
        assert float(loss.detach()) == 0.0 and parts == {}, (name, parts)


def test_pretrain_and_finetune_terms(catalog, tokenizer, vocabularies):
    qs, ps = catalog.queries[:6], catalog.products[:6]
    stage = StageConfig(batch_size=6, aspect_weight=0.1)
    model = _model("mural", tokenizer, vocabularies, grouping="granularity")
    qb = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(model, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    pre = pretrain_loss(model, qb, pb, stage, torch.Generator().manual_seed(0))
    assert {"query_mlm", "doc_mlm", "doc_aspect"} <= set(pre.parts), pre.parts
    expected = (pre.parts["query_mlm"] + pre.parts["doc_mlm"]
                + 0.1 * (pre.parts.get("query_aspect", 0.0) + pre.parts["doc_aspect"]))
    assert abs(pre.parts["loss"] - expected) < 1e-4, (pre.parts, expected)
    fin = _finetune(model, qb, pb, None, StageConfig(aspect_weight=0.0, pointwise_weight=0.0))
    assert set(fin.parts) == {"sce", "loss"}, fin.parts  # MURAL Eq. 10: SCE only


def test_aspect_sides_train_aspect_losses_on_one_side_only(catalog, tokenizer, vocabularies):
    """Paper 000 Table 6 MADRAL^-query / ^-doc: the disabled side's aspect labels no longer reach the loss."""
    qs, ps = catalog.queries[:6], catalog.products[:6]
    stage = StageConfig(batch_size=6, aspect_weight=0.5)
    both = _model("madral", tokenizer, vocabularies)
    doc_only = _model("madral", tokenizer, vocabularies, aspect_sides=["doc"])
    qb = make_batch(both, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(both, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    both.eval(), doc_only.eval()  # no dropout: the two losses differ by the query-side aspect terms only
    full, ablated = _finetune(both, qb, pb, None, stage), _finetune(doc_only, qb, pb, None, stage)
    assert any(k.startswith("query_") for k in full.parts) and not any(k.startswith("query_") for k in ablated.parts)
    assert any(k.startswith("doc_ap_") for k in ablated.parts), ablated.parts
    query_terms = sum(v for k, v in full.parts.items() if k.startswith("query_ap_") or k == "query_app")
    assert query_terms > 0 and abs(full.parts["loss"] - ablated.parts["loss"] - 0.5 * query_terms) < 1e-4
    pre = pretrain_loss(doc_only, qb, pb, stage, torch.Generator().manual_seed(0))
    assert "query_mlm" in pre.parts and not any(k.startswith("query_a") for k in pre.parts), pre.parts
    try:
        ModelConfig(aspect_sides=["queries"])
    except ValueError as err:
        assert "model.aspect_sides" in str(err)
    else:
        raise AssertionError("an unknown side must be refused")


def test_aspect_only_pretraining_skips_mlm_and_trains_the_aspects(catalog, tokenizer, vocabularies):
    """`mlm_weight: 0`: no masking and no vocabulary projection (the MLM head gets no gradient), the aspect
    losses alone; a model with nothing else to learn in pretraining skips the stage (`stage_runs`)."""
    qs, ps = catalog.queries[:6], catalog.products[:6]
    stage = StageConfig(batch_size=6, aspect_weight=1.0, mlm_weight=0.0)
    model = _model("madral", tokenizer, vocabularies, fusion="presence")
    qb = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(model, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    pre = pretrain_loss(model, qb, pb, stage, torch.Generator().manual_seed(0))
    assert pre.parts["query_mlm"] == 0.0 and pre.parts["doc_mlm"] == 0.0
    assert pre.parts["doc_ap_category"] > 0 and pre.parts["loss"] > 0
    pre.total.backward()
    tower = model.doc_tower
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in tower.mlm_head.parameters())
    assert tower.head.aen.queries.grad.abs().sum() > 0
    assert stage_runs("pretrain", stage, model.config)
    assert not stage_runs("pretrain", stage, ModelConfig(name="bibert"))  # nothing to learn without L_MLM
    assert stage_runs("pretrain", StageConfig(), ModelConfig(name="bibert"))
    assert not stage_runs("pretrain", StageConfig(), ModelConfig(name="dssm"))
    assert not stage_runs("finetune", StageConfig(steps=0), model.config)
