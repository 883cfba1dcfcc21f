"""Synthetic product-QA evidence ranking: determinism, candidate layout, and the signals the world needs."""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict

import pytest

from madr.data.records import EVIDENCE_SOURCES
from madr.data.synthetic.pqa import (
    ATTRIBUTES,
    CANDIDATES_PER_QUESTION,
    generate_pqa,
    make_products,
    split_records,
)


@pytest.fixture(scope="module")
def records():
    return generate_pqa(num_products=200, num_questions=600, seed=5)


@pytest.fixture(scope="module")
def by_question(records):
    groups = defaultdict(list)
    for r in records:
        groups[r.question_id].append(r)
    return groups


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_deterministic_per_seed():
    a, b, c = generate_pqa(40, 50, seed=2), generate_pqa(40, 50, seed=2), generate_pqa(40, 50, seed=3)
    assert a == b, "same seed must give identical records"
    assert [r.question for r in a] != [r.question for r in c], "another seed gives other questions"


def test_candidate_layout(by_question):
    lo, hi = CANDIDATES_PER_QUESTION
    sizes = [len(rs) for rs in by_question.values()]
    assert lo <= min(sizes) and max(sizes) <= hi + 4, f"candidates per question {min(sizes)}..{max(sizes)}"
    assert sum(lo <= s <= hi for s in sizes) / len(sizes) > 0.95, "almost all questions have 6-15 candidates"
    for qid, rs in by_question.items():
        labels = [r.label for r in rs]
        assert 1 <= sum(labels) <= 3 and 0 in labels, f"{qid}: 1-3 positives and some negatives, got {labels}"
        assert len({(r.question, r.split, r.product_id) for r in rs}) == 1, f"{qid}: one question, split, product"
        assert len({r.evidence_id for r in rs}) == len(rs) and all(r.evidence_id.startswith(qid) for r in rs)


def test_splits_by_question_and_sources(records, by_question):
    splits = Counter(rs[0].split for rs in by_question.values())
    assert splits == {"train": 420, "dev": 90, "test": 90}, splits
    assert {r.source for r in records} == set(EVIDENCE_SOURCES), "all six sources occur"
    assert all(r.split == "dev" for r in split_records(records, "dev"))
    with pytest.raises(ValueError, match="split"):
        split_records(records, "validation")


def test_ids_carry_no_label(by_question):
    # metrics break ties by id: positives must not sit at fixed positions
    first_positive = sum(rs[0].label for rs in by_question.values()) / len(by_question)
    rate = sum(r.label for rs in by_question.values() for r in rs) / sum(len(rs) for rs in by_question.values())
    assert abs(first_positive - rate) < 0.08, f"first candidate positive {first_positive:.2f} vs rate {rate:.2f}"


def test_positives_state_the_asked_value():
    recs = generate_pqa(60, 150, seed=11)
    products = {p.product_id: p for p in make_products(60, random.Random(11))}  # the generator's first draw
    for r in recs:
        value = products[r.product_id].value(r.extra["attribute"]).lower()
        if r.label == 1:
            assert value in r.evidence.lower(), f"positive {r.evidence!r} lacks {value!r}"
        elif r.extra["kind"] in ("sibling_trap", "wrong_answer"):
            assert value not in _words(r.evidence.lower()) or " " in value, f"{r.evidence!r} states the answer"


def test_world_needs_exact_tokens_and_paraphrases(by_question):
    exact_trap = paraphrase = positives = 0
    for rs in by_question.values():
        q = rs[0]
        if q.extra["ref_kind"] == "model":
            model = re.search(r"[A-Z]{2}-\d{4}", q.question).group(0)
            siblings = [r for r in rs if r.extra["kind"] == "sibling_trap"]
            for s in siblings:  # same prefix, other number: only the exact token tells them apart
                other = re.search(r"[A-Za-z]{2}-\d{4}", s.evidence).group(0).upper()
                assert other[:2] == model[:2] and other != model, (q.question, s.evidence)
            exact_trap += bool(siblings)
        keywords = _words(" ".join(ATTRIBUTES[q.extra["attribute"]]["questions"]).replace("{ref}", ""))
        asked = _words(q.question) & keywords - {"the", "is", "of", "what", "does", "in", "a"}
        for r in rs:
            if r.label == 1:
                positives += 1
                paraphrase += not (asked & _words(r.evidence))
    assert exact_trap >= 150, f"questions by model number with a sibling trap: {exact_trap}"
    assert paraphrase / positives > 0.3, f"positives sharing no question keyword: {paraphrase / positives:.2f}"


def test_sources_differ_in_reliability(records):
    rate = {s: sum(r.label for r in records if r.source == s) / sum(r.source == s for r in records)
            for s in EVIDENCE_SOURCES}
    assert rate["attribute"] > 0.4 and rate["review"] < 0.1 and rate["cqa"] < 0.15, rate


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_products"):
        generate_pqa(num_products=1, num_questions=5)
    with pytest.raises(ValueError, match="num_questions"):
        generate_pqa(num_products=10, num_questions=0)
