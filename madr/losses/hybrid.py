"""The hybrid model's training objective (paper 002 Eq. 3-5): dense + sparse contrastive terms + FLOPS."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from madr.losses.flops import FlopsLoss, FlopsWeightSchedule
from madr.losses.in_batch_softmax import InBatchSoftmaxLoss

TERMS = ("dense", "sparse")


class HybridLoss(nn.Module):
    """`L = L_dense + L_sparse + lambda_q(t) FLOPS(queries) + lambda_d(t) FLOPS(documents)` (paper 002 Eq. 5).

    L_dense (Eq. 3) and L_sparse (Eq. 4) are one in-batch softmax each, over the dense embeddings and over
    the sparse term-weight vectors, with in-batch plus hard negatives; FLOPS (`FlopsLoss`) is taken over the
    batch's query vectors and over its documents (positives, then hard negatives), with weights warmed up by
    `FlopsWeightSchedule` (quadratically over `flops_warmup_steps`).

    Args:
        contrastive: the in-batch softmax of both contrastive terms: `InBatchSoftmaxLoss("dot", temperature)`
            by default, or `madr.training.distributed.GatheredInBatchSoftmaxLoss` for negatives of all workers.
        flops_query_weight, flops_doc_weight, flops_warmup_steps: lambda_q, lambda_d and their warm-up.
        terms: the contrastive terms to keep: both (the joint model), ("dense",) alone (no FLOPS: paper 002
            Table 3 row c) or ("sparse",) with FLOPS (row e).

    `forward(q, p, n, q_sparse, p_sparse, n_sparse, step)` takes `[B, d]` dense and `[B, V]` sparse rows (hard
    negatives `n` / `n_sparse` may be None; unused representations may be None) and returns `(total, parts)`:
    parts maps "dense", "sparse", "flops_q", "flops_d" (those computed) to detached tensors.
    """

    def __init__(self, contrastive: nn.Module | None = None, flops_query_weight: float = 0.0,
                 flops_doc_weight: float = 0.0, flops_warmup_steps: int = 0,
                 terms: tuple[str, ...] = TERMS) -> None:
        super().__init__()
        bad = [t for t in terms if t not in TERMS]
        if bad or not terms:
            raise ValueError(f"HybridLoss terms must be a non-empty subset of {TERMS}, got {terms}")
        self.contrastive = contrastive if contrastive is not None else InBatchSoftmaxLoss("dot", 1.0)
        self.flops = FlopsLoss()
        self.query_weight = FlopsWeightSchedule(flops_query_weight, flops_warmup_steps)
        self.doc_weight = FlopsWeightSchedule(flops_doc_weight, flops_warmup_steps)
        self.terms = tuple(terms)

    @classmethod
    def from_stage(cls, stage: Any, contrastive: nn.Module | None = None,
                   terms: tuple[str, ...] = TERMS) -> HybridLoss:
        """The loss of a `madr.config.StageConfig`: `sparse_temperature` (for the default contrastive loss) and
        the FLOPS weights and warm-up."""
        if contrastive is None:
            contrastive = InBatchSoftmaxLoss("dot", stage.sparse_temperature)
        return cls(contrastive, stage.flops_query_weight, stage.flops_doc_weight, stage.flops_warmup_steps, terms)

    def forward(self, q: torch.Tensor | None, p: torch.Tensor | None, n: torch.Tensor | None,
                q_sparse: torch.Tensor | None, p_sparse: torch.Tensor | None, n_sparse: torch.Tensor | None,
                step: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total: torch.Tensor | None = None
        parts: dict[str, torch.Tensor] = {}
        if "dense" in self.terms:
            dense = self.contrastive(q, p, n)
            total, parts["dense"] = dense, dense.detach()
        if "sparse" in self.terms:
            sparse = self.contrastive(q_sparse, p_sparse, n_sparse)
            docs = p_sparse if n_sparse is None else torch.cat([p_sparse, n_sparse])
            fq, fd = self.flops(q_sparse), self.flops(docs)
            lq, ld = self.query_weight(step), self.doc_weight(step)
            # summed left to right as Eq. 5 is written (the float result does not depend on `terms`' path)
            total = sparse + lq * fq + ld * fd if total is None else total + sparse + lq * fq + ld * fd
            parts.update(sparse=sparse.detach(), flops_q=fq.detach(), flops_d=fd.detach())
        return total, parts
