"""Exact top-k retrieval over sparse lexical vectors with an inverted index (paper 002 Sec. 4.1, Eq. 1
sparse term ``<sparse_q, sparse_p>``; Sec. 6.4 notes that scoring "in a loop" is what makes sparse ranking
slow, so a query batch is scored here by one sparse-sparse matrix product over the posting lists).

Layout: the document-term matrix [N, V] is kept in scipy CSC form, i.e. term-major: column ``t`` is the
posting list of term ``t`` (document rows ascending, with their weights). ``Q @ D.T`` then only reads the
posting lists of the terms the queries contain.

Result convention (``search``):
- Only documents with a strictly positive score are returned. With non-negative weights (SPLADE's
  log(1 + ReLU), BM25) these are exactly the documents that share a term with the query.
- Rows are padded with score ``-inf`` and id ``-1`` when fewer than ``k`` documents qualify; ``-1`` is
  therefore not a valid document id.
- Ranking is score descending, ties broken by global document id ascending, so results do not depend on
  insertion order.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from madr.search.params import SearchParams, resolve
from madr.search.protocol import PAD_ID, TopK, document_ids, pad_rows
from madr.search.sparse.compiled import search_taat
from madr.search.sparse.maxscore import search_maxscore
from madr.search.sparse.vectors import SparseBatch

_FORMAT = "madr.sparse.InvertedIndex/1"
AUTO_BATCH_ENTRIES = 4_000_000  # default query batch: about this many (query, doc) score slots per product
ENGINES = ("auto", "compiled", "maxscore", "scipy")
MAXSCORE_MAX_K = 24  # "auto" prunes up to this k: beyond, rescoring the survivors costs what pruning saves


def _as_ids(ids: Sequence[int] | np.ndarray | None, n: int, start: int) -> np.ndarray:
    """``ids`` as ``n`` non-negative int64 document ids; None: ``start, start + 1, ...``."""
    if ids is None:
        return np.arange(start, start + n, dtype=np.int64)
    return document_ids(ids, n)


def top_k_row(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` of one query's (scores, ids) among scores > 0: score desc, then id asc; unpadded."""
    positive = scores > 0
    if not positive.all():
        scores, ids = scores[positive], ids[positive]
    n = scores.size
    if n > k:
        kth = np.partition(scores, n - k)[n - k]  # k-th largest score: argpartition-style O(n) cut
        keep = scores >= kth  # keeps every tie at the cut; lexsort below breaks them by id
        scores, ids = scores[keep], ids[keep]
    order = np.lexsort((ids, -scores))[:k]
    return scores[order], ids[order]


def _prune_postings(csc: sp.csc_array, ids: np.ndarray, max_postings: int) -> sp.csc_array:
    """Keep the ``max_postings`` largest weights of every posting list (ties: lower global id)."""
    lens = np.diff(csc.indptr)
    if lens.max(initial=0) <= max_postings:
        return csc
    cols = np.repeat(np.arange(csc.shape[1]), lens)
    long = lens[cols] > max_postings
    sel = np.flatnonzero(long)
    order = sel[np.lexsort((ids[csc.indices[sel]], -csc.data[sel], cols[sel]))]
    sorted_cols = cols[order]
    first = np.searchsorted(sorted_cols, sorted_cols, side="left")
    keep = ~long
    keep[order[np.arange(order.size) - first < max_postings]] = True
    return sp.csc_array((csc.data[keep], (csc.indices[keep], cols[keep])), shape=csc.shape)


def term_maxima(csc: sp.csc_array) -> np.ndarray:
    """The largest weight of every posting list (float32 [V]; 0 for empty lists): MaxScore's per-term bound."""
    out = np.zeros(csc.shape[1], dtype=np.float32)
    lens = np.diff(csc.indptr)
    full = np.flatnonzero(lens)
    if full.size:
        out[full] = np.maximum.reduceat(csc.data, csc.indptr[full])
    return out


def _checked_term_max(path: str | Path, term_max: np.ndarray, csc: sp.csc_array) -> np.ndarray:
    """A saved ``term_max`` field, checked against the postings it bounds: a wrong bound would make MaxScore
    drop documents silently, and the check costs one pass, like the posting check before it."""
    if term_max.shape != (csc.shape[1],) or term_max.dtype != np.float32:
        raise ValueError(f"{path}: field 'term_max' has shape {term_max.shape} and dtype {term_max.dtype}, "
                         f"expected ({csc.shape[1]},) float32")
    expected = term_maxima(csc)
    if not np.array_equal(term_max, expected):
        t = int(np.flatnonzero(term_max != expected)[0])
        raise ValueError(f"{path}: field 'term_max' is {term_max[t]} for term {t}, its postings' largest "
                         f"weight is {expected[t]}")
    return term_max


class InvertedIndex:
    """Term-major (CSC) index of sparse document vectors with global int64 document ids.

    ``max_postings_per_term`` (off by default) statically prunes each posting list to its highest-weight
    entries; search is then exact only with respect to the pruned index.
    """

    def __init__(self, vocab_size: int, max_postings_per_term: int | None = None) -> None:
        if vocab_size < 1:
            raise ValueError(f"InvertedIndex: vocab_size must be >= 1, got {vocab_size}")
        if max_postings_per_term is not None and max_postings_per_term < 1:
            raise ValueError(f"InvertedIndex: max_postings_per_term must be >= 1 or None, "
                             f"got {max_postings_per_term}")
        self.vocab_size = int(vocab_size)
        self.max_postings_per_term = max_postings_per_term
        self._postings = sp.csc_array((0, self.vocab_size), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._pending: list[SparseBatch] = []
        self._term_max: np.ndarray | None = None  # per-term max weight, built with the postings (maxscore)
        self._non_negative: bool | None = None  # every posting weight >= 0 (MaxScore's bounds need it)

    @classmethod
    def build(cls, docs: SparseBatch, ids: Sequence[int] | np.ndarray | None = None,
              max_postings_per_term: int | None = None) -> InvertedIndex:
        """Index ``docs``; ``ids`` are their global ids (default 0..N-1)."""
        index = cls(docs.vocab_size, max_postings_per_term)
        index.add(docs, ids)
        return index

    # ---- building ----------------------------------------------------------------------------------------

    def add(self, docs: SparseBatch, ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Append documents; ``ids`` default to the next integers after the current count. Ids must stay
        unique over the whole index. The posting lists are rebuilt lazily, once, at the next search."""
        if docs.vocab_size != self.vocab_size:
            raise ValueError(f"add: docs have vocab_size {docs.vocab_size}, index has {self.vocab_size}")
        new_ids = _as_ids(ids, len(docs), len(self))
        all_ids = np.concatenate([self._ids, new_ids])
        uniq, counts = np.unique(all_ids, return_counts=True)
        if uniq.size != all_ids.size:
            raise ValueError(f"add: duplicate document id {int(uniq[counts > 1][0])}")
        self._ids = all_ids
        self._pending.append(docs)

    def _compact(self) -> sp.csc_array:
        if self._pending:
            pending = self._pending[0] if len(self._pending) == 1 else SparseBatch.concat(self._pending)
            new = pending.to_scipy()
            stacked = sp.vstack([self._postings, new], format="csr") if self._postings.shape[0] else new
            csc = sp.csc_array(stacked, dtype=np.float32)
            csc.sort_indices()
            if self.max_postings_per_term is not None:
                csc = _prune_postings(csc, self._ids, self.max_postings_per_term)
            self._postings = csc
            self._pending = []
            self._term_max = self._non_negative = None
        return self._postings

    def term_max(self) -> np.ndarray:
        """Each term's largest posting weight (float32 [V]; MaxScore's bounds), built once per compaction and
        saved with the index."""
        p = self._compact()
        if self._term_max is None:
            self._term_max = term_maxima(p)
        return self._term_max

    # ---- search ------------------------------------------------------------------------------------------

    def check_queries(self, queries: SparseBatch) -> None:
        if queries.vocab_size != self.vocab_size:
            raise ValueError(f"queries have vocab_size {queries.vocab_size}, index has {self.vocab_size}")

    def _batch_size(self, batch_size: int | None) -> int:
        """Queries per sparse product; ``None``: about ``AUTO_BATCH_ENTRIES`` score entries per product
        (frequent terms make each query row up to N long, and larger products only add memory traffic)."""
        if batch_size is None:
            return max(1, AUTO_BATCH_ENTRIES // max(len(self), 1))
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        return batch_size

    def _scores(self, queries: sp.csr_array, start: int, stop: int) -> sp.csr_array:
        """csr [stop - start, N] of query-document scores: one SpGEMM ``Q @ D.T`` over the posting lists
        (``D.T`` of the CSC index is a CSR [V, N] whose row t is term t's posting list; no copy)."""
        return sp.csr_array(queries[start:stop] @ self._postings.T)

    def _map_batches(self, queries: SparseBatch, batch_size: int | None, num_threads: int, fn) -> list:
        """``fn(start, scores_csr)`` for each query batch, in order; threads overlap (scipy's sparse kernels
        release the GIL)."""
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self._compact()
        q = queries.to_scipy()
        step = self._batch_size(batch_size)
        starts = range(0, len(queries), step)

        def run(start: int):
            return fn(start, self._scores(q, start, start + step))

        if num_threads == 1 or len(starts) == 1:
            return [run(s) for s in starts]
        with ThreadPoolExecutor(num_threads) as pool:
            return list(pool.map(run, starts))

    def search(self, queries: SparseBatch, params: SearchParams | None = None, *, batch_size: int | None = None,
               num_threads: int = 1, engine: str = "auto", **overrides) -> TopK:
        """Exact top ``params.k`` by dot product: (scores [Q, k] float32, ids [Q, k] int64), padded -inf / -1
        (a ``madr.search.protocol.Searcher``; only ``k`` applies).

        Engines, all with the same results: ``"compiled"``: one numba pass per query
        (``madr.search.sparse.compiled``), queries spread over ``num_threads`` threads. ``"maxscore"``: the same
        with MaxScore dynamic pruning (``madr.search.sparse.maxscore``; plain when a weight is negative).
        ``"auto"`` (default): ``maxscore`` for ``k <= MAXSCORE_MAX_K``, else ``compiled``. ``"scipy"``:
        ``batch_size`` queries per sparse product (``None``: chosen from the index size), ``num_threads`` > 1
        scores batches concurrently; the reference.
        """
        k = resolve(params, overrides).k
        self.check_queries(queries)
        if engine not in ENGINES:
            raise ValueError(f"search: engine must be one of {ENGINES}, got {engine!r}")
        if engine != "scipy":
            pruned = engine == "maxscore" or (engine == "auto" and k <= MAXSCORE_MAX_K)
            return self._search_compiled(queries, k, num_threads, pruned)

        def top(_: int, res: sp.csr_array) -> list[tuple[np.ndarray, np.ndarray]]:
            bounds = zip(res.indptr[:-1], res.indptr[1:], strict=True)
            return [top_k_row(res.data[s:e], self._ids[res.indices[s:e]], k) for s, e in bounds]

        batches = self._map_batches(queries, batch_size, num_threads, top)
        return pad_rows([row for rows in batches for row in rows], k)

    def _search_compiled(self, queries: SparseBatch, k: int, num_threads: int, pruned: bool) -> TopK:
        """The numba kernels; ``pruned``: MaxScore, when every weight is >= 0 (else its bounds do not hold)."""
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        p = self._compact()
        if len(queries) == 0:
            return pad_rows([], k)
        q = (np.asarray(queries.indptr, np.int64), np.asarray(queries.indices, np.int64),
             np.asarray(queries.values, np.float32))
        postings = (p.indptr.astype(np.int64, copy=False), p.indices.astype(np.int64, copy=False),
                    p.data.astype(np.float32, copy=False))
        if pruned and self.non_negative():
            return search_maxscore(*q, *postings, self.term_max(), self._ids, k, num_threads)
        return search_taat(*q, *postings, self._ids, k, num_threads)

    def non_negative(self) -> bool:
        """Every posting weight is >= 0 (SPLADE, BM25): MaxScore's bounds hold. Computed once per compaction."""
        p = self._compact()
        if self._non_negative is None:
            self._non_negative = bool(p.data.size == 0 or p.data.min() >= 0)
        return self._non_negative

    def _rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global ids -> (row positions, found mask); rows are 0 where not found."""
        if len(self) == 0:
            return np.zeros(ids.shape, dtype=np.int64), np.zeros(ids.shape, dtype=bool)
        order = np.argsort(self._ids, kind="stable")
        pos = np.minimum(np.searchsorted(self._ids, ids, sorter=order), order.size - 1)
        rows = order[pos]
        known = self._ids[rows] == ids
        return np.where(known, rows, 0), known

    def score(self, queries: SparseBatch, ids: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Exact scores [Q, C] float32 of query ``q`` against the documents ``ids[q]`` (global ids; -1 gives
        -inf). For re-scoring hybrid candidates (``madr.search.score_fusion``)."""
        self.check_queries(queries)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != len(queries):
            raise ValueError(f"score: ids must be [{len(queries)}, C], got shape {ids.shape}")
        rows, known = self._rows_of(ids)
        unknown = ~known & (ids != PAD_ID)
        if unknown.any():
            raise ValueError(f"score: document id {int(ids[unknown][0])} is not in the index")
        out = np.full(ids.shape, -np.inf, dtype=np.float32)

        def gather(start: int, res: sp.csr_array) -> None:
            for r in range(res.shape[0]):
                dense = np.zeros(len(self), dtype=np.float32)
                s, e = res.indptr[r], res.indptr[r + 1]
                dense[res.indices[s:e]] = res.data[s:e]
                q = start + r
                out[q, known[q]] = dense[rows[q, known[q]]]

        self._map_batches(queries, batch_size, 1, gather)
        return out

    # ---- size and persistence ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._ids.size)

    @property
    def ids(self) -> np.ndarray:
        """Global document ids in insertion order."""
        return self._ids

    def term_ids(self) -> np.ndarray:
        """The term ids with at least one posting, ascending (int64): the only terms a query can match on
        (``madr.search.query_encoder.LeanQueryEncoder`` projects queries onto them)."""
        return np.flatnonzero(np.diff(self._compact().indptr)).astype(np.int64)

    def documents_with_terms(self) -> int:
        """How many indexed documents have at least one posting (read off the postings, no row copy)."""
        return int(np.unique(self._compact().indices).size)

    def documents(self) -> SparseBatch:
        """The indexed document vectors in insertion order (rows of ``ids``; pruned postings stay pruned)."""
        return SparseBatch.from_scipy(sp.csr_array(self._compact()))

    @property
    def nbytes(self) -> int:
        """Bytes of the posting arrays (CSC data, row indices, column pointers) plus the id array."""
        p = self._compact()
        return int(p.data.nbytes + p.indices.nbytes + p.indptr.nbytes + self._ids.nbytes)

    def save(self, path: str | Path) -> None:
        """Write an uncompressed ``.npz`` of plain arrays (no pickle), ``term_max`` included (files written
        before it existed load too: it is rebuilt from the postings)."""
        p = self._compact()
        np.savez(path, format=np.array(_FORMAT), data=p.data, indices=p.indices, indptr=p.indptr,
                 ids=self._ids, vocab_size=np.array(self.vocab_size, dtype=np.int64),
                 max_postings_per_term=np.array(self.max_postings_per_term or 0, dtype=np.int64),
                 term_max=self.term_max())

    @staticmethod
    def saved_term_ids(path: str | Path) -> np.ndarray:
        """``term_ids`` of a file written by ``save``, reading only its column pointers (no postings)."""
        with np.load(path, allow_pickle=False) as f:
            if "indptr" not in f.files or str(f["format"]) != _FORMAT:
                raise ValueError(f"{path}: not an InvertedIndex file")
            return np.flatnonzero(np.diff(f["indptr"])).astype(np.int64)

    @classmethod
    def load(cls, path: str | Path) -> InvertedIndex:
        """Read a file written by ``save`` (``allow_pickle=False``)."""
        fields = {"format", "data", "indices", "indptr", "ids", "vocab_size", "max_postings_per_term"}
        with np.load(path, allow_pickle=False) as f:
            missing = fields - set(f.files)
            if missing:
                raise ValueError(f"{path}: not an InvertedIndex file, missing fields {sorted(missing)}")
            if str(f["format"]) != _FORMAT:
                raise ValueError(f"{path}: field 'format' is {str(f['format'])!r}, expected {_FORMAT!r}")
            arrays = {name: f[name] for name in fields - {"format"}}
            term_max = f["term_max"] if "term_max" in f.files else None
        vocab, n = int(arrays["vocab_size"]), int(arrays["ids"].size)
        if arrays["indptr"].shape != (vocab + 1,):
            raise ValueError(f"{path}: field 'indptr' has shape {arrays['indptr'].shape}, expected "
                             f"({vocab + 1},) for vocab_size {vocab}")
        index = cls(vocab, int(arrays["max_postings_per_term"]) or None)
        try:
            index._postings = sp.csc_array((arrays["data"], arrays["indices"], arrays["indptr"]),
                                           shape=(n, vocab))
            index._postings.check_format(full_check=True)
        except ValueError as e:
            raise ValueError(f"{path}: posting arrays are inconsistent ({e})") from e
        index._ids = _as_ids(arrays["ids"], n, 0)
        if term_max is not None:
            index._term_max = _checked_term_max(path, term_max, index._postings)
        return index
