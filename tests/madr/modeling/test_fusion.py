"""Aspect fusion networks against hand computations (paper 000 Eq. 4-5, Sec. 6.3; paper 001 Eq. 6-7)."""

import math

import torch

from madr.modeling.fusion import CLSGating, PresenceWeighting, WeightedSum


def _components():
    # B=1, K=2, H=2: E_1 = [1, 0], E_2 = [0, 2]
    return torch.tensor([[[1.0, 0.0], [0.0, 2.0]]]), torch.tensor([[0.5, -0.5]])


def test_weighted_sum_is_softmax_of_gamma():
    comps, cls = _components()
    f = WeightedSum(2, 2)
    with torch.no_grad():
        f.gamma.copy_(torch.tensor([0.0, math.log(3.0)]))  # softmax -> [1/4, 3/4]
    out = f(comps, cls)
    assert torch.allclose(out.weights, torch.tensor([[0.25, 0.75]])), out.weights
    assert torch.allclose(out.embedding, torch.tensor([[0.25, 1.5]])), out.embedding


def test_presence_weighting_hand_computed_and_sums_to_one():
    comps, cls = _components()
    f = PresenceWeighting(2, 2)
    with torch.no_grad():
        f.presence_weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))  # logits: [1, 0]
        f.presence_bias.zero_()
        f.raw_gamma.copy_(torch.tensor([0.5413, 0.5413]))  # softplus ~ 1.0 each
    out = f(comps, cls)
    p = torch.sigmoid(torch.tensor([1.0, 0.0]))  # presence probabilities
    expected = p / p.sum()  # Eq. 5 with equal gamma, L1-normalised
    assert torch.allclose(out.weights[0], expected, atol=1e-4), (out.weights, expected)
    assert torch.allclose(out.presence_logits, torch.tensor([[1.0, 0.0]]))
    # random inputs: weights always sum to one and are non-negative
    f2 = PresenceWeighting(4, 8)
    w = f2(torch.randn(5, 4, 8), torch.randn(5, 8)).weights
    assert torch.allclose(w.sum(-1), torch.ones(5), atol=1e-6), w.sum(-1)
    assert (w >= 0).all()


def test_absent_presence_zeroes_the_aspect_weight():
    # paper 000 Table 8: colour not present (presence ~0) -> weight ~0
    comps = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    f = PresenceWeighting(2, 2)
    with torch.no_grad():
        f.presence_weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 0.0]]))
        f.presence_bias.copy_(torch.tensor([20.0, -20.0]))
    w = f(comps, comps[:, 0]).weights.detach()
    assert w[0, 1] < 1e-6 and abs(float(w[0, 0]) - 1.0) < 1e-6, w


def test_cls_gating_softmax_of_linear_cls():
    comps, cls = _components()
    f = CLSGating(2, 2)
    with torch.no_grad():
        f.gate.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
        f.gate.bias.zero_()
    out = f(comps, cls)  # logits = [1.0, 0.0]
    w = torch.softmax(torch.tensor([1.0, 0.0]), 0)
    assert torch.allclose(out.weights[0], w), out.weights
    assert torch.allclose(out.embedding[0], w[0] * comps[0, 0] + w[1] * comps[0, 1])


def test_mask_excludes_components():
    comps = torch.randn(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    for f in (WeightedSum(3, 4), PresenceWeighting(3, 4), CLSGating(3, 4)):
        w = f(comps, comps[:, 0], mask).weights
        assert torch.all(w[mask == 0] == 0), (type(f).__name__, w)
        assert torch.allclose(w.sum(-1), torch.ones(2), atol=1e-6)
