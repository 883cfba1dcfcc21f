"""Searching a sharded index (``madr.index.manifest``): per-shard dense / hybrid top-k and the merge.

``Shard`` and ``ShardedIndex`` are ``madr.search.protocol.Searcher``s: ``search(dense, params, sparse=...)``
with a ``madr.search.params.SearchParams``. Dense search is the FAISS inner-product top-k of each shard
(``nprobe`` for IVF, ``ef_search`` for HNSW, passed per call as FAISS ``SearchParameters``, so concurrent
searches with different settings do not interfere).

Hybrid search (paper 002 Eq. 1, ``s = lam * <dense_q, dense_p> + (1 - lam) * <sparse_q, sparse_p>``)
follows ``madr.search.hybrid.HybridSearcher`` within each shard: the dense and the sparse top-``candidates``
nominate documents, every candidate is re-scored exactly (dense from the vector the index reconstructs,
sparse from the inverted index) and interpolated without normalisation, so a score does not depend on which
shard a document lives in; ``merge_topk`` then keeps the best ``k`` over all shards. With Flat shards and
``candidates`` >= the shard size the result equals the unsharded ``HybridSearcher`` (exhaustive candidates)
and brute-force search (``madr.search.exact``).

Dense + BM25 fusion (indexes whose manifest has a ``lexical`` part, ``madr.index.lexical``):
``search(dense, params, lexical=term_counts)``. Every shard nominates its dense top-``candidates`` and its BM25
top-``candidates`` (BM25 weights computed with the collection's statistics, so BM25 scores are comparable
across shards); each list is merged over all shards to the global top-``candidates``, and the two are fused
per query by ``madr.search.score_fusion.weighted_fusion([dense, bm25], [lam, 1 - lam], k, normalisation)``:
normalised over the union of both lists (``"minmax"`` unless the params say otherwise), a document missing
from one list taking that list's minimum. ``lam`` None takes the manifest's ``fusion_lambda``. The fused
result equals exact dense top-``candidates`` over all documents plus ``BM25Index().fit`` over all documents'
word pieces, fused the same way (Flat shards); the lists are merged before fusing, so the normalisation sees
the same candidates however the index is sharded (``fuse_candidates``, also what the Serve app runs after
fanning out to its shard groups).

Aspect-match fusion (indexes with aspect data, ``madr.index.aspects``): ``search(..., aspects=query_table)`` with
the queries' calibrated top-k aspect values (``madr.modeling.aspect_distributions.encode_aspects``) and an
``aspect_weight`` > 0 (the params', else the manifest's) re-scores the base search's candidates with the
aspect-match score (``madr.search.aspect_match.aspect_rescore``; stage ``aspects``).

Results follow ``madr.search.protocol``: [Q, k] float32 scores and int64 global ids, padded with -inf / -1,
ties broken by id ascending. Writing an index (shards, manifest, checksums) is ``madr.index``.

Stages (``madr.search.timing``, for a caller that collects them): ``dense`` (FAISS), ``sparse`` (the hybrid
sparse top-``candidates``), ``bm25``, ``fusion`` (hybrid re-scoring and interpolation; dense + BM25 fusion) and
``merge`` (the top-``k`` over shards).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from madr.index.build import hnsw_of, ivf_of
from madr.index.lexical import LexicalInfo, bm25_shard_index
from madr.index.manifest import MANIFEST_FILE, Manifest, ShardInfo, sha256_file
from madr.search.aspect_match import AspectStore, aspect_rescore
from madr.search.params import SearchParams, resolve
from madr.search.protocol import PAD_ID, TopK, merge_topk
from madr.search.score_fusion import fuse_candidates as fuse_weighted
from madr.search.score_fusion import fusion_candidates, hybrid_merge, union_candidates
from madr.search.sparse import InvertedIndex, SparseBatch
from madr.search.sparse.backend import SparseBackend
from madr.search.sparse.seismic_index import SeismicSparseIndex
from madr.search.timing import stage

__all__ = ["Shard", "ShardedIndex", "faiss_params", "fuse_candidates", "load_shard", "sparse_term_ids"]

FUSED_NORMALISATION = "minmax"  # dense + BM25 fusion's default (SearchParams.normalisation None)


def _manifest_path(path: str | Path) -> Path:
    path = Path(path)
    return path / MANIFEST_FILE if path.is_dir() else path


def faiss_params(index: faiss.Index, params: SearchParams) -> faiss.SearchParameters | None:
    """Per-call FAISS parameters for ``index`` (IVF ``params.nprobe``, HNSW ``params.ef_search``), wrapped
    through pre-transforms; None when neither applies (the index's own settings)."""
    inner = index.index if isinstance(index, faiss.IndexPreTransform) else index
    nprobe, ef_search = params.nprobe, params.ef_search
    out = None
    if nprobe is not None and ivf_of(index) is not None:
        out = faiss.SearchParametersIVF(nprobe=int(nprobe))
    elif ef_search is not None and hnsw_of(index) is not None:
        out = faiss.SearchParametersHNSW(efSearch=int(ef_search))
    if out is not None and inner is not index:
        out = faiss.SearchParametersPreTransform(index_params=out)
    return out


def _read_index(path: Path, mmap: bool) -> faiss.Index:
    if mmap:
        try:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            pass  # index types without mmap support are read into memory
    try:
        return faiss.read_index(str(path))
    except RuntimeError as e:
        raise ValueError(f"{path}: not a readable FAISS index ({str(e).strip()[:200]})") from None


def fuse_candidates(dense: list[TopK], bm25: list[TopK], lam: float, params: SearchParams) -> TopK:
    """Dense + BM25 fusion of per-shard (or per-shard-group) candidate lists: each kind merged to the global
    top ``params.num_candidates``, then ``weighted_fusion([dense, bm25], [lam, 1 - lam], params.k)`` with
    ``params.normalisation`` (default min-max)."""
    return fuse_weighted(fusion_inputs(dense, bm25, params), [lam, 1.0 - lam], params.k)


def fusion_inputs(dense: list[TopK], bm25: list[TopK], params: SearchParams) -> list[tuple[np.ndarray, np.ndarray]]:
    """What ``fuse_candidates`` fuses before the weight (``score_fusion.fusion_candidates`` of the merged lists):
    ``score_fusion.fuse_candidates(inputs, [lam, 1 - lam], params.k)`` is ``fuse_candidates`` at that ``lam``,
    so a grid of weights merges and normalises once."""
    n = params.num_candidates
    return fusion_candidates([merge_topk(dense, n), merge_topk(bm25, n)], params.normalisation_or(FUSED_NORMALISATION))


class Shard:
    """One shard: a FAISS index over global ids, its id array and, for hybrid indexes, an inverted index;
    for indexes with a lexical part, the BM25 inverted index of the same documents."""

    def __init__(self, index: faiss.Index, ids: np.ndarray, sparse: InvertedIndex | SeismicSparseIndex | None = None,
                 hybrid_lambda: float | None = None, shard: int = 0, lexical: InvertedIndex | None = None,
                 fusion_lambda: float | None = None, fusion_normalisation: str = FUSED_NORMALISATION) -> None:
        if index.ntotal != ids.size:
            raise ValueError(f"shard {shard}: the FAISS index holds {index.ntotal} vectors but {ids.size} ids")
        if sparse is not None and len(sparse) != ids.size:
            raise ValueError(f"shard {shard}: the sparse index holds {len(sparse)} documents but {ids.size} ids")
        if lexical is not None and len(lexical) != ids.size:
            raise ValueError(f"shard {shard}: the BM25 index holds {len(lexical)} documents but {ids.size} ids")
        self.index, self.ids, self.sparse, self.shard = index, ids, sparse, shard
        self.hybrid_lambda = hybrid_lambda  # the manifest's: the lam of a search that does not set one
        self.lexical, self.fusion_lambda = lexical, fusion_lambda
        self.fusion_normalisation = fusion_normalisation  # the manifest's: a search that sets none fuses with it
        self._lock = threading.Lock()
        self._direct_map = False

    @property
    def ntotal(self) -> int:
        return int(self.ids.size)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    # ---- vectors -----------------------------------------------------------------------------------------

    def reconstruct(self, ids: np.ndarray) -> np.ndarray:
        """Stored dense vectors [n, d] of global ``ids`` (exact for Flat / HNSW / IVF-Flat, decoded for PQ)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if isinstance(self.index, faiss.IndexIDMap):
            pos = np.minimum(np.searchsorted(self.ids, ids), max(self.ids.size - 1, 0))
            if ids.size and (self.ids.size == 0 or (self.ids[pos] != ids).any()):
                raise ValueError(f"shard {self.shard}: id {int(ids[self.ids[pos] != ids][0])} is not in this shard")
            return faiss.downcast_index(self.index.index).reconstruct_batch(pos.astype(np.int64))
        with self._lock:
            if not self._direct_map:
                ivf_of(self.index).set_direct_map_type(faiss.DirectMap.Hashtable)
                self._direct_map = True
        try:
            return self.index.reconstruct_batch(ids)
        except RuntimeError as e:
            raise ValueError(f"shard {self.shard}: cannot reconstruct ids ({str(e).strip()[:120]})") from None

    # ---- search ------------------------------------------------------------------------------------------

    def _resolve_lam(self, sparse: SparseBatch | None, params: SearchParams) -> float | None:
        lam = self.hybrid_lambda if params.lam is None else params.lam
        if lam is None or lam == 1.0:
            return None
        if self.sparse is None:
            raise ValueError(f"search: lam={lam} asks for hybrid search but the index has no sparse shards")
        if sparse is None:
            raise ValueError(f"search: lam={lam} needs sparse query vectors (hybrid model); pass sparse= or lam=1")
        return lam

    def _dense_topk(self, dense: np.ndarray, k: int, params: faiss.SearchParameters | None) -> TopK:
        n = dense.shape[0]
        if self.ntotal == 0:
            return np.full((n, k), -np.inf, np.float32), np.full((n, k), PAD_ID, np.int64)
        scores, ids = self.index.search(dense, min(k, self.ntotal), params=params)
        valid = ids >= 0
        return np.where(valid, scores, -np.inf).astype(np.float32), np.where(valid, ids, PAD_ID)

    def _check_dense(self, dense: np.ndarray) -> np.ndarray:
        dense = np.ascontiguousarray(dense, dtype=np.float32)
        if dense.ndim != 2 or dense.shape[1] != self.dim:
            raise ValueError(f"search: dense queries must be [Q, {self.dim}], got shape {dense.shape}")
        return dense

    def fusion_lam(self, params: SearchParams) -> float:
        """The lam of a dense + BM25 search: the params', else the manifest's ``fusion_lambda``."""
        if self.lexical is None:
            raise ValueError("search: lexical query terms were given but the index has no lexical (BM25) part; "
                             "build it with lexical: bm25")
        return float(self.fusion_lambda if params.lam is None else params.lam)

    def fusion_params(self, params: SearchParams) -> SearchParams:
        """``params`` with the manifest's fusion weight and normalisation where they set none."""
        return params.replace(lam=self.fusion_lam(params),
                              normalisation=params.normalisation_or(self.fusion_normalisation))

    def candidates(self, dense: np.ndarray, lexical: SparseBatch, params: SearchParams | None = None,
                   **overrides) -> tuple[TopK, TopK]:
        """This shard's dense and BM25 top ``params.num_candidates`` (each [Q, c], padded): what
        ``fuse_candidates`` fuses once every shard's lists are in."""
        p = resolve(params, overrides)
        dense = self._check_dense(dense)
        self.fusion_lam(p)
        if len(lexical) != dense.shape[0]:
            raise ValueError(f"search: {dense.shape[0]} dense but {len(lexical)} lexical query vectors")
        n = p.num_candidates
        with stage("dense"):
            d_top = self._dense_topk(dense, n, faiss_params(self.index, p))
        with stage("bm25"):
            b_top = self.lexical.search(lexical, k=n)
        return d_top, b_top

    def search(self, dense: np.ndarray, params: SearchParams | None = None, *, sparse: SparseBatch | None = None,
               lexical: SparseBatch | None = None, **overrides) -> TopK:
        """Top ``params.k`` of this shard per query (module docstring): ([Q, k] float32, [Q, k] int64), padded.

        ``params.lam`` None takes the manifest's ``hybrid_lambda``; dense-only when that is None or 1.
        ``params.candidates`` (hybrid only, default max(k, 100)) is how many documents each retriever nominates.
        ``lexical`` (query word-piece counts, indexes with a BM25 part): dense + BM25 fusion over this shard."""
        p = resolve(params, overrides)
        if lexical is not None:
            d_top, b_top = self.candidates(dense, lexical, p)
            p = self.fusion_params(p)
            with stage("fusion"):
                return fuse_candidates([d_top], [b_top], p.lam, p)
        dense = self._check_dense(dense)
        if p.normalisation_or("none") != "none":
            raise ValueError(f"search: a sharded index interpolates unnormalised scores (a score must not depend on "
                             f"the shard), got normalisation {p.normalisation!r}")
        lam = self._resolve_lam(sparse, p)
        fp = faiss_params(self.index, p)
        if lam is None:
            with stage("dense"):
                return merge_topk([self._dense_topk(dense, p.k, fp)], p.k)
        if len(sparse) != dense.shape[0]:
            raise ValueError(f"search: {dense.shape[0]} dense but {len(sparse)} sparse query vectors")
        return self._hybrid(dense, sparse, lam, p.k, p.num_candidates, fp)

    def _hybrid(self, dense: np.ndarray, sparse: SparseBatch, lam: float, k: int, n_cand: int,
                params: faiss.SearchParameters | None) -> TopK:
        with stage("dense"):
            d_top = self._dense_topk(dense, n_cand, params)
        with stage("sparse"):
            s_top = self.sparse.search(sparse, k=n_cand) if self.ntotal else d_top
        with stage("fusion"):  # exact scores of the candidates' union, interpolated
            return self._rescore(dense, sparse, d_top, s_top, lam, k)

    def _rescore(self, dense: np.ndarray, sparse: SparseBatch, d_top: TopK, s_top: TopK, lam: float, k: int) -> TopK:
        _, cand = union_candidates(d_top[1], s_top[1])
        live = cand != PAD_ID
        d_exact = np.full(cand.shape, -np.inf)
        if live.any():
            q_rows, _ = np.nonzero(live)
            vecs = self.reconstruct(cand[live]).astype(np.float64)
            d_exact[live] = np.einsum("nd,nd->n", vecs, dense[q_rows].astype(np.float64))
        s_exact = self.sparse.score(sparse, cand).astype(np.float64)

        def rescore(q: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return d_exact[q, : ids.size], s_exact[q, : ids.size]

        return hybrid_merge(d_top, s_top, lam, k, "none", rescore=rescore)


def load_shard(manifest_path: str | Path, shard: int, mmap: bool = False, verify: bool = True) -> Shard:
    """Open shard ``shard`` of a manifest; ``verify`` checks its sha256 checksums first (ValueError naming
    the file), ``mmap`` maps the FAISS file instead of reading it (types that support it)."""
    path = _manifest_path(manifest_path)
    manifest = Manifest.load(path)
    if not 0 <= shard < len(manifest.shards):
        raise ValueError(f"{path}: no shard {shard} (the index has {len(manifest.shards)})")
    return _open_shard(path.parent, manifest.shards[shard], manifest, mmap, verify)


def _open_shard(base: Path, info: ShardInfo, manifest: Manifest, mmap: bool, verify: bool,
                idf: np.ndarray | None = None) -> Shard:
    if verify:
        info.verify(base)
    index = _read_index(base / info.dense_path, mmap)
    if index.d != manifest.dim:
        raise ValueError(f"{base / info.dense_path}: dimension {index.d}, manifest says {manifest.dim}")
    ids = np.load(base / info.ids_path, mmap_mode="r" if mmap else None, allow_pickle=False)
    sparse = InvertedIndex.load(base / info.sparse_path) if info.sparse_path else None
    if sparse is not None and manifest.sparse_backend is not None:
        approx = base / info.approx_sparse_path if info.approx_sparse_path else None
        sparse = SparseBackend.from_dict(manifest.sparse_backend).open(sparse, approx)
    lexical, lam, norm = None, None, FUSED_NORMALISATION
    if manifest.lexical is not None and info.lexical_path:
        lex = LexicalInfo.from_dict(manifest.lexical)
        if idf is None:
            if verify:
                lex.verify(base)
            idf = lex.idf_values(base)
        lexical, lam = bm25_shard_index(base / info.lexical_path, np.asarray(ids), lex, idf), lex.fusion_lambda
        norm = lex.normalisation
    return Shard(index, ids, sparse, manifest.hybrid_lambda, info.shard, lexical, lam, norm)


def candidate_pool(params: SearchParams, fused: bool) -> int:
    """How many base candidates the aspect stage re-scores: the whole union of the dense and BM25 top
    ``candidates`` for a fused search (at most twice that), else the top ``candidates`` (at least ``k``)."""
    n = max(params.num_candidates, params.k)
    return 2 * n if fused else n


def sparse_term_ids(manifest_path: str | Path, verify: bool = True) -> np.ndarray | None:
    """The term ids with a posting in any shard's sparse index (ascending int64), None for an index without
    sparse shards: the vocabulary a hybrid query encoder may project onto
    (``madr.search.query_encoder.LeanQueryEncoder``). Reads only each shard's column pointers, so a process
    that encodes queries does not load the postings; ``verify`` checks the sparse files' checksums first
    (not the dense ones: this process does not read them)."""
    path = _manifest_path(manifest_path)
    manifest = Manifest.load(path)
    if not manifest.shards or any(not info.sparse_path for info in manifest.shards):
        return None
    parts = []
    for info in manifest.shards:
        file = path.parent / info.sparse_path
        if verify and sha256_file(file) != info.sha256.get(info.sparse_path):
            raise ValueError(f"shard {info.shard}: checksum mismatch (or none recorded) for {file}")
        parts.append(InvertedIndex.saved_term_ids(file))
    return np.unique(np.concatenate(parts)).astype(np.int64)


class ShardedIndex:
    """All shards of a manifest, searched one after the other and merged (``merge_topk``)."""

    def __init__(self, manifest: Manifest, shards: list[Shard], base: Path | None = None,
                 aspects: AspectStore | None = None) -> None:
        self.manifest, self.shards, self.base = manifest, shards, base
        self.aspects = aspects  # the products' stored aspect values (None: the index has none)
        self._lexical_tokenizer: Any = None

    @classmethod
    def open(cls, manifest_path: str | Path, mmap: bool = False, verify: bool = True) -> ShardedIndex:
        """Open every shard of ``manifest_path`` (a manifest file or its directory)."""
        path = _manifest_path(manifest_path)
        manifest = Manifest.load(path)
        idf = None
        if manifest.lexical is not None:
            lex = LexicalInfo.from_dict(manifest.lexical)
            if verify:
                lex.verify(path.parent)
            idf = lex.idf_values(path.parent)
        shards = [_open_shard(path.parent, info, manifest, mmap, verify, idf)
                  for info in manifest.shards]
        return cls(manifest, shards, path.parent, AspectStore.open(path))

    @property
    def dim(self) -> int:
        return self.manifest.dim

    @property
    def ntotal(self) -> int:
        return sum(s.ntotal for s in self.shards)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def has_sparse(self) -> bool:
        return bool(self.shards) and all(s.sparse is not None for s in self.shards)

    def sparse_term_ids(self) -> np.ndarray | None:
        """The term ids with a posting in any shard (ascending int64), None without sparse shards."""
        if not self.has_sparse:
            return None
        return np.unique(np.concatenate([s.sparse.term_ids() for s in self.shards])).astype(np.int64)

    @property
    def hybrid_lambda(self) -> float | None:
        """The lam of paper 002 Eq. 1 the index was built with (its manifest's): a search's default."""
        return self.manifest.hybrid_lambda

    @property
    def has_lexical(self) -> bool:
        """The index has a BM25 part (``madr.index.lexical``): searches with ``lexical=`` fuse dense + BM25."""
        return bool(self.shards) and all(s.lexical is not None for s in self.shards)

    @property
    def fusion_lambda(self) -> float | None:
        """The lam of dense + BM25 fusion recorded at build time (None without a lexical part)."""
        return self.shards[0].fusion_lambda if self.has_lexical else None

    @property
    def search_mode(self) -> str:
        """``dense``, ``hybrid`` (SPLADE, paper 002 Eq. 1) or ``dense+bm25``."""
        return self.manifest.search_mode

    @property
    def lexical_tokenizer(self) -> Any | None:
        """The lexical part's own tokenizer (``madr.index.lexical.TOKENIZER_DIR``, loaded once from the index
        directory), or None: its queries are split by the model's tokenizer."""
        if self._lexical_tokenizer is None and self.has_lexical and self.base is not None:
            self._lexical_tokenizer = LexicalInfo.from_dict(self.manifest.lexical).tokenizer(self.base)
        return self._lexical_tokenizer

    def query_terms(self, tokenizer, texts: list[str]) -> SparseBatch | None:
        """BM25 query vectors (word-piece counts of the raw ``texts``) when the index has a lexical part: split
        by the index's own lexical tokenizer when it has one, else by ``tokenizer`` (the model's)."""
        if not self.has_lexical:
            return None
        from madr.index.lexical import query_term_counts

        own = self.lexical_tokenizer
        return query_term_counts(tokenizer if own is None else own, texts, self.shards[0].lexical.vocab_size)

    def reconstruct(self, ids: np.ndarray) -> np.ndarray:
        """Dense vectors of global ``ids`` (found through the shards' id ranges)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.zeros((ids.size, self.dim), np.float32)
        done = np.zeros(ids.size, bool)
        for s in self.shards:
            if s.ntotal == 0:
                continue
            pos = np.minimum(np.searchsorted(s.ids, ids), s.ntotal - 1)
            here = (s.ids[pos] == ids) & ~done
            if here.any():
                out[here] = s.reconstruct(ids[here])
                done |= here
        if not done.all():
            raise ValueError(f"reconstruct: id {int(ids[~done][0])} is in no shard")
        return out

    def aspect_weight(self, params: SearchParams) -> float:
        """The aspect-match weight of a search: the params', else the manifest's (0 without aspect data); a
        weight > 0 asked of an index without aspect data is a ValueError."""
        if params.aspect_weight is None:
            return self.manifest.aspect_weight
        if params.aspect_weight > 0 and self.aspects is None:
            raise ValueError("search: aspect_weight > 0 but the index has no aspect data (built from a model "
                             "without aspect heads, or with encode.aspect_top_k 0)")
        return params.aspect_weight

    def search(self, dense: np.ndarray, params: SearchParams | None = None, *, sparse: SparseBatch | None = None,
               lexical: SparseBatch | None = None, aspects: dict | None = None, **overrides) -> TopK:
        """``Shard.search`` on every shard, merged to the global top ``params.k``; with ``lexical`` (query
        word-piece counts, ``query_terms``) dense + BM25 fusion over all shards; with ``aspects`` (the queries'
        top-k aspect values) and an aspect weight > 0, aspect-match fusion over the candidates (module
        docstring)."""
        p = resolve(params, overrides)
        weight = self.aspect_weight(p)
        if weight == 0:
            return self._search(dense, p, sparse, lexical)
        if aspects is None:
            raise ValueError(f"search: aspect_weight {weight:g} but no query aspect values were given (aspects=: "
                             "madr.modeling.aspect_distributions.encode_aspects); set aspect_weight 0 to search "
                             "without them")
        base = self._search(dense, p.replace(k=candidate_pool(p, lexical is not None)), sparse, lexical)
        with stage("aspects"):
            return aspect_rescore(base, aspects, self.aspects, weight, p.k)

    def _search(self, dense: np.ndarray, p: SearchParams, sparse: SparseBatch | None,
                lexical: SparseBatch | None) -> TopK:
        if not self.shards:
            raise ValueError("search: the index has no shards")
        if lexical is not None:
            parts = [s.candidates(dense, lexical, p) for s in self.shards]
            p = self.shards[0].fusion_params(p)
            with stage("fusion"):
                return fuse_candidates([d for d, _ in parts], [b for _, b in parts], p.lam, p)
        parts = [s.search(dense, p, sparse=sparse) for s in self.shards]
        with stage("merge"):
            return merge_topk(parts, p.k)
