"""Paper 002 Eq. 3-5 (`HybridLoss`) against the formula written out, and its three callers agreeing on one batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from madr.config import ModelConfig, StageConfig
from madr.losses import HybridLoss, InBatchSoftmaxLoss
from madr.modeling.model import build_model
from madr.recipes.pqa.train import representation_loss
from madr.training.distributed import GatheredInBatchSoftmaxLoss
from madr.training.loop import CatalogSampler, finetune_batches
from madr.training.stage_module import FinetuneBatch, StageModule

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}


def _by_hand(q, p, n, qs, ps, ns, t, lam_q, lam_d):
    """Eq. 3 / 4: -log softmax of the own positive among all positives and hard negatives (dot / t); Eq. 5:
    + lambda_q sum_j mean_i(q_ij)^2 + lambda_d sum_j mean_i(d_ij)^2 over queries / all documents."""
    def contrastive(a, pos, neg):
        logits = a @ torch.cat([pos, neg]).T / t
        return -sum(logits[i, i] - torch.logsumexp(logits[i], 0) for i in range(len(a))) / len(a)
    docs = torch.cat([ps, ns])
    flops = lambda w: sum(float(w[:, j].mean()) ** 2 for j in range(w.shape[1]))  # noqa: E731
    return float(contrastive(q, p, n) + contrastive(qs, ps, ns)) + lam_q * flops(qs) + lam_d * flops(docs)


def test_hybrid_loss_is_equation_5_by_hand():
    g = torch.Generator().manual_seed(0)
    q, p, n = (torch.randn(3, 4, generator=g) for _ in range(3))
    qs, ps, ns = (F.relu(torch.randn(3, 7, generator=g)) for _ in range(3))
    loss = HybridLoss(InBatchSoftmaxLoss("dot", 0.5), flops_query_weight=0.3, flops_doc_weight=0.1,
                      flops_warmup_steps=4)
    total, parts = loss(q, p, n, qs, ps, ns, step=2)  # warm-up: lambda * (2/4)^2
    assert float(total) == pytest.approx(_by_hand(q, p, n, qs, ps, ns, 0.5, 0.3 / 4, 0.1 / 4), rel=1e-5)
    assert set(parts) == {"dense", "sparse", "flops_q", "flops_d"}
    assert float(total) == pytest.approx(float(parts["dense"] + parts["sparse"] + 0.3 / 4 * parts["flops_q"]
                                               + 0.1 / 4 * parts["flops_d"]), rel=1e-6)
    after, _ = loss(q, p, n, qs, ps, ns, step=10)  # past the warm-up: the full weights
    assert float(after) == pytest.approx(_by_hand(q, p, n, qs, ps, ns, 0.5, 0.3, 0.1), rel=1e-5)
    dense, dparts = HybridLoss(InBatchSoftmaxLoss("dot", 0.5), 0.3, 0.1, terms=("dense",))(q, p, n, None, None, None)
    sparse, sparts = HybridLoss(InBatchSoftmaxLoss("dot", 0.5), 0.3, 0.1, terms=("sparse",))(None, None, None, qs, ps, ns)
    assert set(dparts) == {"dense"} and set(sparts) == {"sparse", "flops_q", "flops_d"}
    assert float(dense + sparse) == pytest.approx(float(after), rel=1e-6), "Eq. 5 splits into its two representations"
    gathered, _ = HybridLoss(GatheredInBatchSoftmaxLoss("dot", 0.5), 0.3, 0.1, 4)(q, p, n, qs, ps, ns, step=2)
    assert float(gathered) == float(total), "one process: the gathered softmax is the plain one"
    with pytest.raises(ValueError, match="terms"):
        HybridLoss(terms=("lexical",))


def test_every_training_path_computes_the_same_hybrid_loss(catalog, tokenizer, vocabularies):
    """The pqa recipe's representation_loss and the StageModule every other training path steps give one value
    and the same parts on one batch (both call HybridLoss)."""
    cfg = ModelConfig(name="hybrid", aspects=catalog.aspect_names, max_query_length=16, max_doc_length=32,
                      sparse_top_k=64)
    cfg.backbone.tiny = dict(TINY)
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer, vocabularies)
    stage = StageConfig(batch_size=8, flops_query_weight=0.01, flops_doc_weight=0.02, flops_warmup_steps=10)
    qb, pb, nb, rel = finetune_batches(model, CatalogSampler(catalog, seed=5).finetune_batch(8))
    q, p, n = (model.encode(b.input_ids, b.attention_mask, s) for b, s in ((qb, "query"), (pb, "doc"), (nb, "doc")))
    b = representation_loss(q, p, n, stage, 3, "hybrid")
    c_total, c_parts = StageModule("finetune", dataclasses.replace(stage, hard_negatives=1), model).loss(
        FinetuneBatch(qb, pb, nb, rel), 3)
    assert float(b.total.detach()) == float(c_total.detach())
    assert {k: b.parts[k] for k in c_parts} == c_parts and set(c_parts) >= {"dense", "sparse", "flops_q", "flops_d",
                                                                            "nnz_q"}
