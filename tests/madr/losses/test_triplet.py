"""Triplet loss of paper 004 Eq. 3-7 on 1-D / 2-D embeddings whose distances are known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from madr.losses.triplet import TripletLoss, distance_matrix, pairwise_distance

select = TripletLoss.select_negatives

# Selection fixture: query-positive distances and 4 candidates per query, margin 1.5.
# row 0: d_ap 2   -> in margin (<= 3.5): 1, 3, 3.2; hardest 1 (col 0); closest farther than 2: 3 (col 1)
# row 1: d_ap 1   -> all 4 in margin (<= 2.5); hardest 0.2 (col 2); none farther than 1 -> fallback farthest 0.9 (col 3)
# row 2: d_ap 1   -> none in margin; hardest 2.6 (col 3), which is also the closest farther one
DIST_AP = torch.tensor([2.0, 1.0, 1.0])
DIST_AN = torch.tensor([[1.0, 3.0, 3.2, 10.0], [0.5, 0.8, 0.2, 0.9], [5.0, 4.0, 6.0, 2.6]])
MARGIN = 1.5


def picked(mask: torch.Tensor) -> list[list[int]]:
    return [row.nonzero().flatten().tolist() for row in mask]


def test_batch_all_selects_every_negative_within_the_margin():
    got = picked(select(DIST_AP, DIST_AN, "batch_all", MARGIN))
    assert got == [[0, 1, 2], [0, 1, 2, 3], []], f"Eq. 5 keeps d_an <= d_ap + alpha, got {got}"


def test_hard_selects_the_closest_negative():
    assert picked(select(DIST_AP, DIST_AN, "hard", MARGIN)) == [[0], [2], [3]]


def test_semi_hard_selects_closest_farther_negative_with_farthest_fallback():
    got = picked(select(DIST_AP, DIST_AN, "semi_hard", MARGIN))
    assert got == [[1], [3], [3]], f"Eq. 7 (+ farthest fallback on row 1), got {got}"
    skip = picked(select(DIST_AP, DIST_AN, "semi_hard", MARGIN, semi_hard_fallback="skip"))
    assert skip == [[1], [], [3]], f"skip fallback leaves row 1 without negative, got {skip}"


def test_selection_respects_the_valid_mask():
    valid = torch.ones_like(DIST_AN, dtype=torch.bool)
    valid[0, 0] = False  # the hardest of row 0 is not allowed (e.g. the same document)
    valid[1] = False  # row 1 has no candidate at all
    for mode, expected in (("hard", [[1], [], [3]]), ("batch_all", [[1, 2], [], []]), ("semi_hard", [[1], [], [3]])):
        got = picked(select(DIST_AP, DIST_AN, mode, MARGIN, valid=valid))
        assert got == expected, f"{mode}: expected {expected}, got {got}"


def test_random_draws_one_valid_negative_uniformly_and_reproducibly():
    valid = torch.tensor([[True, True, False, True]] * 3)
    counts = torch.zeros(4)
    gen = torch.Generator().manual_seed(0)
    for _ in range(1000):  # 3000 draws over 3 valid columns: 1000 each, std ~26; tolerance 130 (5 std)
        mask = select(DIST_AP, DIST_AN, "random", MARGIN, valid=valid, generator=gen)
        assert mask.sum(dim=1).tolist() == [1, 1, 1], "exactly one negative per query"
        counts += mask.sum(dim=0)
    assert counts[2] == 0, "an invalid candidate was drawn"
    assert all(abs(c - 1000) < 130 for c in counts[[0, 1, 3]].tolist()), f"not uniform: {counts.tolist()}"
    a = select(DIST_AP, DIST_AN, "random", MARGIN, generator=torch.Generator().manual_seed(3))
    b = select(DIST_AP, DIST_AN, "random", MARGIN, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b), "same seed must give the same draw"


# Loss fixture, 1-D, L1, margin 1.5, same positive id for both rows so only the per-query negatives count:
# q0 = 0,   p0 = 2   (d_ap 2), negatives -1, 3, -3.2, 10 -> d_an 1, 3, 3.2, 10
# q1 = 100, p1 = 101 (d_ap 1), negatives 100.5, 99.2, 100.2, 100.9 -> d_an 0.5, 0.8, 0.2, 0.9
Q = torch.tensor([[0.0], [100.0]])
P = torch.tensor([[2.0], [101.0]])
NEG = torch.tensor([[-1.0, 3.0, -3.2, 10.0], [100.5, 99.2, 100.2, 100.9]]).unsqueeze(-1)
SAME_DOC = torch.tensor([7, 7])


@pytest.mark.parametrize("kwargs, expected", [
    # hard: row 0 2 - 1 + 1.5 = 2.5; row 1 1 - 0.2 + 1.5 = 2.3 -> 2.4
    (dict(negatives="hard"), 2.4),
    # semi-hard: row 0 2 - 3 + 1.5 = 0.5; row 1 fallback 0.9: 1 - 0.9 + 1.5 = 1.6 -> 1.05
    (dict(negatives="semi_hard"), 1.05),
    # semi-hard, skip: (0.5 + 0) / 2
    (dict(negatives="semi_hard", semi_hard_fallback="skip"), 0.25),
    # batch-all, mean hinge: row 0 (2.5 + 0.5 + 0.3) / 3 = 1.1; row 1 (2.0 + 1.7 + 2.3 + 1.6) / 4 = 1.9 -> 1.5
    (dict(negatives="batch_all", batch_all_average="loss"), 1.5),
    # batch-all, Eq. 4 centroid: row 0 mean(-1, 3, -3.2) = -0.4 -> 2 - 0.4 + 1.5 = 3.1;
    # row 1 mean(100.5, 99.2, 100.2, 100.9) = 100.2 -> 1 - 0.2 + 1.5 = 2.3 -> 2.7
    (dict(negatives="batch_all"), 2.7),
    # batch-all, Eq. 4 normaliser as printed (|D| counts d_j): row 0 -1.2 / 4 = -0.3 -> 3.2;
    # row 1 400.8 / 5 = 80.16 -> 1 - 19.84 + 1.5 < 0 -> 0 -> 1.6
    (dict(negatives="batch_all", batch_all_normaliser="paper"), 1.6),
])
def test_loss_value_matches_hand_computation(kwargs, expected):
    loss = TripletLoss(distance="l1", margin=1.5, **kwargs)(Q, P, NEG, positive_ids=SAME_DOC)
    assert abs(loss.item() - expected) < 1e-4, f"{kwargs}: expected {expected}, got {loss.item()}"


def test_in_batch_negatives_and_duplicate_documents():
    # q = 0, 3, 6; p = 1, 5, 6.5; margin 2; candidates are the other rows' positives.
    # row 0: d_ap 1, cands p1 5, p2 6.5 -> hard p1, hinge 1 - 5 + 2 < 0 -> 0
    # row 1: d_ap 2, cands p0 2, p2 3.5 -> hard p0, hinge 2 - 2 + 2 = 2
    # row 2: d_ap .5, cands p0 5, p1 1  -> hard p1, hinge .5 - 1 + 2 = 1.5      -> loss 3.5 / 3
    q, p = torch.tensor([[0.0], [3.0], [6.0]]), torch.tensor([[1.0], [5.0], [6.5]])
    dist_an = distance_matrix(q, p)
    valid = ~torch.eye(3, dtype=torch.bool)
    assert picked(select(pairwise_distance(q, p), dist_an, "hard", 2.0, valid=valid)) == [[1], [0], [1]]
    loss = TripletLoss(margin=2.0, negatives="hard")(q, p)
    assert abs(loss.item() - 3.5 / 3) < 1e-5, f"in-batch hard loss {loss.item()} != 3.5/3"
    # p0 and p1 are the same document: row 0 falls to p2 (0), row 1 to p2 (2 - 3.5 + 2 = .5), row 2 keeps 1.5
    loss = TripletLoss(margin=2.0, negatives="hard")(q, p, positive_ids=torch.tensor([4, 4, 9]))
    assert abs(loss.item() - 2.0 / 3) < 1e-5, f"duplicate documents must not be negatives, got {loss.item()}"


def test_each_distance_by_hand():
    x, y = torch.tensor([[1.0, 2.0]]), torch.tensor([[4.0, -2.0]])
    assert pairwise_distance(x, y, "l1").item() == pytest.approx(7.0), "|1-4| + |2+2| = 7"
    assert pairwise_distance(x, y, "l2").item() == pytest.approx(5.0), "sqrt(9 + 16) = 5"
    assert pairwise_distance(x, y, "cosine").item() == pytest.approx(1.0), "dot 0 -> 1 - 0"
    for name in ("l1", "l2", "cosine"):
        assert distance_matrix(x, y, name).item() == pytest.approx(pairwise_distance(x, y, name).item(), abs=1e-6)
    # one query, positive and one shared negative, hard, margin .5
    q, p, n = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 1.0]])
    expected = {"l1": 2 - 1 + 0.5, "l2": math.sqrt(2) - 1 + 0.5, "cosine": 1 - (1 - 1 / math.sqrt(2)) + 0.5}
    for name, value in expected.items():
        loss = TripletLoss(distance=name, margin=0.5, negatives="hard")(q, p, n)
        assert loss.item() == pytest.approx(value, abs=1e-5), f"{name}: {loss.item()} != {value}"


def test_gradient_reaches_only_the_selected_negative():
    neg = NEG.clone().requires_grad_(True)
    q = Q.clone().requires_grad_(True)
    TripletLoss(margin=1.5, negatives="hard")(q, P, neg, positive_ids=SAME_DOC).backward()
    nonzero = (neg.grad.abs().squeeze(-1) > 0).nonzero().tolist()
    assert nonzero == [[0, 0], [1, 2]], f"only the hardest negatives (cols 0, 2) get gradient, got {nonzero}"
    assert q.grad.abs().sum() > 0, "anchors get gradient"


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="distance"):
        TripletLoss(distance="l3")
    with pytest.raises(ValueError, match="negatives"):
        TripletLoss(negatives="easy")
    with pytest.raises(ValueError, match="margin"):
        TripletLoss(margin=-1.0)
    with pytest.raises(ValueError, match="negatives must be"):
        TripletLoss()(Q, P, torch.zeros(3, 2, 1))
    with pytest.raises(ValueError, match="anchors"):
        TripletLoss()(Q, P[:1])


# Hand-built 2-D batch where the three distances disagree on the hardest negative (query q = (1, 0)):
#   n0 = (2, 1):   L1 2.0, L2 1.414, cosine 1 - 2/sqrt(5)    = 0.106
#   n1 = (1, 1.5): L1 1.5, L2 1.5,   cosine 1 - 1/sqrt(3.25) = 0.445
#   n2 = (5, 0.3): L1 4.3, L2 4.011, cosine 1 - 5/sqrt(25.09) = 0.0018
# hardest: L1 -> n1, L2 -> n0, cosine -> n2.
Q2 = torch.tensor([[1.0, 0.0]])
NEG2 = torch.tensor([[[2.0, 1.0], [1.0, 1.5], [5.0, 0.3]]])


@pytest.mark.parametrize("distance, hardest", [("l1", 1), ("l2", 0), ("cosine", 2)])
def test_hard_negative_depends_on_the_distance(distance, hardest):
    neg = NEG2.clone().requires_grad_(True)
    # positive = the query itself (d_ap = 0) and a wide margin: every hinge is active, so only the selection
    # decides which negative gets a gradient
    TripletLoss(distance=distance, margin=10.0, negatives="hard")(Q2, Q2.clone(), neg).backward()
    got = (neg.grad.abs().sum(-1)[0] > 0).nonzero().flatten().tolist()
    assert got == [hardest], f"{distance}: hardest negative should be n{hardest}, gradient reached {got}"


@pytest.mark.parametrize("distance, d_ap, margin, expected", [
    # semi-hard: closest negative farther than the positive; batch-all: d_an <= d_ap + margin
    ("l1", 1.8, 0.5, {"semi_hard": [0], "batch_all": [0, 1]}),  # farther than 1.8: n0 2.0, n2 4.3; <= 2.3
    ("l2", 1.45, 0.5, {"semi_hard": [1], "batch_all": [0, 1]}),  # farther than 1.45: n1 1.5, n2 4.011; <= 1.95
    ("cosine", 0.05, 0.3, {"semi_hard": [0], "batch_all": [0, 2]}),  # farther than .05: n0 .106, n1 .445; <= .35
])
def test_semi_hard_and_batch_all_follow_the_distance(distance, d_ap, margin, expected):
    dist_an = pairwise_distance(Q2[:, None, :], NEG2, distance)
    for mode, cols in expected.items():
        got = picked(select(torch.tensor([d_ap]), dist_an, mode, margin))
        assert got == [cols], f"{distance} {mode}: expected n{cols}, got {got} (distances {dist_an.tolist()})"
