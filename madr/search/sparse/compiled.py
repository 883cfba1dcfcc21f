"""Exact sparse top-k in one compiled pass (numba): term-at-a-time accumulation over the posting lists of the
query terms into a dense score row, then top-k over the touched documents only.

It replaces three passes of the scipy path (``InvertedIndex.search(engine="scipy")``): the sparse-sparse
product ``Q @ D.T`` (which materialises a CSR score row per query), scipy's separate counting pass that
sizes that product, and ``np.partition`` over the row. Here each query reads every posting of its terms once,
adds ``q_t * w(t, d)`` into a float32 accumulator, remembers which documents it touched, selects the top k of
those and clears only them; queries run in parallel over numba threads, each with its own accumulator.

Result convention: the same as ``InvertedIndex.search`` (only scores > 0; score descending, ties by global id
ascending; rows padded with -inf / -1). Scores are summed in float32 in the order of the query's terms, so
they can differ from scipy's in the last bits; the test compares ids exactly and scores to 1e-6.
"""

from __future__ import annotations

import numba
import numpy as np

from madr.search.protocol import PAD_ID


@numba.njit(cache=True, nogil=True)
def _top_k_touched(acc: np.ndarray, seen: np.ndarray, touched: np.ndarray, n_touched: int, ids: np.ndarray,
                   k: int, out_s: np.ndarray, out_i: np.ndarray) -> None:
    """Write the top ``k`` of ``acc[touched[:n_touched]]`` (scores > 0; score desc, then id asc) into out_s /
    out_i (padded -inf / -1), and clear those accumulator and ``seen`` entries for the next query."""
    cand = np.empty(n_touched, dtype=np.int64)
    scores = np.empty(n_touched, dtype=np.float32)
    m = 0
    for j in range(n_touched):
        d = touched[j]
        if acc[d] > 0:
            cand[m] = d
            scores[m] = acc[d]
            m += 1
        acc[d] = 0.0
        seen[d] = False
    cand, scores = cand[:m], scores[:m]
    if m > k:
        kth = np.partition(scores, m - k)[m - k]  # the k-th largest: keep every tie at the cut
        keep = scores >= kth
        cand, scores = cand[keep], scores[keep]
    gid = ids[cand]
    by_id = np.argsort(gid, kind="mergesort")
    gid, scores = gid[by_id], scores[by_id]
    order = np.argsort(-scores, kind="mergesort")  # stable: equal scores stay in id order
    n = min(k, order.size)
    for j in range(n):
        out_s[j] = scores[order[j]]
        out_i[j] = gid[order[j]]


@numba.njit(parallel=True, cache=True, nogil=True)
def search_taat(q_indptr: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray, p_indptr: np.ndarray,
                p_docs: np.ndarray, p_weights: np.ndarray, ids: np.ndarray, k: int,
                chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` (scores [Q, k] float32, global ids [Q, k] int64) of every query of a CSR query batch against a
    term-major (CSC) posting layout: ``p_indptr`` [V + 1], ``p_docs`` row positions, ``p_weights``; ``ids`` maps
    row positions to global ids. Queries are split into ``chunk``-sized groups run in parallel."""
    n_queries = q_indptr.size - 1
    n_docs = ids.size
    out_s = np.full((n_queries, k), -np.inf, dtype=np.float32)
    out_i = np.full((n_queries, k), PAD_ID, dtype=np.int64)
    n_chunks = (n_queries + chunk - 1) // chunk
    for c in numba.prange(n_chunks):
        acc = np.zeros(n_docs, dtype=np.float32)
        seen = np.zeros(n_docs, dtype=np.bool_)
        touched = np.empty(n_docs, dtype=np.int64)
        for q in range(c * chunk, min(n_queries, (c + 1) * chunk)):
            n_touched = 0
            for j in range(q_indptr[q], q_indptr[q + 1]):
                t, w = q_terms[j], q_weights[j]
                for p in range(p_indptr[t], p_indptr[t + 1]):
                    d = p_docs[p]
                    if not seen[d]:
                        seen[d] = True
                        touched[n_touched] = d
                        n_touched += 1
                    acc[d] += w * p_weights[p]
            _top_k_touched(acc, seen, touched, n_touched, ids, k, out_s[q], out_i[q])
    return out_s, out_i
