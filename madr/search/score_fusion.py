"""Hybrid dense + sparse ranking and the source-aware prior of paper 002.

- Eq. 1: ``s(q, p) = lambda * <dense_q, dense_p> + (1 - lambda) * <sparse_q, sparse_p>``. Here the two
  retrievers each return a top list; ``hybrid_merge`` takes the union of the candidates of a query, gets
  both scores for every candidate, optionally normalises each score per query over that candidate set, and
  interpolates.
- Sec. 6.2 (source-aware ranking): "we utilize the source-specific hit-rate@5 obtained from the regular
  ranking as prior confidence in those sources and multiply it with the combination of normalized scores
  obtained from Equation 1": ``source_priors_from_validation`` measures those hit rates and
  ``source_prior_rerank`` applies them.

Conventions (``madr.search.protocol``): result arrays are [Q, k] (scores float32, ids int64) padded with
``-inf`` / ``-1``; ties are broken by document id ascending.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from madr.metrics import Qrels, Run, rank_documents
from madr.search.params import NORMALISATIONS
from madr.search.protocol import PAD_ID, TopK, pad_rows

Rescore = Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]


def normalise(scores: np.ndarray, method: str = "none") -> np.ndarray:
    """Normalise each row of ``scores`` ([C] or [Q, C]) over its finite entries (padding stays -inf).

    - ``"none"``: unchanged (float64 copy).
    - ``"minmax"``: ``(s - min) / (max - min)``, so the row spans [0, 1].
    - ``"zscore"``: ``(s - mean) / std`` with the population std (ddof=0).
    A row whose finite scores are all equal (including a single candidate) maps them to 0.
    """
    if method not in NORMALISATIONS:
        raise ValueError(f"normalise: method must be one of {NORMALISATIONS}, got {method!r}")
    out = np.array(scores, dtype=np.float64, copy=True)
    if np.isnan(out).any():
        raise ValueError("normalise: scores contain NaN")
    if method == "none":
        return out
    rows = out.reshape(1, -1) if out.ndim == 1 else out
    for row in rows:
        finite = np.isfinite(row)
        s = row[finite]
        if s.size == 0:
            continue
        if method == "minmax":
            lo, span = s.min(), s.max() - s.min()
            row[finite] = (s - lo) / span if span > 0 else 0.0
        else:
            std = s.std()
            row[finite] = (s - s.mean()) / std if std > 0 else 0.0
    return out


def _check_topk(pair: TopK, name: str) -> tuple[np.ndarray, np.ndarray]:
    """`pair` as float64 scores / int64 ids; `name` ("<function>: <list>") prefixes the errors."""
    scores, ids = np.asarray(pair[0], dtype=np.float64), np.asarray(pair[1], dtype=np.int64)
    if scores.ndim != 2 or scores.shape != ids.shape:
        raise ValueError(f"{name} scores and ids must both be [Q, k], got {scores.shape} and {ids.shape}")
    if np.isnan(scores).any():
        raise ValueError(f"{name} scores contain NaN")
    return scores, ids


def _check_k(k: int, fn: str) -> None:
    """Every fusion keeps ``k >= 1`` documents per query; `fn` (the calling function) prefixes the error."""
    if k < 1:
        raise ValueError(f"{fn}: k must be >= 1, got {k}")


def _check_normalisation(normalisation: str, fn: str) -> None:
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"{fn}: normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")


def _check_lists(lists: Sequence[TopK], fn: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """`_check_topk` of each of several lists of the same queries, and their query count."""
    if not lists:
        raise ValueError(f"{fn}: no lists")
    checked = [_check_topk(pair, f"{fn}: list {i}") for i, pair in enumerate(lists)]
    counts = {s.shape[0] for s, _ in checked}
    if len(counts) != 1:
        raise ValueError(f"{fn}: the lists have different query counts {sorted(counts)}")
    return checked, counts.pop()


def _valid(scores: np.ndarray, ids: np.ndarray, name: str, q: int) -> tuple[np.ndarray, np.ndarray]:
    keep = (ids != PAD_ID) & np.isfinite(scores)
    s, i = scores[keep], ids[keep]
    if np.unique(i).size != i.size:
        raise ValueError(f"{name} list of query {q} repeats a document id")
    return s, i


def _lookup(cand: np.ndarray, ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Scores of the sorted ``cand`` ids in one list; absent ones get the list's minimum (0 if empty)."""
    out = np.full(cand.size, scores.min() if scores.size else 0.0)
    if ids.size:
        order = np.argsort(ids)
        pos = np.minimum(np.searchsorted(ids[order], cand), ids.size - 1)
        found = ids[order][pos] == cand
        out[found] = scores[order][pos][found]
    return out


def _rescored(rescore: Rescore, q: int, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, s = (np.asarray(x, dtype=np.float64) for x in rescore(q, cand))
    if d.shape != cand.shape or s.shape != cand.shape:
        raise ValueError(f"hybrid_merge: rescore for query {q} returned shapes {d.shape} and {s.shape}, "
                         f"expected ({cand.size},) each")
    if not (np.isfinite(d).all() and np.isfinite(s).all()):
        raise ValueError(f"hybrid_merge: rescore for query {q} returned a non-finite score")
    return d, s


def _sorted_topk(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((ids, -scores))[:k]
    return scores[order], ids[order]


def union_candidates(dense_ids: np.ndarray, sparse_ids: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Per query, the sorted union of the ids of two top lists ([Q, kd], [Q, ks], -1 padded): the list of
    unions and the same as one [Q, width] matrix padded with -1 (for exact re-scoring in one call)."""
    unions = [np.union1d(d[d != PAD_ID], s[s != PAD_ID]) for d, s in zip(dense_ids, sparse_ids, strict=True)]
    cand = np.full((len(unions), max([u.size for u in unions] + [1])), PAD_ID, dtype=np.int64)
    for q, u in enumerate(unions):
        cand[q, : u.size] = u
    return unions, cand


def hybrid_merge(dense: TopK, sparse: TopK, lam: float, k: int, normalisation: str = "none",
                 rescore: Rescore | None = None) -> TopK:
    """Interpolate dense and sparse top lists per query (paper 002 Eq. 1) and keep the top ``k``.

    ``dense`` and ``sparse`` are (scores [Q, kd], ids [Q, kd]) and (scores [Q, ks], ids [Q, ks]) with -1 /
    -inf padding. Per query:

    1. candidates = union of the ids of both lists;
    2. both scores of every candidate: with ``rescore(query_index, candidate_ids) -> (dense_scores,
       sparse_scores)`` they are computed exactly for all candidates (the lists only nominate candidates);
       without it, a candidate missing from one list gets that list's minimum score for the query (it
       ranked at best below the list's last entry; 0 when the list is empty);
    3. each score vector is normalised over the candidates (``normalise``, method ``normalisation``);
    4. final = ``lam * dense + (1 - lam) * sparse``; top ``k`` by final score, ties by id ascending.

    Returns (scores [Q, k] float32, ids [Q, k] int64), padded with -inf / -1.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"hybrid_merge: lam must be in [0, 1], got {lam}")
    _check_k(k, "hybrid_merge")
    _check_normalisation(normalisation, "hybrid_merge")
    d_scores, d_ids = _check_topk(dense, "hybrid_merge: dense")
    s_scores, s_ids = _check_topk(sparse, "hybrid_merge: sparse")
    if d_scores.shape[0] != s_scores.shape[0]:
        raise ValueError(f"hybrid_merge: dense has {d_scores.shape[0]} queries, sparse {s_scores.shape[0]}")
    rows = []
    for q in range(d_scores.shape[0]):
        ds, di = _valid(d_scores[q], d_ids[q], "hybrid_merge: dense", q)
        ss, si = _valid(s_scores[q], s_ids[q], "hybrid_merge: sparse", q)
        cand = np.union1d(di, si)
        if rescore is not None and cand.size:
            d, s = _rescored(rescore, q, cand)
        else:
            d, s = _lookup(cand, di, ds), _lookup(cand, si, ss)
        final = lam * normalise(d, normalisation) + (1.0 - lam) * normalise(s, normalisation)
        rows.append(_sorted_topk(final, cand, k))
    return pad_rows(rows, k)


def fusion_candidates(lists: Sequence[TopK], normalisation: str = "minmax", fn: str = "fusion_candidates"
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
    """What ``weighted_fusion`` fuses, before any weight: per query, the sorted union of the lists' candidate ids
    [C] and their normalised scores in each list [n_lists, C] (a candidate missing from a list gets that list's
    minimum score for the query). Computed once, it serves any number of weight vectors (``fuse_candidates``)."""
    _check_normalisation(normalisation, fn)
    checked, n_queries = _check_lists(lists, fn)
    out = []
    for q in range(n_queries):
        valid = [_valid(s[q], i[q], f"{fn}: list {n}", q) for n, (s, i) in enumerate(checked)]
        cand = np.unique(np.concatenate([i for _, i in valid]))
        out.append((cand, np.stack([normalise(_lookup(cand, i, s), normalisation) for s, i in valid])))
    return out


def fuse_candidates(candidates: Sequence[tuple[np.ndarray, np.ndarray]], weights: Sequence[float], k: int) -> TopK:
    """Top ``k`` per query of ``sum_i weights[i] * score_i`` over ``fusion_candidates``' output, ties by id
    ascending; (scores [Q, k] float32, ids [Q, k] int64), padded with -inf / -1."""
    _check_k(k, "weighted_fusion")
    w = np.asarray(weights, dtype=np.float64)
    rows = []
    for cand, normed in candidates:
        if normed.shape[0] != w.size:
            raise ValueError(f"weighted_fusion: {normed.shape[0]} lists but {w.size} weights")
        final = np.zeros(cand.size)
        for weight, scores in zip(w, normed, strict=True):
            if weight:
                final += weight * scores
        rows.append(_sorted_topk(final, cand, k))
    return pad_rows(rows, k)


def weighted_fusion(lists: Sequence[TopK], weights: Sequence[float], k: int, normalisation: str = "minmax"
                    ) -> TopK:
    """Several retrievers' top lists of the same queries in one ranking (paper 002 Eq. 1 for any number of
    lists): per query, the union of their candidates; a candidate missing from a list gets that list's
    minimum score for the query (it ranked at best below the list's last entry); each list's scores are
    normalised over the candidates (``normalise``; with ``"minmax"`` this equals min-max over the list itself
    with absent candidates at 0, ranx's ``fuse(norm="min-max", method="wsum")``); the final score is
    ``sum_i weights[i] * score_i``; top ``k`` by final score, ties by id ascending.

    Returns (scores [Q, k] float32, ids [Q, k] int64), padded with -inf / -1."""
    if len(lists) != len(weights):
        raise ValueError(f"weighted_fusion: {len(lists)} lists but {len(weights)} weights")
    _check_k(k, "weighted_fusion")  # before the per-query work (fuse_candidates checks it too)
    return fuse_candidates(fusion_candidates(lists, normalisation, "weighted_fusion"), weights, k)


def reciprocal_rank_fusion(lists: Sequence[TopK], k: int, rrf_k: int = 60) -> TopK:
    """Reciprocal rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009): ``sum_i 1 / (rrf_k + rank_i(d))``
    over the lists that hold ``d`` (rank from 1, in each list's own order); top ``k``, ties by id ascending."""
    _check_k(k, "reciprocal_rank_fusion")
    checked, n_queries = _check_lists(lists, "reciprocal_rank_fusion")
    rows = []
    for q in range(n_queries):
        total: dict[int, float] = {}
        for n, (s, i) in enumerate(checked):
            _, ids = _sorted_topk(*_valid(s[q], i[q], f"reciprocal_rank_fusion: list {n}", q), s.shape[1])
            for rank, doc in enumerate(ids.tolist(), start=1):
                total[doc] = total.get(doc, 0.0) + 1.0 / (rrf_k + rank)
        cand = np.fromiter(total, dtype=np.int64, count=len(total))
        rows.append(_sorted_topk(np.fromiter(total.values(), dtype=np.float64, count=len(total)), cand, k))
    return pad_rows(rows, k)


def source_prior_rerank(scores: np.ndarray, sources: Sequence[Sequence[str | None]] | np.ndarray,
                        priors: Mapping[str, float], ids: np.ndarray | None = None,
                        default_prior: float | None = None) -> TopK:
    """Source-aware re-ranking (paper 002 Sec. 6.2): multiply each candidate's normalised hybrid score by
    its source's prior (``priors[source]``, e.g. from ``source_priors_from_validation``) and re-sort.

    ``scores`` [Q, C] must be non-negative where finite (e.g. min-max normalised: a negative score would be
    *raised* by a smaller prior); non-finite entries (or ``ids == -1``) are padding and stay last.
    ``sources`` [Q, C] gives each candidate's source (ignored for padding). A source missing from ``priors``
    is an error unless ``default_prior`` is given. Returns (scores [Q, C] float32, ids [Q, C] int64)
    sorted per row by weighted score descending, ties by id ascending; without ``ids`` the column indices
    of the input take their place.
    """
    s = np.array(scores, dtype=np.float64, copy=True)
    src = np.asarray(sources, dtype=object)
    if s.ndim != 2 or src.shape != s.shape:
        raise ValueError(f"source_prior_rerank: scores and sources must both be [Q, C], got {s.shape} and "
                         f"{src.shape}")
    idx = np.broadcast_to(np.arange(s.shape[1]), s.shape) if ids is None else np.asarray(ids, dtype=np.int64)
    if idx.shape != s.shape:
        raise ValueError(f"source_prior_rerank: ids must be {s.shape}, got {idx.shape}")
    bad = [(name, p) for name, p in priors.items() if not (np.isfinite(p) and p >= 0)]
    if bad:
        raise ValueError(f"source_prior_rerank: prior of source {bad[0][0]!r} is {bad[0][1]}; priors must be >= 0")
    live = np.isfinite(s) & (idx != PAD_ID)
    if (s[live] < 0).any():
        raise ValueError("source_prior_rerank: scores must be non-negative (normalise with 'minmax' first)")
    for q, c in zip(*np.nonzero(live), strict=True):
        name = src[q, c]
        if name not in priors and default_prior is None:
            raise ValueError(f"source_prior_rerank: no prior for source {name!r} (query {q}, candidate {c})")
        s[q, c] *= priors.get(name, default_prior)
    s[~live] = -np.inf
    order = np.lexsort((idx, -s), axis=1)
    return (np.take_along_axis(s, order, axis=1).astype(np.float32),
            np.where(np.take_along_axis(live, order, axis=1), np.take_along_axis(idx, order, axis=1), PAD_ID))


def source_priors_from_validation(run: Run, qrels: Qrels, doc_source: Mapping[str, str], k: int = 5,
                                  relevance_threshold: float = 1.0) -> dict[str, float]:
    """Per-source hit-rate@k on validation, the prior of paper 002 Sec. 6.2.

    For a source ``S``, let ``Q_S`` be the queries of ``qrels`` that have at least one relevant document
    (relevance >= ``relevance_threshold``) from ``S``. The prior of ``S`` is the fraction of ``Q_S`` whose
    top ``k`` of ``run`` (ranked as in ``madr.metrics``: score descending, ties by doc id ascending)
    contains a relevant document from ``S``. A query of ``Q_S`` absent from ``run`` counts as a miss.
    Sources with an empty ``Q_S`` get no entry. ``doc_source`` maps doc id -> source name and must cover
    every relevant document.
    """
    if k < 1:
        raise ValueError(f"source_priors_from_validation: k must be >= 1, got {k}")
    hits: dict[str, int] = {}
    totals: dict[str, int] = {}
    for qid, judged in qrels.items():
        relevant = {d for d, rel in judged.items() if rel >= relevance_threshold}
        missing = sorted(relevant - set(doc_source))
        if missing:
            raise ValueError(f"source_priors_from_validation: relevant doc {missing[0]!r} of query {qid!r} "
                             f"has no source in doc_source")
        top = set(rank_documents(run.get(qid, {}))[:k])
        for source in {doc_source[d] for d in relevant}:
            totals[source] = totals.get(source, 0) + 1
            hit = any(doc_source[d] == source for d in relevant & top)
            hits[source] = hits.get(source, 0) + int(hit)
    return {source: hits[source] / totals[source] for source in sorted(totals)}
