"""Aspect Fusion Networks: K component embeddings -> one vector for ANN search.

Paper 000 Sec. 6: Weighted Sum (Eq. 4), Presence Weighting (Eq. 5-6), CLS-Gating (Sec. 6.3);
paper 001 Sec. 4.4 uses CLS-Gating (Eq. 6-7). MpBERT fuses its pooled token encodings with the same
networks (paper 000 Sec. 8.2).

Every fusion returns a `Fused`: the vector, the per-example weights (what `/explain` shows) and, for
Presence Weighting, the presence logits the presence loss (Eq. 6) trains.

`dim` is the width of the component embeddings (the projected width when the head projects its aspect
embeddings, paper 000 Sec. 8.2) and `cls_dim` the width of the CLS encoding CLS-Gating reads (the backbone's
hidden size; default `dim`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Fused:
    embedding: torch.Tensor  # [B, H]
    weights: torch.Tensor  # [B, K], rows sum to one
    presence_logits: torch.Tensor | None = None  # [B, K] (Presence Weighting only)


def _masked_normalise(weights: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-9) -> torch.Tensor:
    """Zero weights of absent components (e.g. MpBERT positions past the text) and L1-normalise."""
    if mask is not None:
        weights = weights * mask.to(weights.dtype)
    return weights / weights.abs().sum(dim=-1, keepdim=True).clamp_min(eps)


def _combine(components: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bk,bkh->bh", weights, components)


class WeightedSum(nn.Module):
    """Eq. 4: E = sum_a w_a E_a with input-independent w = softmax(gamma)."""

    def __init__(self, num_components: int, dim: int, cls_dim: int | None = None) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(num_components))

    def forward(self, components: torch.Tensor, cls: torch.Tensor, mask: torch.Tensor | None = None) -> Fused:
        w = torch.softmax(self.gamma, dim=0).expand(components.shape[0], -1)
        w = _masked_normalise(w, mask)
        return Fused(_combine(components, w), w)


class PresenceWeighting(nn.Module):
    """Eq. 5: w_a(Q) = P_a(Q) * gamma_a, L1-normalised to sum to one.

    P_a(Q) = sigmoid(v_a . E_a + c_a) is one sigmoid layer per aspect on its own embedding; it is trained
    by the aspect presence loss (Eq. 6) where annotations exist. gamma_a = softplus(raw_a) keeps the
    input-independent importance positive, so the L1 normalisation makes weights that sum to one.
    """

    def __init__(self, num_components: int, dim: int, cls_dim: int | None = None) -> None:
        super().__init__()
        self.presence_weight = nn.Parameter(torch.randn(num_components, dim) * dim**-0.5)
        self.presence_bias = nn.Parameter(torch.zeros(num_components))
        # softplus(0.5413) == 1.0: every aspect starts equally important.
        self.raw_gamma = nn.Parameter(torch.full((num_components,), 0.5413))

    def forward(self, components: torch.Tensor, cls: torch.Tensor, mask: torch.Tensor | None = None) -> Fused:
        logits = torch.einsum("bkh,kh->bk", components, self.presence_weight) + self.presence_bias
        w = torch.sigmoid(logits) * nn.functional.softplus(self.raw_gamma)
        w = _masked_normalise(w, mask)
        return Fused(_combine(components, w), w, logits)


class CLSGating(nn.Module):
    """Paper 000 Sec. 6.3 / paper 001 Eq. 6-7: w = softmax(U h_CLS + b); E = sum_k w_k E_k."""

    def __init__(self, num_components: int, dim: int, cls_dim: int | None = None) -> None:
        super().__init__()
        self.gate = nn.Linear(dim if cls_dim is None else cls_dim, num_components)

    def forward(self, components: torch.Tensor, cls: torch.Tensor, mask: torch.Tensor | None = None) -> Fused:
        logits = self.gate(cls)
        if mask is not None:
            logits = logits.masked_fill(~mask.bool(), float("-inf"))
        w = torch.softmax(logits, dim=-1)
        return Fused(_combine(components, w), w)


FUSIONS: dict[str, type[nn.Module]] = {
    "weighted_sum": WeightedSum,
    "presence": PresenceWeighting,
    "cls_gating": CLSGating,
}


def build_fusion(name: str, num_components: int, dim: int, cls_dim: int | None = None) -> nn.Module:
    """Fusion `name` over `num_components` embeddings of width `dim` (CLS-Gating reads a `cls_dim` CLS)."""
    if name not in FUSIONS:
        raise ValueError(f"fusion {name!r} is not one of {', '.join(FUSIONS)}")
    return FUSIONS[name](num_components, dim, cls_dim)
