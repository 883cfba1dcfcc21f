"""Cosine distillation on what is scored (+ in-batch score KL): values by hand, no gradient into the teacher."""

from __future__ import annotations

import math

import pytest
import torch

from madr.losses import DistillationCosineLoss

# row 0: (1, 0) vs (1, 1): cos = 1/sqrt(2); row 1: (0, 2) vs (0, 5): cos = 1
STUDENT = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
TEACHER = torch.tensor([[1.0, 1.0], [0.0, 5.0]])


def test_cosine_value_by_hand_and_blind_to_norms():
    want = (1 - 1 / math.sqrt(2)) / 2
    assert DistillationCosineLoss()(STUDENT, TEACHER).item() == pytest.approx(want)
    assert DistillationCosineLoss()(3 * STUDENT, TEACHER).item() == pytest.approx(want), (
        "norms must not count"
    )
    assert DistillationCosineLoss()(STUDENT, STUDENT * 7).item() == pytest.approx(0.0, abs=1e-7)


def test_in_batch_term_by_hand():
    tau = 0.5
    loss = DistillationCosineLoss(similarity_weight=2.0, temperature=tau)(STUDENT, TEACHER)
    s = torch.nn.functional.normalize(STUDENT, dim=-1)
    t = torch.nn.functional.normalize(TEACHER, dim=-1)
    p, q = torch.softmax(t @ t.T / tau, -1), torch.softmax(s @ t.T / tau, -1)
    kl = float((p * (p.log() - q.log())).sum(-1).mean())
    assert kl > 0.01, "the two in-batch distributions differ here"
    assert loss.item() == pytest.approx((1 - 1 / math.sqrt(2)) / 2 + 2.0 * kl, rel=1e-5)
    same = DistillationCosineLoss(similarity_weight=2.0, temperature=tau)(TEACHER * 3, TEACHER)
    assert same.item() == pytest.approx(0.0, abs=1e-6), "a student equal to the teacher up to norm: zero loss"


def test_gradient_reaches_student_not_teacher():
    student, teacher = STUDENT.clone().requires_grad_(True), TEACHER.clone().requires_grad_(True)
    DistillationCosineLoss(similarity_weight=1.0)(student, teacher).backward()
    assert teacher.grad is None, "the teacher must be detached"
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="same dim"):
        DistillationCosineLoss()(STUDENT, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        DistillationCosineLoss(temperature=0.0)
