"""Retrieval, ranking and aspect-prediction metrics.

What the papers report:
- paper 000 Sec. 8.3: Recall@10k (retrieval), NDCG@5 with gain 2^rel - 1 and AUC "calculated per query
  before averaging" (re-ranking the judged docs), aspect Accuracy@1 (Table 5). Grades are 0-4 and
  "rel <= 1" is negative for binary metrics, i.e. ``relevance_threshold=2``.
- paper 001 Sec. 5.3.3: R@100, R@500, NDCG@50 on ESCI with gains E=1, S=0.1, C=0.01, I=0; only E is
  relevant for binary metrics. Use ``esci_qrels`` + ``gains="linear"`` + ``relevance_threshold=1.0``.
- paper 002 Sec. 6: MAP, R-Prec, MRR@5, NDCG, Hit Rate@5, P@1.

Conventions (shared by every metric here):
- A ``Run`` maps query id -> doc id -> score; a ``Qrels`` maps query id -> doc id -> graded relevance.
  A doc absent from a query's qrels has relevance 0 (unjudged = non-relevant).
- Ranking: score descending; equal scores are broken by doc id ascending (string order, so "d10" comes
  before "d2"). This makes every metric independent of dict order.
- Binary metrics (recall, precision, hit, mrr, map, r_precision, auc) count a doc as relevant when its
  relevance >= ``relevance_threshold``. Graded metrics (dcg, ndcg) use the gain of every judged grade,
  whatever the threshold. (ranx drops grades below its ``rel_lvl`` also for NDCG; both agree whenever the
  threshold is <= the smallest positive grade, e.g. integer grades with threshold 1.)
- ``@k`` truncates the ranking to the top k; without ``@k`` the whole ranked list counts. precision@k
  divides by k even when fewer than k docs were retrieved; map@k divides by the number of relevant docs
  (not by min(k, R)), as ranx and trec_eval do.
- The corpus value is the mean over the queries of ``qrels``. Like ranx, a query without any relevant
  doc scores 0 on every metric and still counts in the mean; a query of ``qrels`` absent from the run
  scores 0; queries of the run absent from ``qrels`` are ignored. AUC is the exception: it is averaged
  only over queries whose judged docs contain both classes (judged docs missing from the run score
  -inf, so a query missing from the run gets AUC 0.5), and is NaN when no query qualifies.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, float]]
Gains = str | Mapping[float, float]

ESCI_GAINS: dict[str, float] = {"E": 1.0, "S": 0.1, "C": 0.01, "I": 0.0}
_ESCI_WORDS = {"exact": "E", "substitute": "S", "complement": "C", "irrelevant": "I"}


# ---------------------------------------------------------------------------------------------------------
# Qrels helpers and gains
# ---------------------------------------------------------------------------------------------------------


def esci_qrels(labels: Mapping[str, Mapping[str, str]]) -> Qrels:
    """ESCI labels (query id -> doc id -> "E"/"S"/"C"/"I" or "exact"/...) -> graded qrels.

    Each relevance is the label's gain from ``ESCI_GAINS`` (paper 001 Sec. 5.3.3, following the ESCI
    benchmark), so evaluate them with ``gains="linear"`` (NDCG gain = E 1.0, S 0.1, C 0.01, I 0) and
    ``relevance_threshold=1.0`` (only Exact is relevant for binary metrics).
    """
    qrels: Qrels = {}
    for qid, docs in labels.items():
        qrels[qid] = {}
        for doc_id, label in docs.items():
            key = str(label).strip()
            key = _ESCI_WORDS.get(key.lower(), key.upper())
            if key not in ESCI_GAINS:
                raise ValueError(
                    f"query {qid!r}, doc {doc_id!r}: unknown ESCI label {label!r}; "
                    f"expected one of {sorted(ESCI_GAINS)} or {sorted(_ESCI_WORDS)}"
                )
            qrels[qid][doc_id] = ESCI_GAINS[key]
    return qrels


def _check_gains(gains: Gains) -> None:
    if isinstance(gains, str):
        if gains not in ("exp2", "linear"):
            raise ValueError(f"unknown gains {gains!r}; expected 'exp2', 'linear' or a mapping grade -> gain")
    elif not isinstance(gains, Mapping):
        raise ValueError(
            f"gains must be 'exp2', 'linear' or a mapping grade -> gain, got {type(gains).__name__}"
        )


def gain_values(rels: np.ndarray, gains: Gains = "exp2") -> np.ndarray:
    """Gain of each relevance grade: "exp2" -> 2^rel - 1 (paper 000 Sec. 8.3), "linear" -> rel, or a
    mapping grade -> gain (grade 0, i.e. unjudged, defaults to gain 0 when the mapping omits it)."""
    _check_gains(gains)
    rels = np.asarray(rels, dtype=np.float64)
    if gains == "exp2":
        return np.exp2(rels) - 1.0
    if gains == "linear":
        return rels.copy()
    table = {float(grade): float(gain) for grade, gain in gains.items()}
    table.setdefault(0.0, 0.0)
    missing = sorted({float(r) for r in rels} - set(table))
    if missing:
        raise ValueError(f"gains mapping has no entry for relevance grade(s) {missing}")
    return np.array([table[float(r)] for r in rels], dtype=np.float64)


# ---------------------------------------------------------------------------------------------------------
# Ranking
# ---------------------------------------------------------------------------------------------------------


def _float_array(values: Iterable[float], what: str) -> np.ndarray:
    try:
        return np.array(list(values), dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: values must be numbers ({e})") from e


def rank_documents(doc_scores: Mapping[str, float]) -> list[str]:
    """Doc ids by score descending; ties broken by doc id ascending. NaN scores raise ValueError."""
    if not doc_scores:
        return []
    ids = list(doc_scores)
    scores = _float_array(doc_scores.values(), "run scores")
    if np.isnan(scores).any():
        raise ValueError(f"run score of doc {ids[int(np.flatnonzero(np.isnan(scores))[0])]!r} is NaN")
    order = np.argsort(-scores, kind="stable")
    ordered = scores[order]
    if np.any(ordered[1:] == ordered[:-1]):  # ties: sort again with doc id as secondary key
        order = np.lexsort((np.array(ids), -scores))
    return [ids[i] for i in order]


# ---------------------------------------------------------------------------------------------------------
# Per-query metrics. `hits`: bool per ranked doc (rank order); `n_relevant`: relevant docs in the qrels.
# ---------------------------------------------------------------------------------------------------------


def _top(values: np.ndarray, k: int | None) -> np.ndarray:
    return values if k is None else values[:k]


def recall_at_k(hits: np.ndarray, n_relevant: int, k: int | None = None) -> float:
    """|relevant in top k| / |relevant|; 0 when the query has no relevant doc."""
    if n_relevant == 0:
        return 0.0
    return float(np.count_nonzero(_top(hits, k))) / n_relevant


def precision_at_k(hits: np.ndarray, k: int | None = None) -> float:
    """|relevant in top k| / k (k = number retrieved when None; 0 for an empty ranking)."""
    denominator = len(hits) if k is None else k
    if denominator == 0:
        return 0.0
    return float(np.count_nonzero(_top(hits, k))) / denominator


def hit_at_k(hits: np.ndarray, k: int | None = None) -> float:
    """1 if any relevant doc is in the top k, else 0 (paper 002 "Hit Rate@5")."""
    return float(np.any(_top(hits, k)))


def reciprocal_rank_at_k(hits: np.ndarray, k: int | None = None) -> float:
    """1 / rank of the first relevant doc within the top k, else 0 (MRR@k once averaged)."""
    top = np.flatnonzero(_top(hits, k))
    return 1.0 / (top[0] + 1) if top.size else 0.0


def average_precision(hits: np.ndarray, n_relevant: int, k: int | None = None) -> float:
    """sum over relevant ranks r <= k of precision@r, divided by |relevant| (MAP once averaged)."""
    if n_relevant == 0:
        return 0.0
    top = np.asarray(_top(hits, k), dtype=bool)
    precision_at_rank = np.cumsum(top) / np.arange(1, len(top) + 1)
    return float(precision_at_rank[top].sum()) / n_relevant


def r_precision(hits: np.ndarray, n_relevant: int) -> float:
    """precision@R with R = |relevant|; 0 when the query has no relevant doc."""
    if n_relevant == 0:
        return 0.0
    return precision_at_k(hits, n_relevant)


def dcg_at_k(gains: np.ndarray, k: int | None = None) -> float:
    """sum_{i=1..k} gain_i / log2(i + 1), gains in rank order."""
    top = np.asarray(_top(gains, k), dtype=np.float64)
    return float(np.sum(top / np.log2(np.arange(2, len(top) + 2))))


def ndcg_at_k(gains: np.ndarray, judged_gains: np.ndarray, k: int | None = None) -> float:
    """DCG@k / IDCG@k, IDCG from all judged gains sorted descending; 0 when IDCG is 0."""
    ideal = dcg_at_k(np.sort(np.asarray(judged_gains, dtype=np.float64))[::-1], k)
    return dcg_at_k(gains, k) / ideal if ideal > 0 else 0.0


def roc_auc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float:
    """ROC AUC = P(score of a positive > score of a negative), ties counting 1/2 (Mann-Whitney U divided
    by n_pos * n_neg, computed with mid-ranks). NaN when one of the two classes is absent."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} differ in shape")
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    mid_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based rank, averaged over each tie group
    u = mid_ranks[inverse][labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def aspect_accuracy_at_1(predicted: Sequence[int], gold: Sequence[Collection[int]]) -> float:
    """Fraction of examples whose top-1 predicted aspect value is in the gold set (paper 000 Sec. 8.3,
    Table 5). Examples with an empty gold set (no annotation) are skipped; NaN if all are skipped."""
    if len(predicted) != len(gold):
        raise ValueError(f"predicted has {len(predicted)} examples but gold has {len(gold)}")
    correct = total = 0
    for i, (pred, values) in enumerate(zip(predicted, gold, strict=True)):
        if not isinstance(values, Collection) or isinstance(values, str):
            raise ValueError(f"gold[{i}] must be a set or list of value ids, got {type(values).__name__}")
        if len(values) == 0:
            continue
        total += 1
        correct += int(pred) in {int(v) for v in values}
    return correct / total if total else math.nan


# ---------------------------------------------------------------------------------------------------------
# Corpus-level evaluation
# ---------------------------------------------------------------------------------------------------------

_ALIASES = {
    "recall": "recall",
    "precision": "precision",
    "p": "precision",
    "hit": "hit",
    "hit_rate": "hit",
    "mrr": "mrr",
    "map": "map",
    "ndcg": "ndcg",
    "dcg": "dcg",
    "r_precision": "r_precision",
    "r-precision": "r_precision",
    "rprec": "r_precision",
    "auc": "auc",
}
_NO_CUTOFF = {"r_precision", "auc"}
_NAME = re.compile(r"^([a-z_\-]+)(?:@(\d+))?$")


@dataclass(frozen=True)
class MetricSpec:
    """A parsed metric name: `name` as given, canonical `kind`, cutoff `k` (None = whole ranking)."""

    name: str
    kind: str
    k: int | None


def parse_metric(name: str) -> MetricSpec:
    """Parse "ndcg@5", "recall@10", "mrr@5", "map", "map@100", "r_precision", "hit@5", "p@1", "auc", ...

    Names are case-insensitive. Aliases: p -> precision, hit_rate -> hit, r-precision / rprec ->
    r_precision. r_precision and auc take no @k.
    """
    match = _NAME.match(str(name).strip().lower())
    kind = _ALIASES.get(match.group(1)) if match else None
    if kind is None:
        raise ValueError(
            f"unknown metric {name!r}; expected one of {sorted(set(_ALIASES))}, optionally with @k "
            "(e.g. 'ndcg@5')"
        )
    k = int(match.group(2)) if match.group(2) is not None else None
    if k is not None and kind in _NO_CUTOFF:
        raise ValueError(f"metric {name!r}: {kind} takes no @k cutoff")
    if k is not None and k < 1:
        raise ValueError(f"metric {name!r}: cutoff k must be >= 1")
    return MetricSpec(name=name, kind=kind, k=k)


@dataclass
class _Query:
    """One query's inputs in array form, shared by all metrics of an `evaluate` call."""

    ranked_rels: np.ndarray  # relevance of each retrieved doc, rank order
    judged_rels: np.ndarray  # relevance of every judged doc (qrels order)
    judged_scores: np.ndarray  # run score of every judged doc (-inf if not retrieved)
    threshold: float

    @cached_property
    def hits(self) -> np.ndarray:
        return self.ranked_rels >= self.threshold

    @cached_property
    def n_relevant(self) -> int:
        return int(np.count_nonzero(self.judged_rels >= self.threshold))


def _prepare_query(
    qid: str, doc_scores: Mapping[str, float], doc_rels: Mapping[str, float], threshold: float
) -> _Query:
    judged_rels = _float_array(doc_rels.values(), f"qrels of query {qid!r}")
    bad = np.flatnonzero(~np.isfinite(judged_rels))
    if bad.size:
        raise ValueError(f"qrels of query {qid!r}: relevance of doc {list(doc_rels)[bad[0]]!r} is not finite")
    try:
        ranked = rank_documents(doc_scores)
    except ValueError as e:
        raise ValueError(f"run of query {qid!r}: {e}") from e
    ranked_rels = np.array([float(doc_rels.get(d, 0.0)) for d in ranked], dtype=np.float64)
    judged_scores = np.array([float(doc_scores.get(d, -math.inf)) for d in doc_rels], dtype=np.float64)
    return _Query(ranked_rels, judged_rels, judged_scores, threshold)


def _score(spec: MetricSpec, q: _Query, gains: Gains) -> float:
    kind, k = spec.kind, spec.k
    if kind == "recall":
        return recall_at_k(q.hits, q.n_relevant, k)
    if kind == "precision":
        return precision_at_k(q.hits, k)
    if kind == "hit":
        return hit_at_k(q.hits, k)
    if kind == "mrr":
        return reciprocal_rank_at_k(q.hits, k)
    if kind == "map":
        return average_precision(q.hits, q.n_relevant, k)
    if kind == "r_precision":
        return r_precision(q.hits, q.n_relevant)
    if kind == "dcg":
        return dcg_at_k(gain_values(_top(q.ranked_rels, k), gains))
    if kind == "ndcg":
        judged_gains = gain_values(q.judged_rels, gains)  # first: names every grade a mapping lacks
        return ndcg_at_k(gain_values(_top(q.ranked_rels, k), gains), judged_gains, k)
    if kind == "auc":
        return roc_auc(q.judged_scores, q.judged_rels >= q.threshold)
    raise AssertionError(f"unhandled metric kind {kind!r}")  # parse_metric only yields the kinds above


def evaluate(
    run: Run,
    qrels: Qrels,
    metrics: Sequence[str] | str,
    relevance_threshold: float = 1.0,
    gains: Gains = "exp2",
    per_query: bool = False,
) -> dict[str, float] | dict[str, dict[str, float]]:
    """Mean of each metric over the queries of `qrels` (see the module docstring for the conventions).

    Returns {metric name: mean}, or with ``per_query=True`` {metric name: {query id: value}} (AUC lists
    only the queries that have both classes, so each mean is the mean of its per-query dict).
    """
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    if not names:
        raise ValueError("metrics is empty; give at least one metric name, e.g. ['ndcg@5']")
    specs = [parse_metric(n) for n in names]
    if not (isinstance(relevance_threshold, numbers.Real) and 0 < relevance_threshold < math.inf):
        raise ValueError(f"relevance_threshold must be a finite number > 0, got {relevance_threshold!r}")
    _check_gains(gains)
    if not qrels:
        raise ValueError("qrels is empty: no query to evaluate")

    values: dict[str, dict[str, float]] = {spec.name: {} for spec in specs}
    for qid, doc_rels in qrels.items():
        q = _prepare_query(qid, run.get(qid, {}), doc_rels, float(relevance_threshold))
        for spec in specs:
            try:
                value = _score(spec, q, gains)
            except ValueError as e:
                raise ValueError(f"query {qid!r}, metric {spec.name!r}: {e}") from e
            if not math.isnan(value):
                values[spec.name][qid] = value
    return values if per_query else query_means(values)


def query_means(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{metric name: mean over its queries} of `evaluate(..., per_query=True)`'s values (NaN for a metric no query
    has)."""
    return {name: float(np.mean(list(v.values()))) if v else math.nan for name, v in per_query.items()}
