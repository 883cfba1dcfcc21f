"""Levenshtein distance, similarity and the edit-distance ranker (paper 004 Sec. VI-D, Table III baseline)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from madr.search.edit_distance import (
    char_levenshtein,
    edit_distance_scores,
    levenshtein,
    rank_by_edit_distance,
    similarity,
    token_levenshtein,
)


def reference(a, b) -> int:
    """The textbook O(len(a) * len(b)) Python DP, for cross-checking."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


@pytest.mark.parametrize("a, b, expected", [
    ("kitten", "sitting", 3),  # k->s, e->i, +g
    ("flaw", "lawn", 2),  # -f, +n
    ("saturday", "sunday", 3),  # -a, -t, r->n
    ("", "", 0),
    ("", "abc", 3),
    ("abc", "", 3),
    ("same", "same", 0),
    ("ab", "ba", 2),  # no transpositions in Levenshtein
])
def test_hand_computed_character_distances(a, b, expected):
    assert char_levenshtein(a, b) == expected, f"d({a!r}, {b!r}) should be {expected}"
    assert char_levenshtein(b, a) == expected, "the distance is symmetric"


@pytest.mark.parametrize("a, b, expected", [
    ("跑鞋", "登山靴", 3),  # no shared character: 2 substitutions + 1 insertion
    ("浅灰色的跑鞋", "深灰色的跑鞋", 1),  # one CJK character differs
    ("日本語", "日本", 1),
    ("кроссовки", "кросовки", 1),  # Cyrillic: one deletion
    ("a😀", "a", 1),  # a non-BMP code point is one character (not two UTF-16 units, not four bytes)
    ("légers", "legers", 1),  # é (one code point, NFC) vs e
])
def test_unicode_counts_code_points(a, b, expected):
    assert char_levenshtein(a, b) == expected, f"d({a!r}, {b!r}) should be {expected} code-point edits"


def test_matches_the_reference_dp_on_random_strings():
    rng = random.Random(0)
    for _ in range(400):
        a = "".join(rng.choice("abc跑鞋") for _ in range(rng.randint(0, 9)))
        b = "".join(rng.choice("abc跑鞋") for _ in range(rng.randint(0, 9)))
        assert char_levenshtein(a, b) == reference(a, b), f"numpy DP differs from the reference on {a!r}, {b!r}"


def test_token_level_distance():
    assert token_levenshtein("the red running shoes", "the blue running shoes are") == 2, "red->blue, +are"
    assert token_levenshtein([101, 7, 9], [101, 9]) == 1, "token ids work: one deletion"
    assert token_levenshtein("a-b c", "a-b d", tokenize=lambda s: s.replace("-", " ").split()) == 1
    assert token_levenshtein([], ["x", "y"]) == 2
    assert levenshtein("red shoes", "blue shoes", level="token") == 1
    assert levenshtein("red shoes", "blue shoes", level="char") == 4, "red -> blue: r->b, e->l, d->u, +e"


def test_similarity():
    assert similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7), "1 - d / max(len)"
    assert similarity("", "") == 1.0, "two empty strings are identical"
    assert similarity("abc", "xyz") == 0.0 and similarity("", "abc") == 0.0
    assert similarity("跑鞋", "跑鞋") == 1.0
    assert similarity("the red shoes", "the blue shoes", level="token") == pytest.approx(1 - 1 / 3)


def test_ranker_orders_by_similarity_and_keeps_ties_in_order():
    cands = ["blue shoes", "Red Shoe", "socks", "red shoes", "xxxxxxxxx"]
    scores, idx = rank_by_edit_distance("red shoes", cands)
    assert idx.tolist() == [3, 1, 0, 2, 4], f"exact, then 1 edit (lowercased), then 4 edits...; got {idx}"
    assert scores[0] == 1.0 and scores[1] == pytest.approx(1 - 1 / 9)
    assert np.all(np.diff(scores) <= 0), "best first"
    _, idx = rank_by_edit_distance("ab", ["ax", "xb", "ab"], k=2)
    assert idx.tolist() == [2, 0], "k cuts the list; the tie (ax, xb) keeps candidate order"
    cased = edit_distance_scores("red shoes", ["Red Shoes"], lowercase=False)
    assert cased[0] == pytest.approx(1 - 2 / 9), "without lowercasing R and S differ"


def test_distance_score_prefers_short_candidates():
    scores, idx = rank_by_edit_distance("shoes", ["running shoes for men", "shoe"], score="distance")
    assert idx.tolist() == [1, 0] and scores.tolist() == [-1.0, -16.0], "raw -d: 1 vs 16 insertions"


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="must be str"):
        char_levenshtein(["a"], "a")
    with pytest.raises(ValueError, match="level must be one of"):
        similarity("a", "b", level="word")
    with pytest.raises(ValueError, match="single str"):
        edit_distance_scores("a", "abc")
    with pytest.raises(ValueError, match="candidate 1 must be a str"):
        edit_distance_scores("a", ["a", ["a"]])
    with pytest.raises(ValueError, match="k must be"):
        rank_by_edit_distance("a", ["a"], k=-1)


def test_batched_scores_match_the_pairwise_distance():
    """`edit_distance_scores` runs one padded DP for all candidates; it must equal the one-pair DP."""
    rng = random.Random(1)
    alphabet = "abc跑鞋й "
    for _ in range(30):
        query = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        cands = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 15))) for _ in range(rng.randint(1, 8))]
        got = edit_distance_scores(query, cands, score="distance", lowercase=False)
        expected = [-reference(query, c) for c in cands]
        assert got.tolist() == expected, f"batched DP differs for {query!r} vs {cands}"
        sims = edit_distance_scores(query, cands, lowercase=False)
        assert np.allclose(sims, [similarity(query, c) for c in cands]), "similarity = 1 - d / max length"
    tokens = edit_distance_scores("the red shoes", ["the blue shoes", "red", ""], level="token", score="distance")
    assert tokens.tolist() == [-1.0, -2.0, -3.0], f"token level: {tokens}"
    assert edit_distance_scores("abc", []).shape == (0,), "no candidates, no scores"
