"""Distillation on what is scored: cosine to the teacher, plus an optional in-batch score-distribution term.

Paper 004 Sec. V-A distils with "only an L2 loss between the output of the teacher and student encoders"
(`DistillationMSELoss`). When the encoder scores by cosine (`model.similarity: cosine`, mean-pooled e5), the
L2 loss on unnormalised vectors also spends its effort on their norms, which the score ignores. Here:

    L = mean_i (1 - cos(s_i, t_i))  +  w * KL(softmax(T T^T / tau) || softmax(S T^T / tau))   (rows)

The first term is DistilBERT's cosine embedding loss (Sanh et al. 2019, Sec. 3) and equals half the squared
L2 distance of the normalised vectors (`||s/|s| - t/|t|||^2 = 2 - 2 cos`). The second matches the
teacher's in-batch score distribution (each text against every teacher vector in the batch, as a retriever
ranks candidates), the "in-batch KL" of TCT-ColBERT (Lin et al. 2021, Sec. 3.2); `w = 0` (default) drops it.
Prefer `DistillationMSELoss` to reproduce the paper; this one when the score is a cosine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DistillationCosineLoss(nn.Module):
    """`mean_i (1 - cos(s_i, t_i)) + w * in-batch KL` over `[B, d]` outputs; the teacher is detached.

    Args:
        similarity_weight: weight `w` of the in-batch score-distribution term (needs B >= 2 to matter).
        temperature: `tau` of both score distributions (cosines / tau).
    """

    def __init__(self, similarity_weight: float = 0.0, temperature: float = 0.05) -> None:
        super().__init__()
        if similarity_weight < 0 or temperature <= 0:
            raise ValueError(
                f"need similarity_weight >= 0 and temperature > 0, got {similarity_weight}, {temperature}"
            )
        self.similarity_weight = similarity_weight
        self.temperature = temperature

    def extra_repr(self) -> str:
        return f"similarity_weight={self.similarity_weight}, temperature={self.temperature}"

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if student.dim() != 2 or student.shape != teacher.shape or student.shape[0] == 0:
            raise ValueError(
                f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} must both be "
                "[batch>=1, dim] with the same dim (project the student first if they differ)"
            )
        s, t = F.normalize(student, dim=-1), F.normalize(teacher.detach(), dim=-1)
        loss = (1.0 - (s * t).sum(dim=-1)).mean()
        if self.similarity_weight > 0:
            target = F.softmax(t @ t.T / self.temperature, dim=-1)
            log_student = F.log_softmax(s @ t.T / self.temperature, dim=-1)
            loss = loss + self.similarity_weight * F.kl_div(log_student, target, reduction="batchmean")
        return loss
