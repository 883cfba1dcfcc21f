"""Hybrid head: SPLADE-style sparse lexical vector from the MLM head + the CLS dense vector (paper 002).

Term weights (paper 002, formulas in papers/README.md; SPLADE): for vocabulary term j over the input
tokens i, w_j = max_i log(1 + ReLU(mlm_logit[i, j])) (sum-pooling is the alternative), special tokens
excluded, then only the top-k weights are kept (Sec. 4.2). The dense part is the CLS hidden state. A pair
scores s(q, p) = lambda * <dense_q, dense_p> + (1 - lambda) * <sparse_q, sparse_p> (Eq. 1).

Where the cut applies: at inference (eval mode) always; in training (module.training) only with
`top_k_in_training` (`model.sparse_top_k_in_training`). The default trains on the full pooled vector, so
the contrastive loss (Eq. 3) and FLOPS (Eq. 4, written on the Eq. 2 weights) see, and push down, the terms
below the cut, as SPLADE trains (Formal et al. 2021); the cut is then an index-time pruning.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.modeling.heads.base import run_backbone
from madr.modeling.outputs import TowerOutput


def term_weights(mlm_logits: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "max",
                 excluded_ids: list[int] | None = None) -> torch.Tensor:
    """[B, V] pooled log(1 + ReLU(logits)) over the non-padding positions, excluded ids zeroed.

    Without gradients, max pooling takes the max of the logits first and the activation over [B, V] only
    (log1p and ReLU are monotonic, so the values are the same; padding counts as 0 either way): the encode
    job and serving skip two passes over the [B, L, V] logits."""
    if pooling == "max" and not (torch.is_grad_enabled() and mlm_logits.requires_grad):
        keep = attention_mask.unsqueeze(-1).to(torch.bool)
        pooled = torch.log1p(torch.relu(mlm_logits.masked_fill(~keep, 0.0).amax(dim=1)))
        if excluded_ids:
            pooled = pooled.index_fill(1, torch.tensor(excluded_ids, device=pooled.device), 0.0)
        return pooled
    w = torch.log1p(torch.relu(mlm_logits)) * attention_mask.unsqueeze(-1).to(mlm_logits.dtype)
    if pooling == "max":
        pooled = w.max(dim=1).values
    elif pooling == "sum":
        pooled = w.sum(dim=1)
    else:
        raise ValueError(f"sparse pooling {pooling!r} is not one of max, sum")
    if excluded_ids:
        pooled = pooled.index_fill(1, torch.tensor(excluded_ids, device=pooled.device), 0.0)
    return pooled


def top_k_sparsify(weights: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep each row's k largest weights, zero the rest (gradients flow through the kept ones)."""
    if k is None or k >= weights.shape[-1]:
        return weights
    values, idx = torch.topk(weights, k, dim=-1)
    return torch.zeros_like(weights).scatter(-1, idx, values)


class SparseTerms(nn.Module):
    """Paper 002 Eq. 2 and the Sec. 4.2 cut: pooled log(1 + ReLU) term weights of MLM logits, top-k kept where
    `active_top_k` says. The hybrid model's head is one; any other backbone model gets one with
    `model.sparse_head` (`Tower.sparse_terms`)."""

    def __init__(self, top_k: int | None, pooling: str, excluded_ids: list[int],
                 top_k_in_training: bool = False) -> None:
        super().__init__()
        if pooling not in ("max", "sum"):
            raise ValueError(f"sparse pooling {pooling!r} is not one of max, sum")
        self.top_k = top_k
        self.top_k_in_training = top_k_in_training
        self.pooling = pooling
        self.excluded_ids = sorted(set(excluded_ids))

    @property
    def active_top_k(self) -> int | None:
        """The k the current mode cuts at: `top_k` in eval mode or with `top_k_in_training`, else None."""
        return self.top_k if self.top_k_in_training or not self.training else None

    def sparsify(self, mlm_logits: torch.Tensor, attention_mask: torch.Tensor,
                 excluded: bool = True) -> torch.Tensor:
        """Term weights (Eq. 2), cut to the top-k where `active_top_k` says (Sec. 4.2); `excluded=False` when
        the logits' columns hold no special token (a lean head's terms)."""
        w = term_weights(mlm_logits, attention_mask, self.pooling, self.excluded_ids if excluded else None)
        return top_k_sparsify(w, self.active_top_k)


class HybridHead(SparseTerms):
    """CLS as the dense vector; the tower adds the sparse vector from its MLM head (see `Tower`)."""

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        seq = run_backbone(backbone, input_ids, attention_mask)
        return TowerOutput(embedding=seq[:, 0], cls=seq[:, 0], sequence_output=seq)
