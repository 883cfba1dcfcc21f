"""FLOPS regulariser (paper 002 Eq. 4-5, from SPLADE / Paria et al. 2020)."""

from __future__ import annotations

import torch
from torch import nn


class FlopsLoss(nn.Module):
    """FLOPS = sum_j ( (1/N) sum_i w_ij )^2 over a batch of N sparse vectors [N, V].

    It penalises the expected number of floating point operations of a sparse dot product, pushing
    rarely useful terms to zero. Paper 002 Eq. 5 weights it separately for queries and passages
    (lambda_q > lambda_d so queries are sparser); `FlopsWeightSchedule` warms the weights up.
    """

    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        if weights.dim() != 2 or weights.shape[0] == 0:
            raise ValueError(f"FLOPS expects [N>=1, vocab] weights, got {tuple(weights.shape)}")
        return (weights.mean(dim=0) ** 2).sum()


class FlopsWeightSchedule:
    """lambda(t) = lambda * min(1, t / T)^2: SPLADE's quadratic warm-up of the FLOPS weight."""

    def __init__(self, weight: float, warmup_steps: int) -> None:
        if weight < 0 or warmup_steps < 0:
            raise ValueError(f"FLOPS weight and warm-up must be >= 0, got {weight}, {warmup_steps}")
        self.weight = weight
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        if self.warmup_steps == 0:
            return self.weight
        return self.weight * min(1.0, step / self.warmup_steps) ** 2
