"""Pointwise relevance cross entropy on judged query-document pairs (paper 000 Sec. 7, L_CE of Eq. 8)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from madr.losses.in_batch_softmax import SIMILARITIES


class PointwiseCELoss(nn.Module):
    """Cross entropy for whether a judged query-document pair is relevant (paper 000 L_CE, Eq. 8).

    `logit = scale * sim(q, d) + bias`, `L_CE = BCE(sigmoid(logit), target)` averaged over the pairs.
    The pairs come from candidate ranking lists with judgements; targets may be binary or graded/soft
    in [0, 1] (e.g. rel / max_rel). The scale and bias calibrate a bounded cosine (or unbounded dot)
    into a probability. This module has parameters: give them to the optimizer.

    Args:
        similarity: "cosine" or "dot".
        learn_scale: learn the scale (kept positive as exp of a log-scale); otherwise it is fixed.
        init_scale: initial scale; None picks 10.0 for cosine (in [-1, 1]) and 1.0 for dot products.
        init_bias: initial bias (always learned).

    Inputs: `q [N, d]`, `d [N, d]` (row i is one judged pair) and `target [N]` in [0, 1].
    It is pointwise: no in-batch negatives. Pair it with `InBatchSoftmaxLoss` as Eq. 8 does.
    """

    def __init__(self, similarity: str = "cosine", learn_scale: bool = True, init_scale: float | None = None,
                 init_bias: float = 0.0) -> None:
        super().__init__()
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if init_scale is None:
            init_scale = 10.0 if similarity == "cosine" else 1.0
        if init_scale <= 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        self.similarity = similarity
        log_scale = torch.tensor(math.log(init_scale))
        if learn_scale:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)
        self.bias = nn.Parameter(torch.tensor(float(init_bias)))

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()

    def logits(self, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """`[N]` relevance logits `scale * sim(q_i, d_i) + bias` of the row-aligned pairs."""
        if q.dim() != 2 or q.shape != d.shape:
            raise ValueError(f"q {tuple(q.shape)} and d {tuple(d.shape)} must both be [pairs, dim]")
        if self.similarity == "cosine":
            q, d = F.normalize(q, dim=-1), F.normalize(d, dim=-1)
        return self.scale * (q * d).sum(dim=-1) + self.bias

    def forward(self, q: torch.Tensor, d: torch.Tensor, target: torch.Tensor,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        """The mean binary cross entropy over the pairs, each pair's term times `weights` when given."""
        logits = self.logits(q, d)
        if target.shape != logits.shape:
            raise ValueError(f"target must be [pairs={logits.shape[0]}], got {tuple(target.shape)}")
        target = target.to(device=logits.device, dtype=logits.dtype)
        if ((target < 0) | (target > 1)).any():
            raise ValueError("pointwise targets must lie in [0, 1]")
        if weights is not None:
            weights = weights.to(device=logits.device, dtype=logits.dtype)
        return F.binary_cross_entropy_with_logits(logits, target, weight=weights)

