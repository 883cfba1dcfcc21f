"""L2 distillation of a teacher encoder's outputs into a smaller student (paper 004 Sec. V-A).

Paper 004 distils the 6-layer query encoder into a 3-layer BERT student "with only an L2 loss between the
output of the teacher and student encoders". Here: `mean_i ||s_i - t_i||^2`, the squared Euclidean distance
summed over the embedding dimension and averaged over the batch (`reduction="mean"`); `"sum"` sums over the
batch, `"mean_elementwise"` averages over every element (torch's `mse_loss`, = the above / d). The teacher
output is detached: no gradient reaches the teacher.
"""

from __future__ import annotations

import torch
from torch import nn

REDUCTIONS = ("mean", "sum", "mean_elementwise")


class DistillationMSELoss(nn.Module):
    """`mean_i ||student_i - stop_grad(teacher_i)||_2^2` over `[B, d]` outputs (paper 004 Sec. V-A).

    Args:
        reduction: "mean" (over rows, default), "sum" or "mean_elementwise" (also over the d dims).
    """

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
        self.reduction = reduction

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"

    def forward(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if student.dim() != 2 or student.shape != teacher.shape or student.shape[0] == 0:
            raise ValueError(f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} must both be "
                             "[batch>=1, dim] with the same dim (project the student first if they differ)")
        squared = (student - teacher.detach()).pow(2)
        if self.reduction == "mean_elementwise":
            return squared.mean()
        per_row = squared.sum(dim=1)
        return per_row.sum() if self.reduction == "sum" else per_row.mean()
