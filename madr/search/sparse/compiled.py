"""Exact sparse top-k in one compiled pass (numba): term-at-a-time accumulation over the posting lists of the
query terms into a dense score row, then top-k over the touched documents only.

It replaces three passes of the scipy path (``InvertedIndex.search(engine="scipy")``): the sparse-sparse
product ``Q @ D.T`` (which materialises a CSR score row per query), scipy's separate counting pass that
sizes that product, and ``np.partition`` over the row. Here each query reads every posting of its terms once,
adds ``q_t * w(t, d)`` into a float32 accumulator, remembers which documents it touched, keeps the top k of
those in a k-sized heap (one comparison for most documents) and clears only them. One thread runs the serial
kernel; more spread query chunks over numba threads, each chunk with its own accumulator.

Result convention: the same as ``InvertedIndex.search`` (only scores > 0; score descending, ties by global id
ascending; rows padded with -inf / -1). Scores are summed in float32 in the order of the query's terms, so
they can differ from scipy's in the last bits; the test compares ids exactly and scores to 1e-6.
"""

from __future__ import annotations

import numba
import numpy as np

from madr.search.protocol import PAD_ID


@numba.njit(cache=True, nogil=True, inline="always")
def _worse(s1: float, i1: int, s2: float, i2: int) -> bool:
    """(s1, i1) ranks below (s2, i2): lower score, or the same score and a higher id."""
    return s1 < s2 or (s1 == s2 and i1 > i2)


@numba.njit(cache=True, nogil=True)
def _sift_down(hs: np.ndarray, hi: np.ndarray, n: int, pos: int) -> None:
    """Restore the heap below ``pos`` (root = the worst of the kept hits)."""
    while True:
        child = 2 * pos + 1
        if child >= n:
            return
        if child + 1 < n and _worse(hs[child + 1], hi[child + 1], hs[child], hi[child]):
            child += 1
        if not _worse(hs[child], hi[child], hs[pos], hi[pos]):
            return
        hs[pos], hs[child] = hs[child], hs[pos]
        hi[pos], hi[child] = hi[child], hi[pos]
        pos = child


@numba.njit(cache=True, nogil=True)
def heap_push(hs: np.ndarray, hi: np.ndarray, n: int, k: int, s: float, g: int) -> int:
    """Offer (s, g) to the k-heap (hs, hi) holding ``n`` hits, root = the worst kept; returns the new count.
    Filling appends and sifts up; once full, only a hit that beats the root enters. A call costs more than
    the comparison: hot loops test ``n < k or _worse(hs[0], hi[0], s, g)`` first (``_top_k_touched`` inlines
    the whole push)."""
    if n < k:
        pos = n
        hs[pos], hi[pos] = s, g
        while pos > 0:
            parent = (pos - 1) // 2
            if not _worse(hs[pos], hi[pos], hs[parent], hi[parent]):
                break
            hs[pos], hs[parent] = hs[parent], hs[pos]
            hi[pos], hi[parent] = hi[parent], hi[pos]
            pos = parent
        return n + 1
    if _worse(hs[0], hi[0], s, g):
        hs[0], hi[0] = s, g
        _sift_down(hs, hi, n, 0)
    return n


@numba.njit(cache=True, nogil=True)
def heap_write(hs: np.ndarray, hi: np.ndarray, n: int, out_s: np.ndarray, out_i: np.ndarray) -> None:
    """Write the heap's ``n`` hits into out_s / out_i by score desc, then id asc (the rest stays padding)."""
    by_id = np.argsort(hi[:n], kind="mergesort")
    ks, ki = hs[:n][by_id], hi[:n][by_id]
    order = np.argsort(-ks, kind="mergesort")  # stable: equal scores stay in id order
    for j in range(n):
        out_s[j] = ks[order[j]]
        out_i[j] = ki[order[j]]


@numba.njit(cache=True, nogil=True)
def _top_k_touched(acc: np.ndarray, seen: np.ndarray, touched: np.ndarray, n_touched: int, ids: np.ndarray,
                   k: int, out_s: np.ndarray, out_i: np.ndarray) -> None:
    """Write the top ``k`` of ``acc[touched[:n_touched]]`` (scores > 0; score desc, then id asc) into out_s /
    out_i (padded -inf / -1), and clear those accumulator and ``seen`` entries for the next query.

    One pass with a k-sized heap whose root is the worst kept hit: a document enters only when it beats the
    root, so most touched documents cost one comparison and nothing is allocated per document."""
    hs = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    n = 0
    for j in range(n_touched):
        d = touched[j]
        s = acc[d]
        acc[d] = 0.0
        seen[d] = False
        if s <= 0:
            continue
        g = ids[d]
        if n < k:  # filling: append, then sift the new leaf up
            pos = n
            hs[pos], hi[pos] = s, g
            n += 1
            while pos > 0:
                parent = (pos - 1) // 2
                if not _worse(hs[pos], hi[pos], hs[parent], hi[parent]):
                    break
                hs[pos], hs[parent] = hs[parent], hs[pos]
                hi[pos], hi[parent] = hi[parent], hi[pos]
                pos = parent
        elif _worse(hs[0], hi[0], s, g):
            hs[0], hi[0] = s, g
            _sift_down(hs, hi, n, 0)
    by_id = np.argsort(hi[:n], kind="mergesort")
    ks, ki = hs[:n][by_id], hi[:n][by_id]
    order = np.argsort(-ks, kind="mergesort")  # stable: equal scores stay in id order
    for j in range(n):
        out_s[j] = ks[order[j]]
        out_i[j] = ki[order[j]]


@numba.njit(cache=True, nogil=True, inline="always")
def accumulate(t: int, w: np.float32, p_indptr: np.ndarray, p_docs: np.ndarray, p_weights: np.ndarray,
               acc: np.ndarray, seen: np.ndarray, touched: np.ndarray, n_touched: int) -> int:
    """Add ``w`` times term ``t``'s posting weights into ``acc``, listing newly touched rows; returns the count."""
    for p in range(p_indptr[t], p_indptr[t + 1]):
        d = p_docs[p]
        if not seen[d]:
            seen[d] = True
            touched[n_touched] = d
            n_touched += 1
        acc[d] += w * p_weights[p]
    return n_touched


@numba.njit(cache=True, nogil=True)
def taat_query(q: int, q_indptr: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray, p_indptr: np.ndarray,
               p_docs: np.ndarray, p_weights: np.ndarray, ids: np.ndarray, k: int, acc: np.ndarray,
               seen: np.ndarray, touched: np.ndarray, out_s: np.ndarray, out_i: np.ndarray) -> None:
    """Top ``k`` of query ``q`` into out_s / out_i: its terms' postings accumulated in query order, then the
    touched rows' top k (``acc`` and ``seen`` are left cleared)."""
    n_touched = 0
    for j in range(q_indptr[q], q_indptr[q + 1]):
        n_touched = accumulate(q_terms[j], q_weights[j], p_indptr, p_docs, p_weights, acc, seen, touched,
                               n_touched)
    _top_k_touched(acc, seen, touched, n_touched, ids, k, out_s, out_i)


def _search_taat(q_indptr: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray, p_indptr: np.ndarray,
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
            taat_query(q, q_indptr, q_terms, q_weights, p_indptr, p_docs, p_weights, ids, k, acc, seen, touched,
                       out_s[q], out_i[q])
    return out_s, out_i


# One kernel, compiled twice: the serial one never starts numba's thread pool (whose idle workers would
# compete with torch in a serving process); the parallel one spreads query chunks over `num_threads`.
search_taat_serial = numba.njit(cache=True, nogil=True)(_search_taat)
search_taat_parallel = numba.njit(parallel=True, cache=True, nogil=True)(_search_taat)


def search_taat(q_indptr: np.ndarray, q_terms: np.ndarray, q_weights: np.ndarray, p_indptr: np.ndarray,
                p_docs: np.ndarray, p_weights: np.ndarray, ids: np.ndarray, k: int,
                num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of every query (``_search_taat``) on ``num_threads`` numba threads; 1: the serial kernel."""
    if num_threads <= 1:
        return search_taat_serial(q_indptr, q_terms, q_weights, p_indptr, p_docs, p_weights, ids, k,
                                  max(1, q_indptr.size - 1))
    previous = numba.get_num_threads()
    numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        chunk = max(1, -(-(q_indptr.size - 1) // (4 * num_threads)))
        return search_taat_parallel(q_indptr, q_terms, q_weights, p_indptr, p_docs, p_weights, ids, k, chunk)
    finally:
        numba.set_num_threads(previous)
