"""Losses of papers 000 / 001 against small cases computed by hand (expected values in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from madr.losses import (
    AspectPredictionLoss,
    AspectPresenceLoss,
    GroupWiseContrastiveLoss,
    InBatchSoftmaxLoss,
    MLMLoss,
    PointwiseCELoss,
    combine_objectives,
    mask_tokens,
    multi_label_nll,
)

LN2, LN3 = math.log(2.0), math.log(3.0)


def close(actual: torch.Tensor, expected: float, tol: float = 1e-5) -> bool:
    return abs(float(torch.as_tensor(actual).detach()) - expected) < tol


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------- aspect prediction (paper 000 Eq. 3)

def test_aspect_prediction_averages_labels_and_skips_unannotated_rows():
    # row 0: logits (0, ln2, 0) -> softmax (1/4, 1/2, 1/4); labels {0, 1}: -(ln 1/4 + ln 1/2)/2 = 1.5 ln2
    # row 1: logits (0, 0, 0) -> 1/3 each; label {2}: ln3
    # row 2: no label -> excluded: loss = (1.5 ln2 + ln3) / 2, and no gradient into row 2
    logits = torch.tensor([[0.0, LN2, 0.0], [0.0, 0.0, 0.0], [5.0, -5.0, 0.0]], requires_grad=True)
    labels = torch.tensor([[0, 1], [2, -1], [-1, -1]])
    loss = AspectPredictionLoss()(logits, labels)
    assert close(loss, (1.5 * LN2 + LN3) / 2), f"AP loss {float(loss)} != (1.5 ln2 + ln3) / 2"
    loss.backward()
    assert torch.all(logits.grad[2] == 0), f"the unannotated row got gradient {logits.grad[2]}"
    assert logits.grad[:2].abs().sum() > 0, "annotated rows got no gradient"


def test_multi_label_nll_per_row_and_repeated_ids_count_once():
    logits = torch.tensor([[0.0, LN2, 0.0], [float("-inf"), 0.0, 0.0]])
    per_row, has = multi_label_nll(logits, torch.tensor([[1, 1], [-1, -1]]))
    # {1, 1} is the set {1}: -ln(1/2) = ln2; the empty row is exactly 0 even with a -inf logit at id 0
    assert close(per_row[0], LN2), f"repeated id counted twice: {float(per_row[0])} != ln2"
    assert per_row[1] == 0 and has.tolist() == [True, False], f"empty row: loss {per_row[1]}, has {has}"


def test_aspect_prediction_without_any_annotation_is_a_connected_zero():
    logits = torch.randn(2, 4, requires_grad=True)
    loss = AspectPredictionLoss()(logits, torch.full((2, 3), -1))
    assert loss.item() == 0.0 and loss.requires_grad, f"expected a connected zero, got {loss}"
    loss.backward()
    assert torch.all(logits.grad == 0), "an empty batch must not push the logits"


@pytest.mark.parametrize("labels", [torch.tensor([[3]]), torch.tensor([[-2]]), torch.tensor([[0.0]]), torch.tensor([0])])
def test_aspect_prediction_rejects_bad_labels(labels):
    with pytest.raises(ValueError):
        AspectPredictionLoss()(torch.zeros(1, 3), labels)


# ---------------------------------------------------------------- aspect presence (paper 000 Eq. 6)

def test_presence_loss_masks_other_aspect():
    # aspects (category, brand, OTHER); OTHER masked. BCE with logits per included entry:
    #   (2, y=1): softplus(-2)   (-1, y=0): softplus(-1)   (0, y=0): ln2   (3, y=1): softplus(-3)
    # mean over these 4 entries; the OTHER logits (7, -4) and labels are ignored
    logits = torch.tensor([[2.0, -1.0, 7.0], [0.0, 3.0, -4.0]], requires_grad=True)
    labels = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    mask = torch.tensor([True, True, False])
    loss = AspectPresenceLoss()(logits, labels, aspect_mask=mask)
    expected = (softplus(-2) + softplus(-1) + LN2 + softplus(-3)) / 4
    assert close(loss, expected), f"APP loss {float(loss)} != {expected}"
    loss.backward()
    assert torch.all(logits.grad[:, 2] == 0), f"OTHER logits got gradient {logits.grad[:, 2]}"
    assert torch.all(logits.grad[:, :2] != 0), "included entries must get gradient"


def test_presence_loss_unmasked_matches_torch_bce_and_rejects_bad_mask():
    logits, labels = torch.tensor([[0.5, -2.0]]), torch.tensor([[1, 0]])
    expected = F.binary_cross_entropy(torch.sigmoid(logits), labels.float())
    assert close(AspectPresenceLoss()(logits, labels), float(expected)), "unmasked APP != torch BCE"
    with pytest.raises(ValueError):
        AspectPresenceLoss()(logits, labels, aspect_mask=torch.tensor([1, 0]))


# ---------------------------------------------------------------- group-wise contrastive (paper 001 Eq. 2)

def test_group_wise_contrastive_equals_its_formula():
    # h (2 x 2), values e0=(1,0) e1=(0,1) e2=(1,1): a 2 x 3 similarity matrix
    # row 0: h=(1,0) -> sims (1, 0, 1), labels {0, 2}:
    #        -1/2 [log(e^1/(e^1+e^0+e^1)) + log(e^1/(e^1+e^0+e^1))] = log(2e + 1) - 1
    # row 1: h=(0,2) -> sims (0, 2, 2), label {1}: -log(e^2 / (e^0 + e^2 + e^2))
    h = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    values = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], requires_grad=True)
    labels = torch.tensor([[0, 2], [1, -1]])
    e = math.exp
    row0 = -0.5 * (math.log(e(1) / (e(1) + e(0) + e(1))) + math.log(e(1) / (e(1) + e(0) + e(1))))
    row1 = -math.log(e(2) / (e(0) + e(2) + e(2)))
    loss = GroupWiseContrastiveLoss()(h, values, labels)
    assert close(loss, (row0 + row1) / 2), f"Eq. 2 loss {float(loss)} != {(row0 + row1) / 2}"
    loss.backward()
    assert h.grad.abs().sum() > 0 and values.grad.abs().sum() > 0, "no gradient into h or the value table"


def test_group_wise_contrastive_rejects_mismatched_hidden_size():
    with pytest.raises(ValueError):
        GroupWiseContrastiveLoss()(torch.zeros(2, 3), torch.zeros(4, 2), torch.zeros(2, 1, dtype=torch.long))


# ---------------------------------------------------------------- grouping (paper 001 Eq. 3-5)

def _objectives(color_word: float | None):
    values = {("brand", "phrase"): 1.0, ("brand", "word"): 2.0, ("color", "phrase"): 6.0,
              ("color", "word"): 99.0 if color_word is None else color_word}
    losses = {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}
    has = {k: not (k == ("color", "word") and color_word is None) for k in values}
    return losses, has


def test_grouping_differs_when_an_objective_is_missing():
    # present: brand/phrase 1, brand/word 2, color/phrase 6 (color/word has no labels, its 99 is ignored)
    #   single (Eq. 3):      (1 + 2 + 6) / 3                    = 3
    #   granularity (Eq. 4): mean(phrase (1+6)/2, word 2/1)      = (3.5 + 2) / 2 = 2.75
    #   aspect (Eq. 5):      mean(brand (1+2)/2, color 6/1)      = (1.5 + 6) / 2 = 3.75
    for grouping, expected in (("single", 3.0), ("granularity", 2.75), ("aspect", 3.75)):
        losses, has = _objectives(None)
        total = combine_objectives(losses, has, grouping)
        assert close(total, expected), f"{grouping}: {float(total)} != {expected}"
        total.backward()
        grad = losses[("color", "word")].grad
        assert grad is None or float(grad) == 0.0, f"{grouping}: the missing objective got gradient"


def test_grouping_agrees_when_all_objectives_are_present():
    # with color/word = 7: single (1+2+6+7)/4 = 4; granularity mean(3.5, 4.5) = 4; aspect mean(1.5, 6.5) = 4
    for grouping in ("single", "granularity", "aspect"):
        losses, has = _objectives(7.0)
        total = combine_objectives(losses, has, grouping)
        assert close(total, 4.0), f"{grouping}: {float(total)} != 4"
        total.backward()
        assert all(float(v.grad) > 0 for v in losses.values()), f"{grouping}: an objective got no gradient"


def test_grouping_without_labels_is_a_connected_zero_and_bad_input_raises():
    losses, has = _objectives(None)
    total = combine_objectives(losses, dict.fromkeys(has, False), "aspect")
    assert total.item() == 0.0 and total.requires_grad, f"expected a connected zero, got {total}"
    total.backward()
    with pytest.raises(ValueError):
        combine_objectives(losses, has, "token")
    with pytest.raises(ValueError):
        combine_objectives(losses, {("brand", "phrase"): True}, "single")


# ---------------------------------------------------------------- in-batch softmax (000 L_SCE, 001 Eq. 10)

Q = [[1.0, 0.0], [0.0, 1.0]]
POS = [[2.0, 0.0], [1.0, 1.0]]
NEG = [[[0.0, 3.0]], [[1.0, -1.0]]]  # one hard negative per query: [B=2, n=1, d=2]


def nll(scores: list[float], target: int) -> float:
    """-log softmax(scores)[target], written out."""
    return -math.log(math.exp(scores[target]) / sum(math.exp(s) for s in scores))


def test_in_batch_softmax_dot_without_and_with_hard_negatives():
    q, pos, neg = torch.tensor(Q, requires_grad=True), torch.tensor(POS), torch.tensor(NEG)
    # dot: q0 . (pos0, pos1) = (2, 1); q1 . (pos0, pos1) = (0, 1)
    expected = (nll([2, 1], 0) + nll([0, 1], 1)) / 2
    loss = InBatchSoftmaxLoss("dot")(q, pos)
    assert close(loss, expected), f"in-batch dot {float(loss)} != {expected}"
    # + every hard negative of the batch (neg0 = (0,3), neg1 = (1,-1)): q0 -> (2,1,0,1); q1 -> (0,1,3,-1)
    expected = (nll([2, 1, 0, 1], 0) + nll([0, 1, 3, -1], 1)) / 2
    loss = InBatchSoftmaxLoss("dot")(q, pos, neg)
    assert close(loss, expected), f"in-batch dot + hard negatives {float(loss)} != {expected}"
    flat = InBatchSoftmaxLoss("dot")(q, pos, neg.reshape(2, 2))
    assert close(flat, expected), "[B*n, d] negatives must equal [B, n, d] negatives"
    loss.backward()
    assert q.grad.abs().sum() > 0, "no gradient into the queries"


def test_in_batch_softmax_cosine_with_temperature():
    # unit vectors: pos0 (1,0), pos1 (1,1)/r2, neg0 (0,1), neg1 (1,-1)/r2, r2 = sqrt 2; temperature 0.5
    # q0 = (1,0): cos (1, 1/r2, 0, 1/r2);   q1 = (0,1): cos (0, 1/r2, 1, -1/r2); scores = cos / 0.5
    r2 = math.sqrt(2.0)
    s0 = [c / 0.5 for c in (1, 1 / r2, 0, 1 / r2)]
    s1 = [c / 0.5 for c in (0, 1 / r2, 1, -1 / r2)]
    expected = (nll(s0, 0) + nll(s1, 1)) / 2
    q = torch.tensor(Q) * 3.0  # cosine ignores the norm of the queries
    loss = InBatchSoftmaxLoss("cosine", temperature=0.5)(q.requires_grad_(), torch.tensor(POS), torch.tensor(NEG))
    assert close(loss, expected), f"in-batch cosine {float(loss)} != {expected}"
    dot = InBatchSoftmaxLoss("dot", temperature=0.5)(q, torch.tensor(POS), torch.tensor(NEG))
    assert not close(dot, expected), "dot and cosine must differ on unnormalised vectors"
    loss.backward()
    scores = InBatchSoftmaxLoss.scores(torch.tensor(Q), torch.tensor(POS), "cosine")
    assert scores.shape == (2, 2) and close(scores[1, 1], 1 / r2), f"scores helper gave {scores}"


def test_in_batch_softmax_rejects_bad_shapes():
    with pytest.raises(ValueError):
        InBatchSoftmaxLoss()(torch.zeros(2, 3), torch.zeros(3, 3))
    with pytest.raises(ValueError):
        InBatchSoftmaxLoss()(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 1, 3))
    with pytest.raises(ValueError):
        InBatchSoftmaxLoss(similarity="l2")


# ---------------------------------------------------------------- pointwise CE (paper 000 L_CE)

def test_pointwise_ce_cosine_matches_torch_bce():
    # cos((1,0), (1,1)) = 1/sqrt2; cos((3,4), (4,-3)) = 0. Initial scale 10, bias set to 0.5:
    # logits (10/sqrt2 + 0.5, 0.5); graded targets (1, 0.5)
    loss_fn = PointwiseCELoss(similarity="cosine")
    with torch.no_grad():
        loss_fn.bias.fill_(0.5)
    q = torch.tensor([[1.0, 0.0], [3.0, 4.0]], requires_grad=True)
    d = torch.tensor([[1.0, 1.0], [4.0, -3.0]])
    target = torch.tensor([1.0, 0.5])
    expected = F.binary_cross_entropy(torch.sigmoid(torch.tensor([10 / math.sqrt(2) + 0.5, 0.5])), target)
    loss = loss_fn(q, d, target)
    assert close(loss, float(expected)), f"pointwise CE {float(loss)} != torch BCE {float(expected)}"
    loss.backward()
    assert q.grad.abs().sum() > 0 and loss_fn.log_scale.grad is not None and loss_fn.bias.grad is not None, \
        "gradient must reach the queries, the scale and the bias"


def test_pointwise_ce_dot_with_fixed_scale():
    # dot((1,0), (1,1)) = 1; dot((0,1), (2,-1)) = -1; fixed scale 2, bias 0: logits (2, -2); targets (1, 0)
    loss_fn = PointwiseCELoss(similarity="dot", learn_scale=False, init_scale=2.0)
    assert [n for n, _ in loss_fn.named_parameters()] == ["bias"], "a fixed scale must not be a parameter"
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    d = torch.tensor([[1.0, 1.0], [2.0, -1.0]])
    target = torch.tensor([1.0, 0.0])
    expected = F.binary_cross_entropy(torch.sigmoid(torch.tensor([2.0, -2.0])), target)
    loss = loss_fn(q, d, target)
    assert close(loss, float(expected)), f"pointwise CE {float(loss)} != torch BCE {float(expected)}"
    loss.backward()
    with pytest.raises(ValueError):
        loss_fn(q, d, torch.tensor([1.0, 2.0]))


# ---------------------------------------------------------------- MLM (paper 001 Eq. 8)

PAD, CLS, SEP, MASK, UNK = 0, 1, 2, 3, 4
SPECIAL = [PAD, CLS, SEP, MASK, UNK]
VOCAB = 50


def _batch(rows: int = 256, length: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] words [SEP] [PAD]...; lengths vary from 8 to `length`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, length), generator=g)
    lengths = torch.randint(8, length + 1, (rows,), generator=g)
    pos = torch.arange(length)
    attention = (pos[None, :] < lengths[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(rows), lengths - 1] = SEP
    ids[attention == 0] = PAD
    return ids, attention


def test_mask_tokens_never_touches_specials_or_padding_and_masks_15_percent():
    ids, attention = _batch()
    original = ids.clone()
    masked, labels = mask_tokens(ids, attention, MASK, VOCAB, SPECIAL, probability=0.15,
                                 generator=torch.Generator().manual_seed(1))
    assert torch.equal(ids, original), "mask_tokens modified its input"
    protected = (attention == 0) | torch.isin(ids, torch.tensor(SPECIAL))
    assert torch.all(labels[protected] == -100), "a special token or padding was chosen"
    assert torch.equal(masked[protected], ids[protected]), "a special token or padding was changed"
    chosen = labels != -100
    assert torch.equal(labels[chosen], ids[chosen]), "labels must be the original ids"
    # ~ 8000 candidates: the rate's std is sqrt(.15 * .85 / 8000) ~ 0.004; tolerance 0.02 (5 std)
    rate = chosen.sum().item() / (~protected).sum().item()
    assert abs(rate - 0.15) < 0.02, f"masked {rate:.3f} of the tokens, expected 0.15 +- 0.02"
    # of ~1200 chosen: 80% [MASK] (std ~0.012, tolerance 0.05); the rest random non-special or kept
    as_mask = (masked[chosen] == MASK).float().mean().item()
    assert abs(as_mask - 0.8) < 0.05, f"{as_mask:.3f} of chosen tokens became [MASK], expected 0.8 +- 0.05"
    replaced = chosen & (masked != MASK) & (masked != ids)
    assert not torch.isin(masked[replaced], torch.tensor(SPECIAL)).any(), "a random replacement was special"
    assert 0.03 < replaced.sum().item() / chosen.sum().item() < 0.15, "random replacements should be ~10%"


def test_mask_tokens_is_reproducible_and_validates():
    ids, attention = _batch(rows=4)
    a = mask_tokens(ids, attention, MASK, VOCAB, SPECIAL, generator=torch.Generator().manual_seed(3))
    b = mask_tokens(ids, attention, MASK, VOCAB, SPECIAL, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "the same generator seed must give the same mask"
    with pytest.raises(ValueError):
        mask_tokens(ids, attention[:, :3], MASK, VOCAB, SPECIAL)
    with pytest.raises(ValueError):
        mask_tokens(ids, attention, MASK, VOCAB, SPECIAL, probability=1.5)


def test_mlm_loss_ignores_unmasked_positions():
    # one row of 3 positions, only position 1 is masked (label 2): loss = -log_softmax(logits[0, 1])[2]
    logits = torch.tensor([[[9.0, 0.0, 0.0, 0.0], [0.0, LN2, LN3, 0.0], [0.0, 0.0, 0.0, 9.0]]], requires_grad=True)
    labels = torch.tensor([[-100, 2, -100]])
    # softmax of (0, ln2, ln3, 0) = (1, 2, 3, 1) / 7 -> -log(3/7)
    loss = MLMLoss()(logits, labels)
    assert close(loss, math.log(7 / 3)), f"MLM loss {float(loss)} != log(7/3)"
    loss.backward()
    assert torch.all(logits.grad[0, [0, 2]] == 0), "ignored positions got gradient"
    empty = MLMLoss()(logits, torch.full((1, 3), -100))
    assert empty.item() == 0.0 and empty.requires_grad, f"no masked token: expected a connected zero, got {empty}"
    with pytest.raises(ValueError):
        MLMLoss()(logits, labels[:, :2])
