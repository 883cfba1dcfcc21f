"""Aspect presence prediction loss: binary cross entropy per aspect (paper 000 Sec. 6.2, Eq. 6)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from madr.losses.aspect_prediction import masked_mean


class AspectPresenceLoss(nn.Module):
    """Aspect presence prediction (APP) loss (paper 000 Eq. 6), averaged over the included entries.

    `L_APP^a = -y_a log P_a - (1 - y_a) log(1 - P_a)` with `P_a = sigmoid(logit_a)`, computed in the
    numerically stable with-logits form. `y_a = 1` iff the input has at least one annotation for
    aspect `a` (paper 000: an aspect without annotations is taken as not present).

    Inputs:
        logits: `[B, A]` pre-sigmoid presence logits (`SigmoidLayer(E_a)` before the sigmoid).
        labels: `[B, A]` presence labels in [0, 1] (bool, int or float).
        aspect_mask: optional bool `[A]` (or `[B, A]`); False entries get no loss and no gradient.
            The OTHER aspect must be masked out: it has no annotations (paper 000 Sec. 5, Eq. 7).

    Returns the mean over the included `(row, aspect)` entries, i.e. `1/|A'|` times Eq. 7's sum over
    the included aspects `A'` of the batch-mean `L_APP^a`. With nothing included: a zero on the graph.
    Only needed with the Presence Weighting fusion (paper 000 Eq. 5); pair it with `AspectPredictionLoss`.
    """

    def forward(self, logits: torch.Tensor, labels: torch.Tensor,
                aspect_mask: torch.Tensor | None = None) -> torch.Tensor:
        if logits.dim() != 2 or labels.shape != logits.shape:
            raise ValueError(f"presence logits {tuple(logits.shape)} and labels {tuple(labels.shape)} "
                             "must both be [batch, num_aspects]")
        targets = labels.to(logits.dtype)
        if ((targets < 0) | (targets > 1)).any():
            raise ValueError("presence labels must lie in [0, 1]")
        keep = torch.ones_like(logits, dtype=torch.bool)
        if aspect_mask is not None:
            if aspect_mask.dtype != torch.bool or aspect_mask.shape not in (logits.shape[1:], logits.shape):
                raise ValueError(f"aspect_mask must be bool [{logits.shape[1]}] or [{logits.shape[0]}, "
                                 f"{logits.shape[1]}], got {aspect_mask.dtype} {tuple(aspect_mask.shape)}")
            keep = keep & aspect_mask.to(logits.device)
        per_entry = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        return masked_mean(per_entry, keep)
