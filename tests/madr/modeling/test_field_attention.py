"""Field concatenation and the query-dependent field attention of paper 004 Eq. 8-9, against hand computations."""

import math

import pytest
import torch

from madr.modeling.heads.field_attention import FieldAttention, concat_fields


def test_concat_fields_order_missing_and_blank():
    doc = {"url": "youtube.com/x", "title": "The sound of Bumblebees", "description": "  "}
    assert concat_fields(doc, ["title", "description", "url", "caption"]) == "The sound of Bumblebees [SEP] youtube.com/x"
    assert concat_fields(doc) == "youtube.com/x [SEP] The sound of Bumblebees", "default order is the mapping's"
    assert concat_fields(doc, ["title", "url"], sep=" | ") == "The sound of Bumblebees | youtube.com/x"
    with pytest.raises(ValueError, match="no non-empty field"):
        concat_fields({"title": " "}, ["title"])


def _softmax(xs):
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


def test_bilinear_matches_hand_computation():
    att = FieldAttention(2, scorer="bilinear")  # W = I: a(q, d) = q . d
    q = torch.tensor([[1.0, 0.0]])
    fields = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    out = att(q, fields)
    alpha = _softmax([2.0, 0.0, 1.0])
    assert torch.allclose(out.weights, torch.tensor([alpha]), atol=1e-6), out.weights
    expected = [2 * alpha[0] + alpha[2], alpha[1] + alpha[2]]  # Eq. 8
    assert torch.allclose(out.embedding, torch.tensor([expected]), atol=1e-6), out.embedding


def test_additive_matches_hand_computation():
    att = FieldAttention(2, scorer="additive")
    with torch.no_grad():
        att.query_proj.weight.copy_(torch.eye(2))
        att.field_proj.weight.copy_(torch.eye(2))
        att.field_proj.bias.zero_()
        att.score_vector.weight.copy_(torch.tensor([[1.0, -1.0]]))
    q = torch.tensor([[0.5, -0.5]])
    fields = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    # a(q, d) = tanh(q1 + d1) - tanh(q2 + d2)
    scores = [math.tanh(1.5) - math.tanh(-0.5), math.tanh(0.5) - math.tanh(0.5)]
    alpha = _softmax(scores)
    out = att(q, fields)
    assert torch.allclose(out.weights, torch.tensor([alpha]), atol=1e-6), (out.weights, alpha)
    assert torch.allclose(out.embedding, torch.tensor([alpha]), atol=1e-6), "fields are the unit vectors"


def test_masked_fields_get_zero_weight_and_all_masked_is_an_error():
    att = FieldAttention(2, scorer="bilinear")
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    fields = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]] * 2)
    mask = torch.tensor([[False, True, True], [True, True, True]])
    out = att(q, fields, mask)
    alpha = _softmax([0.0, 1.0])
    assert out.weights[0, 0] == 0.0, "a masked field must get weight exactly 0"
    assert torch.allclose(out.weights[0, 1:], torch.tensor(alpha), atol=1e-6)
    assert torch.allclose(out.embedding[0], torch.tensor([alpha[1], 1.0]), atol=1e-6)
    assert torch.allclose(out.weights.sum(-1), torch.ones(2)), "weights must sum to one per document"
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        att(q, fields, torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match="mask"):
        att(q, fields, torch.ones(2, 2, dtype=torch.bool))


def test_weights_depend_on_the_query_and_grid_matches_pairs():
    torch.manual_seed(0)
    att = FieldAttention(8)
    q = torch.randn(3, 8)
    fields = torch.randn(3, 4, 8)
    mask = torch.tensor([[True, True, False, True], [True, True, True, True], [True, False, False, False]])
    grid = att.grid(q, fields, mask)
    assert grid.embedding.shape == (3, 3, 8) and grid.weights.shape == (3, 3, 4)
    pairs = att(q, fields, mask)
    diagonal = grid.embedding[torch.arange(3), torch.arange(3)]
    assert torch.allclose(diagonal, pairs.embedding, atol=1e-6), "grid diagonal must equal the aligned pairs"
    assert not torch.allclose(grid.weights[0, 1], grid.weights[1, 1]), "two queries must weigh one document differently"
    pairs.embedding.sum().backward()
    assert att.query_proj.weight.grad.abs().sum() > 0, "the scorer must receive a gradient"
