"""Brute-force search: every query scored against every document, the reference the other searchers are
tested against.

Dense: ``<q, d>`` (inner product) over all documents. Hybrid (documents with sparse vectors too): paper 002
Eq. 1 over all documents, ``s = lam * <dense_q, dense_d> + (1 - lam) * <sparse_q, sparse_d>``, which is what
``HybridSearcher`` and ``ShardedIndex`` return with a Flat index and ``candidates`` >= the corpus size. Scores
are computed in float64 and returned as float32; ranking is score descending, ties by id ascending
(``madr.search.protocol``). Every document gets a score, so a result is padded only when ``k`` exceeds the
corpus size (the sparse ``InvertedIndex`` instead drops documents that share no term with the query).
"""

from __future__ import annotations

import numpy as np

from madr.search.params import SearchParams, resolve
from madr.search.protocol import PAD_ID, TopK
from madr.search.sparse import SparseBatch

_SCORE_SLOTS = 1 << 24  # queries per chunk: about this many (query, document) scores at a time


def exact_topk(scores: np.ndarray, ids: np.ndarray, k: int) -> TopK:
    """Top ``k`` of each row of ``scores`` [Q, N] (document ``ids`` [N]): score descending, ties by id
    ascending; ([Q, k] float32, [Q, k] int64), padded -inf / -1 when N < k."""
    nq, n = scores.shape
    take = min(k, n)
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :take]
    out_s = np.full((nq, k), -np.inf, np.float32)
    out_i = np.full((nq, k), PAD_ID, np.int64)
    out_s[:, :take] = np.take_along_axis(scores, order, 1)
    out_i[:, :take] = ids[order]
    return out_s, out_i


class ExactSearcher:
    """All documents in memory: dense [N, d] vectors, optionally sparse ones, global ``ids`` (default 0..N-1).

    ``hybrid_lambda`` is the lam of a search that does not set one (None: 1, dense only)."""

    def __init__(self, dense: np.ndarray, ids: np.ndarray | None = None, sparse: SparseBatch | None = None,
                 hybrid_lambda: float | None = None) -> None:
        self.dense = np.asarray(dense, dtype=np.float64)
        if self.dense.ndim != 2:
            raise ValueError(f"ExactSearcher: dense must be [N, d], got shape {self.dense.shape}")
        n = self.dense.shape[0]
        self.ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        if self.ids.shape != (n,) or np.unique(self.ids).size != n or (n and self.ids.min() < 0):
            raise ValueError(f"ExactSearcher: ids must be {n} unique non-negative integers")
        if sparse is not None and len(sparse) != n:
            raise ValueError(f"ExactSearcher: {len(sparse)} sparse rows for {n} documents")
        self.sparse = sparse.to_scipy().astype(np.float64) if sparse is not None else None
        self.vocab_size = sparse.vocab_size if sparse is not None else None
        self.hybrid_lambda = None if hybrid_lambda is None else SearchParams(lam=hybrid_lambda).lam

    def __len__(self) -> int:
        return int(self.ids.size)

    def _lam(self, params: SearchParams, sparse: SparseBatch | None) -> float:
        lam = params.lam if params.lam is not None else self.hybrid_lambda
        lam = 1.0 if lam is None else lam
        if params.normalisation_or("none") != "none":
            raise ValueError("ExactSearcher: only normalisation 'none' (scores over the whole corpus)")
        if lam < 1.0 and (self.sparse is None or sparse is None):
            raise ValueError(f"search: lam={lam} needs sparse document and query vectors")
        if lam < 1.0 and sparse.vocab_size != self.vocab_size:
            raise ValueError(f"search: queries have vocab_size {sparse.vocab_size}, documents {self.vocab_size}")
        return lam

    def search(self, queries: np.ndarray, params: SearchParams | None = None, *, sparse: SparseBatch | None = None,
               **overrides) -> TopK:
        """Exact top ``params.k`` of dense ``queries`` [Q, d] (+ ``sparse`` query vectors for hybrid lam < 1)."""
        p = resolve(params, overrides)
        q = np.asarray(queries, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != self.dense.shape[1]:
            raise ValueError(f"search: queries must be [Q, {self.dense.shape[1]}], got shape {q.shape}")
        if sparse is not None and len(sparse) != q.shape[0]:
            raise ValueError(f"search: {q.shape[0]} dense but {len(sparse)} sparse query vectors")
        lam = self._lam(p, sparse)
        step = max(1, _SCORE_SLOTS // max(len(self), 1))
        lexical = sparse.to_scipy().astype(np.float64) if lam < 1.0 else None
        parts = []
        for start in range(0, q.shape[0], step):
            scores = lam * (q[start:start + step] @ self.dense.T)
            if lexical is not None:
                scores = scores + (1.0 - lam) * (lexical[start:start + step] @ self.sparse.T).toarray()
            parts.append(exact_topk(scores, self.ids, p.k))
        if not parts:
            return np.zeros((0, p.k), np.float32), np.zeros((0, p.k), np.int64)
        return np.concatenate([s for s, _ in parts]), np.concatenate([i for _, i in parts])
