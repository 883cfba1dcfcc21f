"""NLI cross entropy on the clipped cosine (paper 004 Eq. 2) and the NLI label mapping, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from madr.losses.nli_cosine import NLICosineLoss, nli_targets

R3 = math.sqrt(3.0)
# u = (1, 0) against four v's:
# v0 = (1, 1)   cos  1/sqrt2 -> clip .7071, target 1: -ln .7071 = .5 ln2
# v1 = (0, 1)   cos  0       -> clip eps,   target 0: -ln(1 - eps) ~ 0
# v2 = (-1, 1)  cos -1/sqrt2 -> clip eps,   target 0: ~ 0
# v3 = (1, R3)  cos  .5      -> clip .5,    target 0: -ln .5 = ln2
U = torch.tensor([[1.0, 0.0]] * 4)
V = torch.tensor([[1.0, 1.0], [0.0, 1.0], [-1.0, 1.0], [1.0, R3]])
Y = torch.tensor([1.0, 0.0, 0.0, 0.0])


def test_clipped_cosine_cross_entropy_by_hand():
    loss = NLICosineLoss()(U, V, Y)
    expected = (0.5 * math.log(2) + math.log(2)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-5), f"{loss.item()} != {expected}"


def test_affine_mapping_by_hand():
    # p = (1 + cos) / 2: .85355 (y 1), .5 (y 0), .14645 (y 0), .75 (y 0)
    p = [(1 + 1 / math.sqrt(2)) / 2, 0.5, (1 - 1 / math.sqrt(2)) / 2, 0.75]
    expected = (-math.log(p[0]) - math.log(1 - p[1]) - math.log(1 - p[2]) - math.log(1 - p[3])) / 4
    loss = NLICosineLoss(mapping="affine")(U, V, Y)
    assert loss.item() == pytest.approx(expected, abs=1e-5), f"{loss.item()} != {expected}"


def test_clip_has_no_gradient_for_negative_cosine_but_affine_does():
    v = torch.tensor([[-1.0, 1.0]], requires_grad=True)  # entailment pair pointing away: cos < 0
    NLICosineLoss()(U[:1], v, [1.0]).backward()
    assert v.grad.abs().sum() == 0, "max(0, cos) is flat below 0"
    assert NLICosineLoss()(U[:1], v.detach(), [1.0]).item() == pytest.approx(-math.log(1e-6), rel=1e-4), \
        "y^ is clamped to eps, so the loss is finite"
    v.grad = None
    NLICosineLoss(mapping="affine")(U[:1], v, [1.0]).backward()
    assert v.grad.abs().sum() > 0, "affine mapping keeps a gradient"


def test_nli_targets_three_way_strings_drop_contradiction_and_no_label():
    got = nli_targets(["entailment", "neutral", "contradiction", "-", " Entailment "], "snli")
    assert got.keep == [0, 1, 4] and got.targets == [1.0, 0.0, 1.0], got
    assert (got.dropped_contradiction, got.dropped_no_label) == (1, 1), got


def test_nli_targets_integer_ids():
    got = nli_targets(np.array([0, 1, 2, -1, 0]), "xnli")  # HF xnli: 0 ent, 1 neutral, 2 contradiction
    assert got.keep == [0, 1, 4] and got.targets == [1.0, 0.0, 1.0], got
    assert (got.dropped_contradiction, got.dropped_no_label) == (1, 1), got
    qnli = nli_targets(["entailment", "not_entailment", 0, 1], "qnli")
    assert qnli.keep == [0, 1, 2, 3] and qnli.targets == [1.0, 0.0, 1.0, 0.0], qnli


def test_nli_targets_rejects_unknown_labels_and_datasets():
    with pytest.raises(ValueError, match=r"row 1: label 'contradiction' is not a qnli label"):
        nli_targets(["entailment", "contradiction"], "qnli")
    with pytest.raises(ValueError, match="row 0"):
        nli_targets([2], "qnli")
    with pytest.raises(ValueError, match="row 0"):
        nli_targets([True], "snli")
    with pytest.raises(ValueError, match="dataset"):
        nli_targets([0], "rte")


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="targets must be"):
        NLICosineLoss()(U, V, [1.0, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        NLICosineLoss()(U, V, [2.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="mapping"):
        NLICosineLoss(mapping="sigmoid")
