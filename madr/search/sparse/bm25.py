"""BM25 over pre-tokenised text as a sparse index: the lexical baseline of paper 002 (Table 3) and paper 004
Sec. VI-D ("token-based terms": BM25 on (word)piece tokens instead of words).

Each document becomes a sparse vector of BM25 term weights (Robertson & Zaragoza 2009, the reference of
paper 004)::

    w(t, d) = idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))

so that ``BM25(q, d) = sum_{t in q} qtf(t) * w(t, d)`` is the dot product of a query term-count vector with
the document vector, scored by the same inverted index as SPLADE vectors (``InvertedIndex``).

- ``idf="lucene"`` (default, as in Lucene / Anserini): ``log(1 + (N - df + 0.5) / (df + 0.5))``, always > 0.
- ``idf="okapi"`` (as ``rank_bm25.BM25Okapi``): ``log((N - df + 0.5) / (df + 0.5))`` with negative values
  replaced by ``epsilon * mean idf`` over the vocabulary.
- Defaults ``k1=0.9, b=0.4`` are Anserini's. The ``(k1 + 1)`` factor, which Lucene >= 8 drops, only scales
  all scores and leaves rankings unchanged. Document lengths are exact token counts (Lucene stores them
  lossily).
- ``query_weighting="count"`` repeats a query term's contribution per occurrence (Lucene / rank_bm25);
  ``"binary"`` counts each distinct query term once. Query tokens absent from the corpus are ignored.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import scipy.sparse as sp

from madr.search.params import SearchParams
from madr.search.protocol import TopK
from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.vectors import SparseBatch

Tokens = Sequence[Hashable]


def _check_tokens(tokens: object, what: str) -> None:
    if isinstance(tokens, str | bytes) or not isinstance(tokens, Sequence | np.ndarray):
        raise ValueError(f"{what} must be a list of tokens (strings or wordpiece ids), got "
                         f"{type(tokens).__name__}; tokenise the text first")


def bm25_idf(df: np.ndarray, n_docs: int, kind: str = "lucene", epsilon: float = 0.25) -> np.ndarray:
    """idf of every term from its document frequency ``df`` [V] over ``n_docs`` documents (module docstring;
    ``"okapi"``: negative values -> ``epsilon`` * the mean idf over the given terms)."""
    df = np.asarray(df, dtype=np.float64)
    if kind == "lucene":
        return np.log1p((n_docs - df + 0.5) / (df + 0.5))
    idf = np.log((n_docs - df + 0.5) / (df + 0.5))
    return np.where(idf < 0, epsilon * idf.mean(), idf) if idf.size else idf


def bm25_weights(tf: sp.csr_array, doc_len: np.ndarray, idf: np.ndarray, avgdl: float, k1: float = 0.9,
                 b: float = 0.4) -> sp.csr_array:
    """Raw term frequencies [N, V] (CSR) -> BM25 document weights ``w(t, d)`` of the module docstring, with
    corpus statistics given from outside (``idf`` [V], ``avgdl``): a shard of a larger collection weighted
    with the collection's statistics scores as the collection would (``madr.index.lexical``)."""
    tf = sp.csr_array(tf, dtype=np.float64, copy=True)
    doc_len = np.asarray(doc_len, dtype=np.float64)
    if doc_len.shape != (tf.shape[0],):
        raise ValueError(f"bm25_weights: doc_len must be [{tf.shape[0]}], got shape {doc_len.shape}")
    norm = k1 * (1.0 - b + b * doc_len / avgdl) if avgdl > 0 else np.full(doc_len.shape, k1)  # per doc
    row_of = np.repeat(np.arange(tf.shape[0]), np.diff(tf.indptr))
    tf.data = np.asarray(idf, dtype=np.float64)[tf.indices] * tf.data * (k1 + 1.0) / (tf.data + norm[row_of])
    return tf


class BM25Index:
    """BM25 weights in an ``InvertedIndex``; build with ``fit(documents, ids)``, query with ``search``."""

    def __init__(self, k1: float = 0.9, b: float = 0.4, idf: str = "lucene", epsilon: float = 0.25,
                 query_weighting: str = "count") -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25Index: need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if idf not in ("lucene", "okapi"):
            raise ValueError(f"BM25Index: idf must be 'lucene' or 'okapi', got {idf!r}")
        if query_weighting not in ("count", "binary"):
            raise ValueError(f"BM25Index: query_weighting must be 'count' or 'binary', got {query_weighting!r}")
        self.k1, self.b, self.idf_kind, self.epsilon = float(k1), float(b), idf, float(epsilon)
        self.query_weighting = query_weighting
        self.vocabulary: dict[Hashable, int] = {}
        self.idf: np.ndarray = np.zeros(0)
        self.avgdl = 0.0
        self.index: InvertedIndex | None = None

    def _term_counts(self, documents: Sequence[Tokens]) -> sp.csr_array:
        """[N, V] token counts of the corpus; every new token gets the next id (queries: ``encode_queries``)."""
        rows, cols = [], []
        for d, tokens in enumerate(documents):
            _check_tokens(tokens, f"document {d}")
            for tok in tokens:
                rows.append(d)
                cols.append(self.vocabulary.setdefault(tok, len(self.vocabulary)))
        counts = sp.coo_array((np.ones(len(rows), np.float64), (np.array(rows, np.int64),
                               np.array(cols, np.int64))), shape=(len(documents), max(len(self.vocabulary), 1)))
        return counts.tocsr()  # sums duplicate (doc, term) pairs into term frequencies


    def fit(self, documents: Sequence[Tokens], ids: Sequence[int] | np.ndarray | None = None) -> BM25Index:
        """Index tokenised ``documents`` (``ids``: global ids, default 0..N-1). Returns ``self``."""
        if len(documents) == 0:
            raise ValueError("BM25Index.fit: no documents")
        self.vocabulary = {}
        tf = self._term_counts(documents)
        if not self.vocabulary:
            raise ValueError("BM25Index.fit: the documents contain no tokens")
        n_docs = tf.shape[0]
        doc_len = np.array([len(d) for d in documents], dtype=np.float64)
        self.avgdl = float(doc_len.mean())
        df = np.bincount(tf.indices, minlength=tf.shape[1]).astype(np.float64)
        self.idf = bm25_idf(df, n_docs, self.idf_kind, self.epsilon)
        weights = bm25_weights(tf, doc_len, self.idf, self.avgdl, self.k1, self.b)
        self.index = InvertedIndex.build(SparseBatch.from_scipy(weights), ids)
        return self

    def encode_queries(self, queries: Sequence[Tokens]) -> SparseBatch:
        """Tokenised queries -> term-count (or binary) vectors over the corpus vocabulary."""
        if self.index is None:
            raise ValueError("BM25Index: call fit() before encoding or searching")
        binary = self.query_weighting == "binary"
        indptr, terms, weights = [0], [], []
        for q, tokens in enumerate(queries):  # plain dicts: a live query must not pay for scipy's COO -> CSR
            _check_tokens(tokens, f"query {q}")
            counts: dict[int, int] = {}
            for tok in tokens:
                t = self.vocabulary.get(tok)
                if t is not None:
                    counts[t] = counts.get(t, 0) + 1
            for t in sorted(counts):
                terms.append(t)
                weights.append(1.0 if binary else counts[t])
            indptr.append(len(terms))
        return SparseBatch(np.array(indptr, np.int64), np.array(terms, np.int32), np.array(weights, np.float32),
                           vocab_size=self.index.vocab_size)

    def search(self, queries: Sequence[Tokens], params: SearchParams | None = None, *,
               batch_size: int | None = None, **overrides) -> TopK:
        """Top ``params.k`` BM25 (scores [Q, k] float32, ids [Q, k] int64), padded -inf / -1 (see InvertedIndex)."""
        batch = self.encode_queries(queries)
        assert self.index is not None
        return self.index.search(batch, params, batch_size=batch_size, **overrides)
