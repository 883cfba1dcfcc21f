"""A hybrid dense + sparse searcher over a document collection encoded by a hybrid BiEncoder (paper 002).

Each document has a dense vector (the CLS embedding; a `model.sparse_head` model's own vector, unit length for
cosine models) in a FAISS index (inner product; ``IndexFlatIP`` by
default, any ``faiss.index_factory`` string otherwise) and a sparse lexical vector (the top-k SPLADE term
weights of ``TowerOutput.sparse``) in an exact ``InvertedIndex``. A query batch is answered by

1. candidate generation: the dense top-``candidates`` from FAISS and the sparse top-``candidates`` from the
   inverted index (only documents sharing a term with the query), per query;
2. the union of both lists, and exact re-scoring of both parts for every candidate: the dense inner
   product from the stored vectors (or ``index.reconstruct``), the sparse one with ``InvertedIndex.score``;
3. paper 002 Eq. 1, ``s(q, p) = lambda * <dense_q, dense_p> + (1 - lambda) * <sparse_q, sparse_p>``
   (after the optional per-query normalisation of ``madr.search.score_fusion.normalise``), and the top ``k``.

Settings come as a ``madr.search.params.SearchParams`` (``k``, ``candidates``, ``lam``, ``normalisation``,
and ``nprobe`` / ``ef_search`` for an IVF / HNSW dense index); the searcher is a
``madr.search.protocol.Searcher``. Modes: ``hybrid`` (lambda from the params or the searcher's
``hybrid_lambda``), ``dense`` (lambda = 1, FAISS candidates only),
``sparse`` (lambda = 0, inverted-index candidates only). With a Flat index and ``candidates`` >= the corpus
size the result equals brute-force interpolation over the whole corpus. Scores are raw inner products, as in
``BiEncoder.hybrid_scores`` (the hybrid objective trains dot products). Results follow
``madr.search.score_fusion``: [Q, k] float32 scores and int64 ids padded with -inf / -1, ties by id ascending.

On disk a searcher is a directory: ``dense.faiss`` (``faiss.write_index``), ``sparse.npz``
(``InvertedIndex.save``) and ``searcher.npz`` (ids, the stored vectors, lambda, factory string); nothing is
pickled. The model is saved separately (``BiEncoder.save``) and handed to ``load``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch
from torch import nn

from madr.modeling.model import BiEncoder
from madr.search.params import SearchParams, resolve
from madr.search.protocol import PAD_ID, TopK, document_ids
from madr.search.query_encoder import LeanQueryEncoder
from madr.search.score_fusion import hybrid_merge, union_candidates
from madr.search.sharded import faiss_params
from madr.search.sparse import InvertedIndex, SparseBatch

MODES = ("hybrid", "dense", "sparse")
_FORMAT = "madr.HybridSearcher/1"
DENSE_FILE, SPARSE_FILE, META_FILE = "dense.faiss", "sparse.npz", "searcher.npz"


@dataclass
class EncodedTexts:
    """Dense [N, d] float32 vectors and sparse term-weight vectors of N texts."""

    dense: np.ndarray
    sparse: SparseBatch

    def __post_init__(self) -> None:
        self.dense = np.ascontiguousarray(self.dense, dtype=np.float32)
        if self.dense.ndim != 2 or self.dense.shape[0] != len(self.sparse):
            raise ValueError(f"EncodedTexts: dense must be [N, d] with N = {len(self.sparse)} sparse rows, "
                             f"got shape {self.dense.shape}")

    def __len__(self) -> int:
        return self.dense.shape[0]


@dataclass
class EncodedCorpus(EncodedTexts):
    """An encoded document collection with its global int64 ids (non-negative, unique)."""

    ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ids = _check_ids(self.ids, len(self))


def _check_ids(ids: np.ndarray | list[int] | None, n: int) -> np.ndarray:
    """``ids`` (default 0..n-1) as ``n`` unique non-negative int64 ids."""
    return document_ids(np.arange(n, dtype=np.int64) if ids is None else ids, n, unique=True)


def _require_hybrid(model: BiEncoder) -> None:
    if not model.config.has_sparse:
        raise ValueError(f"HybridSearcher needs a hybrid model (model.name=hybrid), got {model.config.name!r}")


@torch.no_grad()
def encode_hybrid(model: BiEncoder, texts: list[str], side: str, batch_size: int = 64) -> EncodedTexts:
    """Dense (CLS) and sparse (top-k term weights) vectors of ``texts`` through the ``side`` tower, eval mode.

    Texts are batched in order of length (less padding: the MLM logits are [batch, length, vocab]) and the
    rows returned in input order."""
    _require_hybrid(model)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    dense, sparse = [], []
    for i in range(0, len(texts), batch_size):
        enc = model.tokenize([texts[j] for j in order[i:i + batch_size]], side)
        out = model.encode(enc["input_ids"].to(device), enc["attention_mask"].to(device), side)
        emb = out.embedding.float()
        dense.append((nn.functional.normalize(emb, dim=-1) if model.config.unit_dense else emb).cpu().numpy())
        sparse.append(SparseBatch.from_dense(out.sparse.float().cpu()))
    model.train(was_training)
    if not dense:
        return EncodedTexts(np.zeros((0, model.embedding_dim), np.float32),
                            SparseBatch(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32),
                                        len(model.tokenizer)))
    inverse = np.argsort(np.asarray(order))
    return EncodedTexts(np.concatenate(dense)[inverse], SparseBatch.concat(sparse).select(inverse))


def encode_corpus(model: BiEncoder, texts: list[str], ids: np.ndarray | list[int] | None = None,
                  batch_size: int = 64) -> EncodedCorpus:
    """Encode documents with the document tower; ``ids`` default to 0..N-1."""
    enc = encode_hybrid(model, texts, "doc", batch_size)
    return EncodedCorpus(enc.dense, enc.sparse, ids)


def _empty_topk(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, 1), -np.inf, dtype=np.float32), np.full((n, 1), PAD_ID, dtype=np.int64)


class HybridSearcher:
    """Dense FAISS index + sparse inverted index over one collection; see the module docstring."""

    def __init__(self, dense_index: faiss.Index, sparse_index: InvertedIndex, ids: np.ndarray,
                 vectors: np.ndarray | None = None, hybrid_lambda: float = 0.5, index_factory: str = "Flat",
                 model: BiEncoder | None = None) -> None:
        self.ids = _check_ids(ids, dense_index.ntotal)
        if len(sparse_index) != self.ids.size or not np.array_equal(np.sort(sparse_index.ids), np.sort(self.ids)):
            raise ValueError(f"HybridSearcher: the sparse index holds {len(sparse_index)} documents whose ids "
                             f"differ from the dense index's {self.ids.size}")
        if vectors is not None and vectors.shape != (self.ids.size, dense_index.d):
            raise ValueError(f"HybridSearcher: vectors must be [{self.ids.size}, {dense_index.d}], got {vectors.shape}")
        if not 0.0 <= hybrid_lambda <= 1.0:
            raise ValueError(f"HybridSearcher: hybrid_lambda must be in [0, 1], got {hybrid_lambda}")
        if model is not None:
            _require_hybrid(model)
        self.dense_index, self.sparse_index, self.vectors = dense_index, sparse_index, vectors
        self.hybrid_lambda, self.index_factory, self.model = float(hybrid_lambda), index_factory, model
        self._order = np.argsort(self.ids)
        self._query_encoder: LeanQueryEncoder | None = None  # a LeanQueryEncoder of `model`, built on first use in eval mode

    # ---- construction ------------------------------------------------------------------------------------

    @classmethod
    def build(cls, corpus: EncodedCorpus, model: BiEncoder | None = None, hybrid_lambda: float | None = None,
              index_factory: str = "Flat", keep_vectors: bool = True) -> HybridSearcher:
        """Index an encoded corpus. ``hybrid_lambda`` (the lam of a search that does not set one) defaults to
        ``model.config.hybrid_lambda`` (0.5 without a model);
        ``keep_vectors=False`` re-scores from ``index.reconstruct`` instead of a stored copy."""
        if len(corpus) == 0:
            raise ValueError("HybridSearcher.build: the corpus is empty")
        dim = corpus.dense.shape[1]
        try:
            index = faiss.index_factory(dim, index_factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"HybridSearcher.build: bad FAISS index factory string {index_factory!r} ({e})") from e
        if not index.is_trained:
            index.train(corpus.dense)
        index.add(corpus.dense)
        if not keep_vectors:
            _enable_reconstruct(index, index_factory)
        sparse = InvertedIndex.build(corpus.sparse, corpus.ids)
        if hybrid_lambda is None:
            hybrid_lambda = model.config.hybrid_lambda if model is not None else 0.5
        return cls(index, sparse, corpus.ids, corpus.dense.copy() if keep_vectors else None, hybrid_lambda,
                   index_factory, model)

    @classmethod
    def from_texts(cls, model: BiEncoder, texts: list[str], ids: np.ndarray | list[int] | None = None,
                   batch_size: int = 64, hybrid_lambda: float | None = None,
                   index_factory: str = "Flat") -> HybridSearcher:
        """Encode ``texts`` with ``model``'s document tower and index them."""
        return cls.build(encode_corpus(model, texts, ids, batch_size), model, hybrid_lambda, index_factory)

    def __len__(self) -> int:
        return int(self.ids.size)

    # ---- scoring -----------------------------------------------------------------------------------------

    def encode_queries(self, queries: list[str], batch_size: int = 64) -> EncodedTexts:
        """Query vectors. A model in eval mode (a served one) goes through ``LeanQueryEncoder`` (built once:
        no mode switches per call, the same vectors); a model in training mode through ``encode_hybrid``, which
        puts it back in training mode after (e.g. a validation pass mid-training)."""
        if self.model is None:
            raise ValueError("HybridSearcher: no model to encode text queries; pass model= or use search_encoded")
        if isinstance(queries, str):
            raise ValueError("HybridSearcher: queries must be a list of strings, got one string")
        if self.model.training:
            return encode_hybrid(self.model, list(queries), "query", batch_size)
        if self._query_encoder is None:
            self._query_encoder = LeanQueryEncoder(self.model)
        dense, sparse = self._query_encoder.encode(list(queries), batch_size)
        return EncodedTexts(dense, sparse)

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Index rows of global ``ids`` (any shape, no padding)."""
        sorted_ids = self.ids[self._order]
        pos = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
        bad = sorted_ids[pos] != ids
        if bad.any():
            raise ValueError(f"HybridSearcher: document id {int(ids[bad].flat[0])} is not in the index")
        return self._order[pos]

    def _doc_vectors(self, rows: np.ndarray) -> np.ndarray:
        if self.vectors is not None:
            return self.vectors[rows]
        return self.dense_index.reconstruct_batch(rows.astype(np.int64))

    def score(self, queries: EncodedTexts, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact (dense, sparse) scores [Q, C] float64 of query ``q`` against documents ``ids[q]`` (global ids;
        -1 is padding and gets -inf in both)."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != len(queries):
            raise ValueError(f"score: ids must be [{len(queries)}, C], got shape {ids.shape}")
        live = ids != PAD_ID
        dense = np.full(ids.shape, -np.inf)
        if live.any():
            q_rows, _ = np.nonzero(live)
            vecs = self._doc_vectors(self._rows(ids[live])).astype(np.float64)
            dense[live] = np.einsum("nd,nd->n", vecs, queries.dense[q_rows].astype(np.float64))
        sparse = self.sparse_index.score(queries.sparse, ids).astype(np.float64)
        return dense, sparse

    # ---- search ------------------------------------------------------------------------------------------

    def _dense_topk(self, q: EncodedTexts, n: int, params: SearchParams) -> TopK:
        scores, rows = self.dense_index.search(q.dense, min(n, len(self)),
                                               params=faiss_params(self.dense_index, params))
        valid = rows >= 0
        ids = np.where(valid, self.ids[np.where(valid, rows, 0)], PAD_ID)
        return np.where(valid, scores, -np.inf).astype(np.float32), ids

    def _lam(self, mode: str, lam: float | None) -> float:
        if mode not in MODES:
            raise ValueError(f"search: mode must be one of {MODES}, got {mode!r}")
        if mode != "hybrid":
            if lam is not None:
                raise ValueError(f"search: lam is fixed in mode {mode!r} (dense: 1, sparse: 0); leave it None")
            return 1.0 if mode == "dense" else 0.0
        return self.hybrid_lambda if lam is None else lam

    def search_encoded(self, queries: EncodedTexts, params: SearchParams | None = None, *, mode: str = "hybrid",
                       **overrides) -> TopK:
        """``search`` for already encoded queries."""
        p = resolve(params, overrides)
        lam = self._lam(mode, p.lam)
        n, n_cand = len(queries), p.num_candidates
        dense = self._dense_topk(queries, n_cand, p) if mode != "sparse" else _empty_topk(n)
        sparse = self.sparse_index.search(queries.sparse, k=n_cand) if mode != "dense" else _empty_topk(n)
        unions, cand = union_candidates(dense[1], sparse[1])
        d_exact, s_exact = self.score(queries, cand)

        def rescore(q: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if not np.array_equal(ids, unions[q]):
                raise AssertionError("hybrid_merge built another candidate set than the searcher")
            return d_exact[q, : ids.size], s_exact[q, : ids.size]

        return hybrid_merge(dense, sparse, lam, p.k, p.normalisation_or("none"), rescore=rescore)

    def search(self, queries: list[str], params: SearchParams | None = None, *, mode: str = "hybrid",
               **overrides) -> TopK:
        """Top ``params.k`` (scores [Q, k] float32, ids [Q, k] int64) of each query by paper 002 Eq. 1 over the
        union of the dense and sparse top-``params.num_candidates`` (module docstring), padded -inf / -1."""
        p = resolve(params, overrides)
        self._lam(mode, p.lam)  # fail before encoding
        return self.search_encoded(self.encode_queries(queries), p, mode=mode)

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the directory layout of the module docstring."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.dense_index, str(path / DENSE_FILE))
        self.sparse_index.save(path / SPARSE_FILE)
        vectors = self.vectors if self.vectors is not None else np.zeros((0, self.dense_index.d), np.float32)
        np.savez(path / META_FILE, format=np.array(_FORMAT), ids=self.ids, vectors=vectors,
                 has_vectors=np.array(self.vectors is not None), lam=np.array(self.hybrid_lambda),
                 index_factory=np.array(self.index_factory))
        return path

    @classmethod
    def load(cls, path: str | Path, model: BiEncoder | None = None) -> HybridSearcher:
        """Read a directory written by ``save`` (no pickle); ``model`` encodes text queries."""
        path = Path(path)
        fields = {"format", "ids", "vectors", "has_vectors", "lam", "index_factory"}
        for name in (DENSE_FILE, SPARSE_FILE, META_FILE):
            if not (path / name).is_file():
                raise ValueError(f"{path}: not a HybridSearcher directory (no {name})")
        with np.load(path / META_FILE, allow_pickle=False) as f:
            missing = fields - set(f.files)
            if missing:
                raise ValueError(f"{path / META_FILE}: missing fields {sorted(missing)}")
            if str(f["format"]) != _FORMAT:
                raise ValueError(f"{path / META_FILE}: field 'format' is {str(f['format'])!r}, expected {_FORMAT!r}")
            meta = {name: f[name] for name in fields}
        index = faiss.read_index(str(path / DENSE_FILE))
        vectors = meta["vectors"] if bool(meta["has_vectors"]) else None
        return cls(index, InvertedIndex.load(path / SPARSE_FILE), meta["ids"], vectors, float(meta["lam"]),
                   str(meta["index_factory"]), model)


def _enable_reconstruct(index: faiss.Index, factory: str) -> None:
    """Make ``index.reconstruct`` work (IVF indexes need a direct map); a clear error where it cannot."""
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        ivf.make_direct_map()
    try:
        index.reconstruct(0)
    except RuntimeError as e:
        raise ValueError(f"FAISS index {factory!r} cannot reconstruct vectors; build with keep_vectors=True") from e
