"""Bridge-task loss on translation pairs (paper 004 Sec. III, WikiMatrix): softmax and MSE by hand."""

from __future__ import annotations

import math

import pytest
import torch

from madr.losses.translation import TranslationLoss

# dot similarity, t = 1: source x = (1, 0), (0, 1); English y = (2, 0), (1, 1)
# x y^T = [[2, 1], [0, 1]]: row 0 -log(e^2 / (e^2 + e)) = ln(1 + e^-1); row 1 -log(e / (1 + e)) = ln(1 + e^-1)
# transposed [[2, 0], [1, 1]]: row 0 ln(1 + e^-2); row 1 ln 2
X = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
Y = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
FORWARD = math.log(1 + math.exp(-1))
BACKWARD = (math.log(1 + math.exp(-2)) + math.log(2)) / 2


def test_softmax_one_direction_by_hand():
    loss = TranslationLoss(similarity="dot", temperature=1.0, symmetric=False)(X, Y)
    assert loss.item() == pytest.approx(FORWARD, abs=1e-6), f"{loss.item()} != {FORWARD}"


def test_softmax_symmetric_by_hand():
    loss = TranslationLoss(similarity="dot", temperature=1.0)(X, Y)
    expected = (FORWARD + BACKWARD) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6), f"{loss.item()} != {expected}"


def test_softmax_cosine_with_temperature_by_hand():
    # cos matrix [[1, 1/sqrt2], [0, 1/sqrt2]] / 0.5 = [[2, sqrt2], [0, sqrt2]]:
    # row 0 -log(e^2 / (e^2 + e^sqrt2)) = ln(1 + e^(sqrt2 - 2)); row 1 -log(e^sqrt2 / (1 + e^sqrt2)) = ln(1 + e^-sqrt2)
    r2 = math.sqrt(2)
    expected = (math.log(1 + math.exp(r2 - 2)) + math.log(1 + math.exp(-r2))) / 2
    loss = TranslationLoss(temperature=0.5, symmetric=False)(X, Y)
    assert loss.item() == pytest.approx(expected, abs=1e-6), f"{loss.item()} != {expected}"


def test_duplicate_english_sentences_are_not_negatives():
    # both rows share the English sentence: the off-diagonal logits are masked, each row's softmax is its own
    loss = TranslationLoss(similarity="dot", temperature=1.0)(X, Y, target_ids=torch.tensor([3, 3]))
    assert loss.item() == pytest.approx(0.0, abs=1e-6), f"masked duplicates leave loss 0, got {loss.item()}"


def test_mse_to_detached_english_side_by_hand():
    # x - y = (-1, 0), (-1, 0): squared norms 1, 1 -> mean 1
    x, y = X.clone().requires_grad_(True), Y.clone().requires_grad_(True)
    loss = TranslationLoss(objective="mse")(x, y)
    assert loss.item() == pytest.approx(1.0), f"{loss.item()} != 1"
    loss.backward()
    assert y.grad is None, "the English side is a fixed teacher"
    assert torch.allclose(x.grad, X - Y), f"d/dx mean ||x - y||^2 = 2 (x - y) / 2, got {x.grad}"


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="objective"):
        TranslationLoss(objective="kl")
    with pytest.raises(ValueError, match="temperature"):
        TranslationLoss(temperature=0.0)
    with pytest.raises(ValueError, match="source"):
        TranslationLoss()(X, Y[:1])
