"""One interface for every searcher and one result type.

A ``Searcher`` answers a batch of queries with ``search(queries, params, **overrides) -> TopK``: ``params`` is
a ``madr.search.params.SearchParams`` (None: its defaults) and ``overrides`` are single fields of it given
as keywords (``search(q, k=10)``). What a query is depends on the searcher (dense vectors, sparse vectors,
token lists, texts); the result does not: ``TopK`` = (scores [Q, k] float32, ids [Q, k] int64), best first,
ties broken by id ascending, padded with ``-inf`` / ``PAD_ID`` (-1) where fewer than ``k`` documents match.

Implementations: ``madr.search.exact.ExactSearcher`` (brute force, the reference), ``madr.search.sharded``
``Shard`` / ``ShardedIndex`` (FAISS shards of a ``madr.index`` manifest, dense or hybrid),
``madr.search.sparse`` ``InvertedIndex`` and ``BM25Index``, and ``madr.search.hybrid.HybridSearcher``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from madr.search.params import SearchParams

PAD_ID = -1
TopK = tuple[np.ndarray, np.ndarray]


@runtime_checkable
class Searcher(Protocol):
    """Anything with ``search(queries, params=None, **overrides) -> TopK`` (module docstring)."""

    def search(self, queries: Any, params: SearchParams | None = None, **overrides: Any) -> TopK: ...


def document_ids(ids: Sequence[int] | np.ndarray, n: int, what: str = "ids", unique: bool = False) -> np.ndarray:
    """``ids`` as ``n`` non-negative int64 document ids (``PAD_ID`` marks padding in results, so no id is
    negative); with ``unique``, no id twice. A ValueError names ``what`` and the first bad id."""
    arr = np.asarray(ids)
    if arr.shape != (n,) or (arr.size and arr.dtype.kind not in "iu"):
        raise ValueError(f"{what}: expected {n} integer ids, got shape {arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what}: ids must be >= 0 ({PAD_ID} marks padding), got {int(arr.min())}")
    if unique:
        uniq, counts = np.unique(arr, return_counts=True)
        if uniq.size != arr.size:
            raise ValueError(f"{what}: duplicate id {int(uniq[counts > 1][0])} ({int((counts > 1).sum())} ids "
                             f"repeated; ids must be unique)")
    return arr


def pad_rows(rows: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> TopK:
    """Per-query (scores, ids) of length <= k -> ([Q, k] float32 padded -inf, [Q, k] int64 padded -1)."""
    scores = np.full((len(rows), k), -np.inf, dtype=np.float32)
    ids = np.full((len(rows), k), PAD_ID, dtype=np.int64)
    for q, (s, i) in enumerate(rows):
        scores[q, : s.size] = s
        ids[q, : i.size] = i
    return scores, ids


def merge_topk(results: Sequence[TopK], k: int) -> TopK:
    """Best ``k`` of several (scores [Q, ki], ids [Q, ki]) lists of the same queries: score descending, ties
    by id ascending, padding (-1 / -inf) last. Returns ([Q, k] float32, [Q, k] int64)."""
    if k < 1:
        raise ValueError(f"merge_topk: k must be >= 1, got {k}")
    if not results:
        raise ValueError("merge_topk: no result lists")
    counts = {np.asarray(s).shape[0] for s, _ in results}
    if len(counts) != 1:
        raise ValueError(f"merge_topk: result lists have different query counts {sorted(counts)}")
    nq = counts.pop()
    scores = np.concatenate([np.asarray(s, dtype=np.float32).reshape(nq, -1) for s, _ in results], 1)
    ids = np.concatenate([np.asarray(i, dtype=np.int64).reshape(nq, -1) for _, i in results], 1)
    if scores.shape != ids.shape:
        raise ValueError(f"merge_topk: scores {scores.shape} and ids {ids.shape} differ in shape")
    pad = (ids == PAD_ID) | ~np.isfinite(scores)
    key = np.where(pad, np.inf, -scores.astype(np.float64))
    order = np.lexsort((np.where(pad, np.iinfo(np.int64).max, ids), key), axis=1)[:, :k]
    out_s = np.take_along_axis(np.where(pad, -np.inf, scores), order, 1).astype(np.float32)
    out_i = np.take_along_axis(np.where(pad, PAD_ID, ids), order, 1)
    if out_s.shape[1] < k:
        width = k - out_s.shape[1]
        out_s = np.pad(out_s, ((0, 0), (0, width)), constant_values=-np.inf)
        out_i = np.pad(out_i, ((0, 0), (0, width)), constant_values=PAD_ID)
    return out_s, out_i
