"""Exact sparse top-k with MaxScore dynamic pruning (Turtle & Flood 1995) over impact-ordered query terms, in
one compiled pass per query (numba); the pruned sibling of ``madr.search.sparse.compiled``.

Per query, with ``term_max[t]`` the largest weight of term ``t``'s posting list (``InvertedIndex.term_max``):

1. Essential terms. The query's terms are sorted by their bound ``ub_t = q_t * term_max[t]``, highest first,
   and their lists are accumulated term at a time into partial scores, as in the plain kernel, while a
   k-heap keeps the k best partial scores (one comparison per posting). Its minimum is a lower bound
   ``theta`` of the final k-th score (k distinct rows score at least that much). Once the bounds of the unread
   terms sum below ``BREAK_RATIO * theta``, no row that none of the read lists holds can reach the top k,
   and the unread ("non-essential") lists are no longer scanned as a whole.
2. Candidates. Touched rows whose partial score plus the unread terms' bounds still reaches ``theta``. Each
   unread term, in bound order, adds its weights to them (a binary search per candidate, or one scan of
   the list when that reads less); ``theta`` rises to the candidates' k-th partial score and rows whose
   bound falls below it are dropped.
3. Survivors (usually k and a few) are scored exactly: in the query's term order with the plain kernel's
   float32 operations, so scores, ids and tie order are the plain kernel's (and scipy's).

Exactness: a row is dropped only when its bound is strictly below ``theta``, so rows tied with the k-th
score are kept; bounds carry a relative slack for float32 rounding (``_slack``), since partial sums are
added in bound order, not query order. Bounds need non-negative weights: a query with a weight <= 0 runs the
plain kernel, and ``InvertedIndex`` uses the plain kernel for an index with a negative weight.

Where it pays: the read lists plus the candidates' lookups must cost less than the skipped postings. The
gain shrinks as k grows, since every survivor costs a lookup per query term and a larger k leaves more
survivors; ``InvertedIndex``'s default engine picks it for k <= ``MAXSCORE_MAX_K``, the plain kernel beyond.

Tuning (``BREAK_RATIO``, real titles, k = 10, per query): stopping the essential terms as soon as the unread
bounds fall below ``theta`` reads 11,100 of 42,800 postings but leaves 4,300 candidates; waiting until they
fall below half of it reads 18,200 and leaves 400. 1.0 leaves so many candidates that it saves nothing over
the plain kernel; 0.5 balances the postings read against the candidates left to look up.
"""

from __future__ import annotations

import numba
import numpy as np

from madr.search.protocol import PAD_ID
from madr.search.sparse.compiled import heap_push, heap_write, taat_query

BREAK_RATIO = 0.5  # essential terms end once the unread bounds sum below this x theta (1: more candidates)
SCAN_STEPS = 1  # a candidate lookup scans a list when binary searches would take SCAN_STEPS x its length


@numba.njit(cache=True, nogil=True, inline="always")
def _find(p_docs: np.ndarray, lo: int, hi: int, d: int) -> int:
    """Position of row ``d`` in the ascending ``p_docs[lo:hi]``, or -1."""
    end = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if p_docs[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < end and p_docs[lo] == d else -1


@numba.njit(cache=True, nogil=True, inline="always")
def _gallop(p_docs: np.ndarray, lo: int, hi: int, d: int) -> int:
    """First position >= ``lo`` in the ascending ``p_docs[lo:hi]`` whose row is >= ``d`` (``hi`` if none):
    doubling steps from ``lo``, then a binary search, so a run of ascending lookups costs O(log gap) each."""
    step = 1
    while lo + step < hi and p_docs[lo + step] < d:
        lo += step
        step *= 2
    top = min(lo + step, hi)
    while lo < top:
        mid = (lo + top) >> 1
        if p_docs[mid] < d:
            lo = mid + 1
        else:
            top = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _exact_scores(
    rows: np.ndarray,
    q_terms: np.ndarray,
    q_weights: np.ndarray,
    a: int,
    b: int,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
) -> np.ndarray:
    """The scores of the ascending ``rows``, summed in float32 in the query's term order exactly as
    ``taat_query`` sums them; each term's list is walked once, galloping from row to row."""
    out = np.zeros(rows.size, dtype=np.float32)
    for j in range(a, b):
        t, w = q_terms[j], q_weights[j]
        pos, hi = p_indptr[t], p_indptr[t + 1]
        for c in range(rows.size):
            pos = _gallop(p_docs, pos, hi, rows[c])
            if pos == hi:
                break
            if p_docs[pos] == rows[c]:
                out[c] += w * p_weights[pos]
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _slack(n_terms: int) -> float:
    """Relative error bound of a float32 sum of ``n_terms`` non-negative float32 products: twice the
    textbook (n + 1) * 2**-24."""
    return (n_terms + 2) * 2.0**-23


@numba.njit(cache=True, nogil=True, inline="always")
def _bound(partial: float, rest: float, slack: float) -> float:
    """Upper bound of a float32 final score whose float32 partial sum is ``partial`` and whose unread terms
    add at most ``rest`` (exact arithmetic), with ``slack`` for float32 rounding on both sides."""
    return (partial / (1.0 - slack) + rest) * (1.0 + slack)


@numba.njit(cache=True, nogil=True)
def _kth_largest(acc: np.ndarray, rows: np.ndarray, n: int, k: int) -> float:
    """The k-th largest of ``acc[rows[:n]]`` (-inf when n < k): one pass with a k-sized min-heap of scores."""
    if n < k:
        return -np.inf
    h = np.empty(k, dtype=np.float32)
    for j in range(k):
        h[j] = acc[rows[j]]
    h.sort()  # ascending: a valid min-heap
    for j in range(k, n):
        s = acc[rows[j]]
        if s > h[0]:
            h[0] = s
            pos = 0
            while True:  # sift down
                child = 2 * pos + 1
                if child >= k:
                    break
                if child + 1 < k and h[child + 1] < h[child]:
                    child += 1
                if h[child] >= h[pos]:
                    break
                h[pos], h[child] = h[child], h[pos]
                pos = child
    return h[0]


@numba.njit(cache=True, nogil=True)
def _sift(hv: np.ndarray, hd: np.ndarray, hpos: np.ndarray, n: int, pos: int) -> None:
    """Restore the min-heap (hv scores, hd rows; hpos[row] = slot + 1, 0 = not kept) below ``pos`` after
    hv[pos] grew."""
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and hv[child + 1] < hv[child]:
            child += 1
        if hv[child] >= hv[pos]:
            break
        hv[pos], hv[child] = hv[child], hv[pos]
        hd[pos], hd[child] = hd[child], hd[pos]
        hpos[hd[pos]] = pos + 1
        hpos[hd[child]] = child + 1
        pos = child


@numba.njit(cache=True, nogil=True)
def _offer(hv: np.ndarray, hd: np.ndarray, hpos: np.ndarray, n: int, k: int, d: int, v: float) -> int:
    """Row ``d``'s partial score grew to ``v`` (above the heap's minimum, or the heap is not full): update the
    k best partial scores (a min-heap whose rows are found by ``hpos``); returns the heap's size."""
    pos = hpos[d] - 1
    if pos >= 0:  # already kept: its score grew, move it down
        hv[pos] = v
        _sift(hv, hd, hpos, n, pos)
        return n
    if n < k:  # filling: append and sift up
        pos = n
        hv[pos], hd[pos] = v, d
        hpos[d] = pos + 1
        while pos > 0:
            parent = (pos - 1) // 2
            if hv[parent] <= hv[pos]:
                break
            hv[pos], hv[parent] = hv[parent], hv[pos]
            hd[pos], hd[parent] = hd[parent], hd[pos]
            hpos[hd[pos]] = pos + 1
            hpos[hd[parent]] = parent + 1
            pos = parent
        return n + 1
    hpos[hd[0]] = 0  # full: the new row replaces the minimum
    hv[0], hd[0] = v, d
    hpos[d] = 1
    _sift(hv, hd, hpos, n, 0)
    return n


@numba.njit(cache=True, nogil=True, inline="always")
def _accumulate_top(
    t: int,
    w: np.float32,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
    acc: np.ndarray,
    seen: np.ndarray,
    touched: np.ndarray,
    n_touched: int,
    hv: np.ndarray,
    hd: np.ndarray,
    hpos: np.ndarray,
    n_heap: int,
    k: int,
) -> tuple[int, int]:
    """``compiled.accumulate`` that also keeps the k best partial scores (``_offer``): one comparison per
    posting; returns (n_touched, n_heap)."""
    floor = hv[0] if n_heap == k else -np.inf
    for p in range(p_indptr[t], p_indptr[t + 1]):
        d = p_docs[p]
        if not seen[d]:
            seen[d] = True
            touched[n_touched] = d
            n_touched += 1
        v = acc[d] + w * p_weights[p]
        acc[d] = v
        if v > floor:
            n_heap = _offer(hv, hd, hpos, n_heap, k, d, v)
            if n_heap == k:
                floor = hv[0]
    return n_touched, n_heap


@numba.njit(cache=True, nogil=True, inline="always")
def _lower(partial: float, slack: float) -> float:
    """Lower bound of the float32 final score of a row whose float32 partial sum is ``partial``."""
    return partial * (1.0 - slack) / (1.0 + slack)


@numba.njit(cache=True, nogil=True)
def _add_term(
    t: int,
    w: np.float32,
    cand: np.ndarray,
    n_c: int,
    seen: np.ndarray,
    acc: np.ndarray,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
) -> None:
    """Add term ``t``'s weights (times ``w``) to the candidates' partial scores: a binary search per
    candidate, or one scan of the list (``seen`` flags exactly the candidates) when that reads less."""
    lo, hi = p_indptr[t], p_indptr[t + 1]
    log_len = 1
    while (1 << log_len) < hi - lo:
        log_len += 1
    if n_c * log_len > SCAN_STEPS * (hi - lo):
        for p in range(lo, hi):
            d = p_docs[p]
            if seen[d]:
                acc[d] += w * p_weights[p]
        return
    for c in range(n_c):
        d = cand[c]
        pos = _find(p_docs, lo, hi, d)
        if pos >= 0:
            acc[d] += w * p_weights[pos]


@numba.njit(cache=True, nogil=True)
def _keep(
    cand: np.ndarray, n_c: int, acc: np.ndarray, seen: np.ndarray, rest: float, slack: float, theta: float
) -> int:
    """Compact ``cand`` to the rows whose bound still reaches ``theta``; the dropped ones are cleared."""
    kept = 0
    for c in range(n_c):
        d = cand[c]
        if _bound(acc[d], rest, slack) >= theta:
            cand[kept] = d
            kept += 1
        else:
            acc[d] = 0.0
            seen[d] = False
    return kept


@numba.njit(cache=True, nogil=True)
def maxscore_query(
    q: int,
    q_indptr: np.ndarray,
    q_terms: np.ndarray,
    q_weights: np.ndarray,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
    term_max: np.ndarray,
    ids: np.ndarray,
    k: int,
    acc: np.ndarray,
    seen: np.ndarray,
    touched: np.ndarray,
    hpos: np.ndarray,
    out_s: np.ndarray,
    out_i: np.ndarray,
) -> None:
    """Top ``k`` of query ``q`` into out_s / out_i with MaxScore pruning (module docstring); the buffers
    ``acc`` and ``seen`` are left cleared. Queries with a weight <= 0 run ``taat_query``."""
    a, b = q_indptr[q], q_indptr[q + 1]
    m = b - a
    for j in range(a, b):
        if not q_weights[j] > 0:
            taat_query(
                q,
                q_indptr,
                q_terms,
                q_weights,
                p_indptr,
                p_docs,
                p_weights,
                ids,
                k,
                acc,
                seen,
                touched,
                out_s,
                out_i,
            )
            return
    ub = np.empty(m, dtype=np.float64)
    for j in range(m):
        ub[j] = np.float64(q_weights[a + j]) * np.float64(term_max[q_terms[a + j]])
    order = np.argsort(-ub)
    rest_ub = np.zeros(m + 1, dtype=np.float64)  # rest_ub[i]: bound of the terms order[i:]
    rest_len = np.zeros(m + 1, dtype=np.int64)  # their postings
    for i in range(m - 1, -1, -1):
        t = q_terms[a + order[i]]
        rest_ub[i] = rest_ub[i + 1] + ub[order[i]]
        rest_len[i] = rest_len[i + 1] + p_indptr[t + 1] - p_indptr[t]
    slack = _slack(m)
    theta = -np.inf  # lower bound of the final k-th score, from k rows' partial scores
    hv = np.empty(k, dtype=np.float32)  # the k best partial scores so far (min-heap), their rows
    hd = np.empty(k, dtype=np.int64)
    n_touched = n_heap = i = 0
    while i < m:  # essential terms, highest bound first, until the unread ones cannot lift a new row to theta
        j = a + order[i]
        n_touched, n_heap = _accumulate_top(
            q_terms[j],
            q_weights[j],
            p_indptr,
            p_docs,
            p_weights,
            acc,
            seen,
            touched,
            n_touched,
            hv,
            hd,
            hpos,
            n_heap,
            k,
        )
        i += 1
        if n_heap < k:
            continue
        theta = _lower(hv[0], slack)
        if i < m and _bound(0.0, rest_ub[i], slack) < BREAK_RATIO * theta:
            break
    for r in range(n_heap):
        hpos[hd[r]] = 0
    cand = touched  # candidates, compacted in place (touched is not read again)
    n_c = _keep(cand, n_touched, acc, seen, rest_ub[i], slack, theta)
    for r in range(i, m):  # non-essential terms: only the candidates, dropped once below theta
        if n_c == 0:
            break
        j = a + order[r]
        _add_term(q_terms[j], q_weights[j], cand, n_c, seen, acc, p_indptr, p_docs, p_weights)
        theta = max(theta, _lower(_kth_largest(acc, cand, n_c, k), slack))
        n_c = _keep(cand, n_c, acc, seen, rest_ub[r + 1], slack, theta)
    for c in range(n_c):
        acc[cand[c]] = 0.0
        seen[cand[c]] = False
    rows = np.sort(cand[:n_c])  # the survivors, scored exactly in query order
    exact = _exact_scores(rows, q_terms, q_weights, a, b, p_indptr, p_docs, p_weights)
    hs = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    n_heap = 0
    for c in range(n_c):
        if exact[c] > 0:
            n_heap = heap_push(hs, hi, n_heap, k, exact[c], ids[rows[c]])
    heap_write(hs, hi, n_heap, out_s, out_i)


def _search_maxscore(
    q_indptr: np.ndarray,
    q_terms: np.ndarray,
    q_weights: np.ndarray,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
    term_max: np.ndarray,
    ids: np.ndarray,
    k: int,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``compiled._search_taat`` with ``maxscore_query`` per query (``term_max`` [V]: each list's largest weight)."""
    n_queries = q_indptr.size - 1
    n_docs = ids.size
    out_s = np.full((n_queries, k), -np.inf, dtype=np.float32)
    out_i = np.full((n_queries, k), PAD_ID, dtype=np.int64)
    n_chunks = (n_queries + chunk - 1) // chunk
    for c in numba.prange(n_chunks):
        acc = np.zeros(n_docs, dtype=np.float32)
        seen = np.zeros(n_docs, dtype=np.bool_)
        touched = np.empty(n_docs, dtype=np.int64)
        hpos = np.zeros(n_docs, dtype=np.int32)  # slot + 1 of a row in the partial-score heap
        for q in range(c * chunk, min(n_queries, (c + 1) * chunk)):
            maxscore_query(
                q,
                q_indptr,
                q_terms,
                q_weights,
                p_indptr,
                p_docs,
                p_weights,
                term_max,
                ids,
                k,
                acc,
                seen,
                touched,
                hpos,
                out_s[q],
                out_i[q],
            )
    return out_s, out_i


# Compiled twice like the plain kernel: the serial one never starts numba's thread pool.
search_maxscore_serial = numba.njit(cache=True, nogil=True)(_search_maxscore)
search_maxscore_parallel = numba.njit(parallel=True, cache=True, nogil=True)(_search_maxscore)


def search_maxscore(
    q_indptr: np.ndarray,
    q_terms: np.ndarray,
    q_weights: np.ndarray,
    p_indptr: np.ndarray,
    p_docs: np.ndarray,
    p_weights: np.ndarray,
    term_max: np.ndarray,
    ids: np.ndarray,
    k: int,
    num_threads: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of every query with MaxScore pruning on ``num_threads`` numba threads; 1: the serial kernel.
    The index's weights must be >= 0 (``InvertedIndex`` runs the plain kernel otherwise)."""
    args = (q_indptr, q_terms, q_weights, p_indptr, p_docs, p_weights, term_max, ids, k)
    if num_threads <= 1:
        return search_maxscore_serial(*args, max(1, q_indptr.size - 1))
    previous = numba.get_num_threads()
    numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        return search_maxscore_parallel(*args, max(1, -(-(q_indptr.size - 1) // (4 * num_threads))))
    finally:
        numba.set_num_threads(previous)
