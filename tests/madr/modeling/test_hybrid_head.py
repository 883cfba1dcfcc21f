"""Hybrid head (paper 002): term-weight formula, top-k, FLOPS and the interpolation, by hand."""

import math

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.losses import FlopsLoss, FlopsWeightSchedule
from madr.modeling.batching import make_batch
from madr.modeling.heads.hybrid import term_weights, top_k_sparsify
from madr.modeling.model import BiEncoder, build_model
from madr.training.stage_module import FinetuneBatch, StageModule

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


def test_term_weights_inference_path_equals_the_training_path():
    """No gradients: max of the logits, then the activation on [B, V] only; the same values bit for bit."""
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 50) * 3
    mask = torch.tensor([[1] * 7, [1] * 3 + [0] * 4, [1] + [0] * 6, [1] * 5 + [0] * 2])
    trained = term_weights(logits.clone().requires_grad_(True), mask, "max", excluded_ids=[2, 9])
    with torch.no_grad():
        served = term_weights(logits, mask, "max", excluded_ids=[2, 9])
    assert torch.equal(served, trained.detach())
    assert trained.requires_grad, "the training path keeps its graph"


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
    stage = StageConfig(flops_query_weight=0.01, flops_doc_weight=0.001)
    total, parts = StageModule("finetune", stage, model, gather=False).loss(
        FinetuneBatch(qb, pb, None, torch.zeros(4)), 5)
    assert {"dense", "sparse", "flops_q", "flops_d"} <= set(parts)
    total.backward()
    assert model.query_tower.mlm_head.dense.weight.grad.abs().sum() > 0, "sparse loss reaches the MLM head"
    model.eval()
    model.save(tmp_path / "h")
    loaded = BiEncoder.load(tmp_path / "h").eval()
    with torch.no_grad():
        a = model.encode(qb.input_ids, qb.attention_mask, "query")
        b = loaded.encode(qb.input_ids, qb.attention_mask, "query")
    assert torch.equal(a.sparse, b.sparse) and torch.equal(a.embedding, b.embedding)


def _ce(scores: list[float], target: int, temperature: float) -> float:
    """-log softmax(scores / t)[target], written out."""
    exps = [math.exp(s / temperature) for s in scores]
    return -math.log(exps[target] / sum(exps))


def test_hybrid_loss_by_hand():
    """Paper 002 Eq. 3-5: both contrastive terms (in-batch + hard negatives, temperature) + warmed-up FLOPS."""
    from madr.modeling.outputs import TowerOutput
    from madr.training.objectives import hybrid_loss

    q = TowerOutput(embedding=torch.tensor([[1.0, 0.0], [0.0, 1.0]]), sparse=torch.tensor([[1.0, 0.0, 2.0],
                                                                                            [0.0, 1.0, 0.0]]))
    p = TowerOutput(embedding=torch.tensor([[1.0, 1.0], [0.0, 2.0]]), sparse=torch.tensor([[1.0, 0.0, 0.0],
                                                                                            [0.0, 3.0, 0.0]]))
    n = TowerOutput(embedding=torch.tensor([[2.0, 0.0], [0.0, 0.0]]), sparse=torch.tensor([[0.0, 0.0, 1.0],
                                                                                            [2.0, 0.0, 0.0]]))
    stage = StageConfig(sparse_temperature=2.0, flops_query_weight=0.4, flops_doc_weight=0.2, flops_warmup_steps=4)
    # documents [p0, p1, n0, n1]; query i's target is p_i
    dense = (_ce([1, 0, 2, 0], 0, 2.0) + _ce([1, 2, 0, 0], 1, 2.0)) / 2
    sparse = (_ce([1, 0, 2, 2], 0, 2.0) + _ce([0, 3, 0, 0], 1, 2.0)) / 2
    flops_q = 0.5 ** 2 + 0.5 ** 2 + 1.0 ** 2  # column means of q.sparse: [.5, .5, 1]
    flops_d = 0.75 ** 2 + 0.75 ** 2 + 0.25 ** 2  # column means of [p; n].sparse: [.75, .75, .25]
    warm = (2 / 4) ** 2  # step 2 of a 4-step quadratic warm-up
    res = hybrid_loss(q, p, n, stage, step=2)
    assert res.parts["dense"] == pytest.approx(dense) and res.parts["sparse"] == pytest.approx(sparse)
    assert res.parts["flops_q"] == pytest.approx(flops_q) and res.parts["flops_d"] == pytest.approx(flops_d)
    expected = dense + sparse + 0.4 * warm * flops_q + 0.2 * warm * flops_d
    assert float(res.total) == pytest.approx(expected, rel=1e-6)
    assert float(hybrid_loss(q, p, n, stage, step=10).total) == pytest.approx(dense + sparse + 0.4 * flops_q
                                                                              + 0.2 * flops_d, rel=1e-6)


@pytest.mark.parametrize(("pooling", "k"), [("max", 128), ("sum", 8)])
def test_tower_sparse_vector_is_the_formula_on_the_tied_mlm_head(tokenizer, pooling, k, tmp_path):
    """Backbones without MLM-head weights get a head whose decoder is the word-embedding matrix; the tower's
    sparse vector is top-k(pool_i log(1 + ReLU(logits))) with special tokens excluded."""
    from madr.modeling.backbone import MLMHead

    torch.manual_seed(1)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=k, sparse_pooling=pooling,
                      max_query_length=16, max_doc_length=48)
    model = build_model(cfg, tokenizer).eval()
    tower = model.query_tower
    assert not any(p.shape == tower.word_embeddings.shape for p in tower.mlm_head.parameters()), \
        "no separate decoder matrix: the head is tied to the word embeddings"
    tower.backbone.save_pretrained(str(tmp_path / "bb"))
    assert not MLMHead(32, len(tokenizer)).load_from_checkpoint(str(tmp_path / "bb")), "no MLM weights to load"
    enc = model.tokenize(["red running shoes size 42", "blue socks"], "query")
    with torch.no_grad():
        out = model.encode(enc["input_ids"], enc["attention_mask"], "query")
        head = tower.mlm_head
        h = head.layer_norm(torch.nn.functional.gelu(head.dense(out.sequence_output)))
        by_hand = h @ tower.word_embeddings.T + head.bias  # decoder = word embeddings (tied)
        logits = tower.mlm_logits(out)
        assert torch.allclose(logits, by_hand, atol=1e-5)
        w = torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1)
        pooled = w.max(dim=1).values if pooling == "max" else w.sum(dim=1)
        pooled[:, tokenizer.all_special_ids] = 0.0
        expected = torch.zeros_like(pooled).scatter(1, pooled.topk(k, dim=1).indices, pooled.topk(k, dim=1).values)
    assert torch.allclose(out.sparse, expected, atol=1e-6)
    assert int((out.sparse > 0).sum(-1).max()) <= k and torch.all(out.sparse[:, tokenizer.all_special_ids] == 0)
    with torch.no_grad():
        tower.word_embeddings.mul_(2.0)  # tied: changing the embeddings changes the term weights
        assert not torch.allclose(model.encode(enc["input_ids"], enc["attention_mask"], "query").sparse, out.sparse)


# ---- where the top-k cut applies (paper 002 Sec. 4.2, Eq. 3-4; SPLADE) -------------------------------------


LOGITS = torch.randn(2, 2, 3, 12, generator=torch.Generator().manual_seed(0))  # [q / p, B, L, V], ~half > 0


def _below_cut_grad(top_k_in_training: bool, loss: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(train-mode query sparse output, |d loss / d query logits| summed per term) of a bare head, k = 2."""
    from madr.losses import InBatchSoftmaxLoss
    from madr.modeling.heads.hybrid import HybridHead

    logits = LOGITS.clone().requires_grad_()
    mask = torch.ones(2, 3, dtype=torch.long)
    head = HybridHead(2, "max", [], top_k_in_training=top_k_in_training).train()
    q, p = head.sparsify(logits[0], mask), head.sparsify(logits[1], mask)
    value = FlopsLoss()(q) if loss == "flops" else InBatchSoftmaxLoss("dot", 1.0)(q, p, None)
    value.backward()
    return q.detach(), logits.grad[0].abs().sum(dim=(0, 1))


@pytest.mark.parametrize("loss", ["flops", "contrastive"])
def test_training_losses_reach_the_terms_below_the_cut_by_default(loss):
    full = term_weights(LOGITS[0], torch.ones(2, 3))
    q, grad = _below_cut_grad(False, loss)
    assert torch.allclose(q, full), "training mode keeps the whole Eq. 2 vector"
    kept = torch.zeros(12, dtype=torch.bool)
    kept[full.topk(2, dim=-1).indices.flatten()] = True
    below = (full > 0).any(0) & ~kept  # positive in some row, in no row's top 2
    assert int(below.sum()) > 0 and bool((grad[below] > 0).all()), "the loss pushes the terms below the cut"
    q_cut, grad_cut = _below_cut_grad(True, loss)
    assert int((q_cut > 0).sum(-1).max()) <= 2, "the option cuts in training, as before"
    assert torch.all(grad_cut[below] == 0), "with the cut in training those terms get no gradient"


@pytest.mark.parametrize("in_training", [False, True])
def test_tower_cuts_at_k_in_eval_mode_and_in_training_only_with_the_option(tokenizer, in_training):
    k = 8
    torch.manual_seed(0)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=k, max_query_length=16,
                      max_doc_length=32, sparse_top_k_in_training=in_training)
    model = build_model(cfg, tokenizer).train()
    enc = model.tokenize(["red running shoes size 42", "blue socks"], "query")
    out = model.encode(enc["input_ids"], enc["attention_mask"], "query")
    nnz = (out.sparse > 0).sum(-1)
    if in_training:
        assert int(nnz.max()) <= k
    else:
        assert int(nnz.min()) > k, f"training mode keeps every positive weight, got {nnz.tolist()}"
        full = term_weights(model.query_tower.mlm_logits(out), enc["attention_mask"], "max",
                            tokenizer.all_special_ids)
        assert torch.equal(out.sparse, full)
    model.eval()
    with torch.no_grad():
        ev = model.encode(enc["input_ids"], enc["attention_mask"], "query")
    assert int((ev.sparse > 0).sum(-1).max()) <= k, "inference always cuts at k"


def test_index_encoding_and_explanations_cut_at_k_from_a_model_left_in_training_mode(tokenizer):
    from madr.index.encode import encode_token_batch
    from madr.modeling.explain import matched_terms

    k = 8
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=k,
                                    max_query_length=16, max_doc_length=32), tokenizer).train()
    rows = [tokenizer("red running shoes size 42")["input_ids"], tokenizer("blue socks")["input_ids"]]
    _, sparse = encode_token_batch(model, rows, "doc")
    assert max(np.diff(sparse.indptr)) <= k and model.training, "cut at k, training mode restored"
    matches = matched_terms(model, "red shoes", "red running shoes size 42", top=None)
    assert len(matches) <= k and model.training
