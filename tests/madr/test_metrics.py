"""Tests for madr.metrics: hand-computed cases, a cross-check against ranx / sklearn, input errors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from madr.metrics import (
    ESCI_GAINS,
    aspect_accuracy_at_1,
    esci_qrels,
    evaluate,
    parse_metric,
    rank_documents,
    roc_auc,
)
from tests.ranx_oracle import interpreted_ranx

LOG2_3 = math.log2(3)  # 1.5849625
LOG2_5 = math.log2(5)  # 2.3219281

# One query. Ranking by score: d1 d2 d3 d4 d5. Grades: d1 0, d2 2, d3 unjudged (0), d4 1, d5 unjudged,
# d6 3 (judged, not retrieved). Threshold 1 -> relevant {d2, d4, d6}, R = 3, hits = [0, 1, 0, 1, 0].
RUN = {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7, "d4": 0.6, "d5": 0.5}}
QRELS = {"q1": {"d1": 0.0, "d2": 2.0, "d4": 1.0, "d6": 3.0}}


def _one(metric: str, **kwargs) -> float:
    return evaluate(RUN, QRELS, [metric], **kwargs)[metric]


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("recall@2", 1 / 3),  # {d2} of {d2, d4, d6}
        ("recall@5", 2 / 3),  # {d2, d4}
        ("recall", 2 / 3),  # whole ranking: d6 never retrieved
        ("precision@1", 0.0),  # d1 not relevant
        ("p@2", 1 / 2),  # d2 in top 2
        ("precision@5", 2 / 5),
        ("precision@10", 2 / 10),  # divides by k even though only 5 were retrieved
        ("hit@1", 0.0),
        ("hit@2", 1.0),
        ("hit_rate@5", 1.0),
        ("mrr@1", 0.0),
        ("mrr@5", 1 / 2),  # first relevant at rank 2
        ("map", (1 / 2 + 2 / 4) / 3),  # P@2 = 1/2, P@4 = 2/4, divided by R = 3 -> 1/3
        ("map@3", (1 / 2) / 3),  # only rank 2 is inside the cutoff
        ("r_precision", 1 / 3),  # P@3 = 1/3 (d2 only)
        ("rprec", 1 / 3),
    ],
)
def test_binary_metrics_hand_computed(metric: str, expected: float) -> None:
    got = _one(metric)
    assert got == pytest.approx(expected), f"{metric}: expected {expected}, got {got}"


def test_binary_metrics_respect_threshold() -> None:
    # Threshold 2 -> relevant {d2, d6}, R = 2: recall@5 = 1/2, map = (1/2) / 2 = 1/4, r_precision = P@2 = 1/2.
    got = evaluate(RUN, QRELS, ["recall@5", "map", "r_precision"], relevance_threshold=2)
    expected = {"recall@5": 0.5, "map": 0.25, "r_precision": 0.5}
    assert got == pytest.approx(expected), f"threshold 2: expected {expected}, got {got}"


def test_dcg_ndcg_exp2_hand_computed() -> None:
    # Grades in rank order [0, 2, 0, 1, 0] -> exp2 gains [0, 3, 0, 1, 0]:
    # DCG@5 = 3 / log2(3) + 1 / log2(5) = 1.892789 + 0.430677 = 2.323466.
    # Ideal: judged grades {0, 2, 1, 3} -> gains sorted [7, 3, 1, 0]: IDCG@5 = 7 + 3 / log2(3) + 1 / 2 = 9.392789.
    dcg = 3 / LOG2_3 + 1 / LOG2_5
    idcg = 7 + 3 / LOG2_3 + 1 / 2
    got = evaluate(RUN, QRELS, ["dcg@5", "ndcg@5", "ndcg@1"])
    assert got["dcg@5"] == pytest.approx(dcg), f"dcg@5: expected {dcg}, got {got['dcg@5']}"
    assert got["ndcg@5"] == pytest.approx(dcg / idcg), (
        f"ndcg@5: expected {dcg / idcg:.6f}, got {got['ndcg@5']}"
    )
    assert got["ndcg@1"] == 0.0, f"ndcg@1: top doc d1 has grade 0, expected 0, got {got['ndcg@1']}"


def test_ndcg_linear_and_mapping_gains() -> None:
    # linear: DCG@2 = 0 + 2 / log2(3) = 1.261860; IDCG@2 = 3 + 2 / log2(3) = 4.261860 -> 0.296081.
    expected_linear = (2 / LOG2_3) / (3 + 2 / LOG2_3)
    got = _one("ndcg@2", gains="linear")
    assert got == pytest.approx(expected_linear), f"linear ndcg@2: expected {expected_linear:.6f}, got {got}"
    # mapping {0: 0, 1: 1, 2: 10, 3: 100}: DCG@2 = 10 / log2(3) = 6.309298.
    got = _one("dcg@2", gains={0: 0.0, 1: 1.0, 2: 10.0, 3: 100.0})
    assert got == pytest.approx(10 / LOG2_3), f"mapping dcg@2: expected {10 / LOG2_3:.6f}, got {got}"


def test_auc_hand_computed() -> None:
    # Threshold 2: positives d2 (0.8), d6 (not retrieved -> -inf); negatives d1 (0.9), d4 (0.6).
    # Pairs (pos > neg): d2>d1 no, d2>d4 yes, d6>d1 no, d6>d4 no -> 1/4.
    assert _one("auc", relevance_threshold=2) == pytest.approx(0.25), "auc at threshold 2 should be 1/4"
    # Ties count 1/2: pos [1.0, 0.5] vs neg [0.5, 0.0] -> 1 + 1 + 0.5 + 1 = 3.5 of 4 pairs.
    got = roc_auc([1.0, 0.5, 0.5, 0.0], [True, True, False, False])
    assert got == pytest.approx(0.875), f"tied auc: expected 0.875, got {got}"
    assert math.isnan(roc_auc([0.1, 0.2], [True, True])), "auc with one class must be NaN"


def test_corpus_averaging_rules() -> None:
    run = {
        "q1": {"a": 0.9, "b": 0.1},  # relevant a at rank 1 -> mrr 1, auc 1
        "q2": {"a": 0.9},  # no relevant doc in qrels -> 0 (like ranx), counted; auc skipped
        "q_extra": {"a": 1.0},  # not in qrels -> ignored
    }
    qrels = {"q1": {"a": 1.0, "b": 0.0}, "q2": {"a": 0.0}, "q3": {"a": 1.0, "b": 0.0}}
    # q3 is missing from the run: mrr 0, and its judged docs all score -inf -> auc 0.5.
    got = evaluate(run, qrels, ["mrr@10", "auc"])
    assert got["mrr@10"] == pytest.approx((1 + 0 + 0) / 3), f"mrr over q1,q2,q3: got {got['mrr@10']}"
    assert got["auc"] == pytest.approx((1.0 + 0.5) / 2), f"auc over q1,q3 only: got {got['auc']}"
    per = evaluate(run, qrels, ["mrr@10", "auc"], per_query=True)
    assert per["mrr@10"] == {"q1": 1.0, "q2": 0.0, "q3": 0.0}, f"per-query mrr: {per['mrr@10']}"
    assert set(per["auc"]) == {"q1", "q3"}, f"auc lists only two-class queries: {per['auc']}"
    assert math.isnan(evaluate(run, {"q2": {"a": 0.0}}, ["auc"])["auc"]), "no two-class query -> NaN auc"


def test_ties_broken_by_doc_id() -> None:
    assert rank_documents({"b": 1.0, "a": 1.0, "c": 2.0}) == ["c", "a", "b"], "tie a/b: doc id ascending"
    # Same run in two insertion orders must give the same value: a (relevant) wins the tie at rank 1.
    qrels = {"q": {"a": 1.0}}
    first = evaluate({"q": {"b": 0.5, "a": 0.5}}, qrels, ["mrr@10"])["mrr@10"]
    second = evaluate({"q": {"a": 0.5, "b": 0.5}}, qrels, ["mrr@10"])["mrr@10"]
    assert first == second == 1.0, f"tie-break must not depend on dict order: {first}, {second}"


def test_esci_qrels_and_gains() -> None:
    qrels = esci_qrels({"q": {"a": "E", "b": "substitute", "c": "c", "d": "I"}})
    assert qrels == {"q": {"a": 1.0, "b": 0.1, "c": 0.01, "d": 0.0}}, f"esci grades: {qrels}"
    assert ESCI_GAINS == {"E": 1.0, "S": 0.1, "C": 0.01, "I": 0.0}
    run = {"q": {"b": 4.0, "a": 3.0, "c": 2.0, "d": 1.0}}
    # Gains in rank order [0.1, 1, 0.01, 0]: DCG = 0.1 + 1 / log2(3) + 0.01 / 2 = 0.735930;
    # ideal [1, 0.1, 0.01, 0]: 1 + 0.1 / log2(3) + 0.01 / 2 = 1.068093 -> NDCG = 0.689012.
    expected = (0.1 + 1 / LOG2_3 + 0.005) / (1 + 0.1 / LOG2_3 + 0.005)
    got = evaluate(run, qrels, ["ndcg@4", "recall@1", "recall@2"], gains="linear", relevance_threshold=1.0)
    assert got["ndcg@4"] == pytest.approx(expected), (
        f"ESCI ndcg@4: expected {expected:.6f}, got {got['ndcg@4']}"
    )
    assert got["recall@1"] == 0.0, "S at rank 1 must not count as relevant"
    assert got["recall@2"] == 1.0, "E at rank 2 is the only relevant doc"
    with pytest.raises(ValueError, match="'X'"):
        esci_qrels({"q": {"a": "X"}})


def test_aspect_accuracy_at_1() -> None:
    # 1 in {1, 5} yes; 2 in {3} no; empty gold skipped; 4 in [4] yes -> 2 / 3.
    got = aspect_accuracy_at_1([1, 2, 3, 4], [{1, 5}, {3}, set(), [4]])
    assert got == pytest.approx(2 / 3), f"accuracy@1: expected 2/3, got {got}"
    assert math.isnan(aspect_accuracy_at_1([1], [[]])), "all-empty gold -> NaN"
    with pytest.raises(ValueError, match="2 examples"):
        aspect_accuracy_at_1([1, 2], [{1}])


def test_parse_metric() -> None:
    assert parse_metric("NDCG@5").k == 5 and parse_metric("NDCG@5").kind == "ndcg"
    assert parse_metric("p@1").kind == "precision", "p is an alias of precision"
    assert parse_metric("map").k is None, "map without @k uses the whole ranking"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metrics": ["ndcg@5", "foo@3"]}, "foo@3"),
        ({"metrics": ["auc@5"]}, "auc@5"),
        ({"metrics": ["ndcg@0"]}, "ndcg@0"),
        ({"metrics": []}, "metrics is empty"),
        ({"metrics": ["ndcg@5"], "gains": "cubic"}, "cubic"),
        ({"metrics": ["ndcg@5"], "gains": {0: 0.0, 1: 1.0}}, r"\[2.0, 3.0\]"),
        ({"metrics": ["recall@5"], "relevance_threshold": 0}, "relevance_threshold"),
    ],
)
def test_input_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(RUN, QRELS, **kwargs)


def test_bad_values_are_named() -> None:
    with pytest.raises(ValueError, match=r"'q1'.*'d2'.*NaN"):
        evaluate({"q1": {"d1": 1.0, "d2": float("nan")}}, QRELS, ["ndcg@5"])
    with pytest.raises(ValueError, match=r"'q1'.*'d4'"):
        evaluate(RUN, {"q1": {"d1": 1.0, "d4": float("inf")}}, ["ndcg@5"])
    with pytest.raises(ValueError, match="qrels is empty"):
        evaluate(RUN, {}, ["ndcg@5"])


# ---------------------------------------------------------------------------------------------------------
# Cross-check against ranx and sklearn on random data (continuous scores: no ties).
# ---------------------------------------------------------------------------------------------------------


@dataclass
class RandomData:
    """Same random data as dicts (for madr.metrics) and as ranx's low-level per-query arrays."""

    run: dict
    qrels: dict
    run_arrays: np.ndarray  # [Q, 50, 2]: (doc number, score), score descending
    qrels_arrays: np.ndarray  # [Q, 25, 2]: (doc number, grade), grade descending


@pytest.fixture(scope="module")
def random_data() -> RandomData:
    rng = np.random.default_rng(0)
    n_queries, n_retrieved, n_judged = 30, 50, 25
    run_arrays = np.zeros((n_queries, n_retrieved, 2))
    qrels_arrays = np.zeros((n_queries, n_judged, 2))
    run, qrels = {}, {}
    for q in range(n_queries):
        scores = rng.random(n_retrieved)
        judged = rng.choice(60, size=n_judged, replace=False)  # judged docs 50-59 are never retrieved
        grades = rng.choice(4, size=n_judged, p=[0.6, 0.2, 0.1, 0.1]).astype(np.float64)
        if q == 0:
            grades[:] = 0  # one query without any relevant doc
        order = np.argsort(-scores)
        run_arrays[q] = np.stack([order, scores[order]], axis=1)
        order = np.argsort(-grades, kind="stable")
        qrels_arrays[q] = np.stack([judged[order], grades[order]], axis=1)
        run[f"q{q}"] = {f"d{d}": float(s) for d, s in enumerate(scores)}
        qrels[f"q{q}"] = {f"d{d}": float(g) for d, g in zip(judged, grades, strict=True)}
    return RandomData(run, qrels, run_arrays, qrels_arrays)


# (our metric, ranx metric, k for ranx (0 = all), gains): ranx "ndcg"/"dcg" use linear gains (Jarvelin et
# al.), "ndcg_burges"/"dcg_burges" use 2^rel - 1 (Burges et al.).
CROSS_CHECKS = [
    ("recall@10", "recall", 10, "exp2"),
    ("ndcg@10", "ndcg_burges", 10, "exp2"),
    ("ndcg@10", "ndcg", 10, "linear"),
    ("ndcg", "ndcg_burges", 0, "exp2"),
    ("dcg@5", "dcg_burges", 5, "exp2"),
    ("dcg@5", "dcg", 5, "linear"),
    ("mrr@5", "mrr", 5, "exp2"),
    ("mrr", "mrr", 0, "exp2"),
    ("map", "map", 0, "exp2"),
    ("map@20", "map", 20, "exp2"),
    ("r_precision", "r-precision", 0, "exp2"),
    ("hit@5", "hit_rate", 5, "exp2"),
    ("precision@5", "precision", 5, "exp2"),
]


@pytest.mark.parametrize("threshold", [1, 2])
def test_matches_ranx(random_data: RandomData, threshold: int) -> None:
    # ranx's metric kernels on arrays (what ranx.evaluate runs after converting its Run / Qrels; calling
    # them directly skips seconds of conversion overhead), interpreted (tests/ranx_oracle.py). The arrays
    # are pre-sorted like ranx sorts them.
    data = random_data
    for ours, theirs, k, gains in CROSS_CHECKS:
        if threshold != 1 and "dcg" in ours:
            continue  # ranx drops grades below rel_lvl for (n)dcg; ours keeps them (see module docstring)
        with interpreted_ranx() as ranx:
            expected = ranx.metrics.metric_switch(theirs)(data.qrels_arrays, data.run_arrays, k, threshold)
        got = evaluate(
            data.run, data.qrels, [ours], relevance_threshold=threshold, gains=gains, per_query=True
        )
        got_array = np.array([got[ours][f"q{q}"] for q in range(len(expected))])
        np.testing.assert_allclose(
            got_array,
            expected,
            atol=1e-9,
            err_msg=f"{ours} ({gains}, threshold {threshold}) vs ranx {theirs} k={k}",
        )


def test_auc_matches_sklearn(random_data: RandomData) -> None:
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    run, qrels = random_data.run, random_data.qrels
    per = evaluate(run, qrels, ["auc"], per_query=True)["auc"]
    checked = 0
    for qid, docs in qrels.items():
        labels = [rel >= 1 for rel in docs.values()]
        if all(labels) or not any(labels):
            assert qid not in per, f"{qid} has one class and must be skipped"
            continue
        scores = [run[qid].get(d, -np.inf) for d in docs]
        # sklearn rejects -inf; any number below the real scores (all >= 0) ranks the same.
        scores = [s if np.isfinite(s) else -1e9 for s in scores]
        expected = sklearn_metrics.roc_auc_score(labels, scores)
        assert per[qid] == pytest.approx(expected), f"{qid}: auc {per[qid]} vs sklearn {expected}"
        checked += 1
    assert checked >= 20, f"only {checked} queries had both classes; the check is too weak"
