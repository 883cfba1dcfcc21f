"""Hybrid head (paper 002): term-weight formula, top-k, FLOPS and the interpolation, by hand."""

import math

import pytest
import torch

from madr.batching import make_batch
from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.heads.hybrid import term_weights, top_k_sparsify
from madr.losses import FlopsLoss, FlopsWeightSchedule
from madr.model import BiEncoder, build_model
from madr.objectives import finetune_loss

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def test_term_weights_max_and_sum_pool_by_hand():
    # B=1, L=3 tokens (last is padding), V=4 terms
    logits = torch.tensor([[[1.0, -2.0, 0.0, 3.0],
                            [2.0, 1.0, -1.0, 0.5],
                            [9.0, 9.0, 9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    w = term_weights(logits, mask, "max", excluded_ids=[3])
    expected = torch.tensor([[math.log(3.0), math.log(2.0), 0.0, 0.0]])  # max_i log(1+relu); term 3 excluded
    assert torch.allclose(w, expected), w
    s = term_weights(logits, mask, "sum")
    expected_sum = torch.tensor([[math.log(2.0) + math.log(3.0), math.log(2.0), 0.0, math.log(4.0) + math.log(1.5)]])
    assert torch.allclose(s, expected_sum), s


def test_top_k_keeps_the_k_largest():
    w = torch.tensor([[0.1, 0.5, 0.0, 0.9, 0.3], [1.0, 2.0, 3.0, 4.0, 5.0]])
    out = top_k_sparsify(w, 2)
    assert torch.equal(out, torch.tensor([[0.0, 0.5, 0.0, 0.9, 0.0], [0.0, 0.0, 0.0, 4.0, 5.0]]))
    assert torch.equal(top_k_sparsify(w, None), w)


def test_flops_value_and_warmup_by_hand():
    w = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    # column means: [2, 0, 1] -> FLOPS = 4 + 0 + 1 = 5
    assert float(FlopsLoss()(w)) == pytest.approx(5.0)
    sched = FlopsWeightSchedule(0.1, warmup_steps=10)
    assert sched(0) == 0.0 and sched(5) == pytest.approx(0.025) and sched(20) == pytest.approx(0.1)


@pytest.fixture(scope="module")
def hybrid(tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=16,
                      max_query_length=16, max_doc_length=48, hybrid_lambda=0.3)
    return build_model(cfg, tokenizer)


def test_hybrid_outputs_and_interpolation(hybrid, catalog):
    model = hybrid.eval()
    qb = make_batch(model, [q.text for q in catalog.queries[:3]], "query")
    db = make_batch(model, [catalog.product_text(p) for p in catalog.products[:5]], "doc")
    with torch.no_grad():
        q = model.encode(qb.input_ids, qb.attention_mask, "query")
        d = model.encode(db.input_ids, db.attention_mask, "doc")
    assert q.sparse.shape == (3, len(model.tokenizer))
    assert int((q.sparse > 0).sum(-1).max()) <= 16, "top-k sparsification"
    assert torch.all(q.sparse[:, model.tokenizer.all_special_ids] == 0), "special tokens are excluded"
    dense, sparse = q.embedding @ d.embedding.T, q.sparse @ d.sparse.T
    assert torch.allclose(model.hybrid_scores(q, d, 1.0), dense)
    assert torch.allclose(model.hybrid_scores(q, d, 0.0), sparse)
    assert torch.allclose(model.hybrid_scores(q, d), 0.3 * dense + 0.7 * sparse)
    with pytest.raises(ValueError, match="lambda"):
        model.hybrid_scores(q, d, 1.5)


def test_hybrid_loss_trains_and_round_trips(hybrid, catalog, tmp_path):
    model = hybrid.train()
    qb = make_batch(model, [q.text for q in catalog.queries[:4]], "query")
    pb = make_batch(model, [catalog.product_text(p) for p in catalog.products[:4]], "doc")
    res = finetune_loss(model, qb, pb, None, StageConfig(flops_query_weight=0.01, flops_doc_weight=0.001), step=5)
    assert {"dense", "sparse", "flops_q", "flops_d"} <= set(res.parts)
    res.total.backward()
    assert model.query_tower.mlm_head.dense.weight.grad.abs().sum() > 0, "sparse loss reaches the MLM head"
    model.eval()
    model.save(tmp_path / "h")
    loaded = BiEncoder.load(tmp_path / "h").eval()
    with torch.no_grad():
        a = model.encode(qb.input_ids, qb.attention_mask, "query")
        b = loaded.encode(qb.input_ids, qb.attention_mask, "query")
    assert torch.equal(a.sparse, b.sparse) and torch.equal(a.embedding, b.embedding)
