"""L2 distillation loss (paper 004 Sec. V-A): values by hand, no gradient into the teacher."""

from __future__ import annotations

import pytest
import torch

from madr.losses.distillation import DistillationMSELoss

# row 0: (1, 2) vs (1, 0): 0 + 4 = 4; row 1: (0, 0) vs (3, 4): 9 + 16 = 25
STUDENT = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
TEACHER = torch.tensor([[1.0, 0.0], [3.0, 4.0]])


@pytest.mark.parametrize("reduction, expected", [("mean", 14.5), ("sum", 29.0), ("mean_elementwise", 7.25)])
def test_value_by_hand(reduction, expected):
    loss = DistillationMSELoss(reduction)(STUDENT, TEACHER)
    assert loss.item() == pytest.approx(expected), f"{reduction}: {loss.item()} != {expected}"


def test_gradient_reaches_student_not_teacher():
    student = STUDENT.clone().requires_grad_(True)
    teacher = TEACHER.clone().requires_grad_(True)
    DistillationMSELoss()(student, teacher).backward()
    assert teacher.grad is None, "the teacher must be detached"
    # d/ds mean_i ||s_i - t_i||^2 = 2 (s - t) / B
    assert torch.allclose(student.grad, (STUDENT - TEACHER)), f"student grad {student.grad}"


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="same dim"):
        DistillationMSELoss()(STUDENT, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="reduction"):
        DistillationMSELoss("max")
