"""Writing a sharded index: train the quantiser once, write each shard atomically, then the manifest.

The pieces are shared by the in-process ``build_index`` (tests, small corpora) and the Ray encode job
(``pipelines.encode``), which calls ``train_index`` once on a sample of encoded documents and
``write_shard`` once per shard on an actor/task, then ``assemble_manifest``.

FAISS index types come from a factory string (inner product metric): ``Flat``, ``IVF{n},Flat``,
``IVF{n},PQ{m}[x{bits}]``, ``OPQ{m},IVF{n},PQ{m}``, ``HNSW{M}``, ... IVF indexes store the global ids
themselves (``add_with_ids``); the others are wrapped in ``IndexIDMap2`` (which can also reconstruct a
vector by id, used for exact hybrid re-scoring). Every shard is a copy of one trained index, so the
coarse quantiser (and OPQ / PQ codebooks) are identical across shards and shard scores are comparable.
A GPU is used for training and adding when faiss was built with GPU support and sees a device
(``faiss.get_num_gpus() > 0``); the stored index is always the CPU form.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.index.aspects import (
    ASPECTS_SUFFIX,
    AspectInfo,
    AspectTable,
    save_shard_aspects,
    select_rows,
    write_aspect_values,
)
from madr.index.lexical import TOKENIZER_DIR, merge_statistics, save_term_counts, save_tokenizer
from madr.index.manifest import (
    MANIFEST_FILE,
    Manifest,
    ShardInfo,
    atomic_save_npy,
    atomic_write,
    sha256_file,
    shard_stem,
)
from madr.search.protocol import document_ids
from madr.search.sparse import InvertedIndex, SparseBatch
from madr.search.sparse.backend import SEISMIC_SUFFIX, SparseBackend

DEFAULT_TRAIN_SIZE = 100_000
TRAINED_FILE = "trained.faiss"
DOCS_FILE = "docs.parquet"


def num_gpus() -> int:
    """GPUs faiss can use here (0 for faiss-cpu)."""
    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def new_index(index_factory: str, dim: int) -> faiss.Index:
    """An empty inner-product index from a factory string; a ValueError names a bad string."""
    if dim < 1:
        raise ValueError(f"index dim must be >= 1, got {dim}")
    try:
        return faiss.index_factory(int(dim), index_factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ValueError(f"bad FAISS index factory string {index_factory!r} ({str(e).strip()[:200]})") from None


def ivf_of(index: faiss.Index) -> faiss.IndexIVF | None:
    """The IVF part of ``index`` (through pre-transforms such as OPQ), or None."""
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def hnsw_of(index: faiss.Index) -> faiss.IndexHNSW | None:
    """The HNSW index inside ``index`` (through an ``IndexIDMap``), or None."""
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    return inner if isinstance(inner, faiss.IndexHNSW) else None


def _on_gpu(index: faiss.Index) -> faiss.Index | None:
    if num_gpus() == 0 or not hasattr(faiss, "index_cpu_to_all_gpus"):
        return None
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except (RuntimeError, AttributeError):  # index type without a GPU version (HNSW, OPQ, ...)
        return None


def train_index(index_factory: str, dim: int, sample: np.ndarray, seed: int = 0) -> faiss.Index:
    """An empty index of ``index_factory`` trained on ``sample`` [n, dim] (float32). Index types that need
    no training (Flat, HNSW) are returned as they are."""
    index = new_index(index_factory, dim)
    if index.is_trained:
        return index
    sample = _as_vectors(sample, dim, "train sample")
    ivf = ivf_of(index)
    if ivf is not None:
        ivf.cp.seed = 1234 + seed
        ivf = faiss.downcast_index(ivf)
        if isinstance(ivf, faiss.IndexIVFPQ):
            ivf.do_polysemous_training = False  # only for polysemous (Hamming) search, unused here; slow
            _match_opq_bits(index, ivf.pq.nbits)
        if sample.shape[0] < ivf.nlist:
            raise ValueError(f"index {index_factory!r}: {sample.shape[0]} training vectors for {ivf.nlist} lists; "
                             f"need at least as many vectors as lists")
    gpu = _on_gpu(index)
    if gpu is not None:
        gpu.train(sample)
        return faiss.index_gpu_to_cpu(gpu)
    index.train(sample)
    return index


def _match_opq_bits(index: faiss.Index, nbits: int) -> None:
    """Train an OPQ rotation with the index's own PQ code size (FAISS defaults to 8 bits, which needs 256
    centroids per sub-space and is slow and over-fitted on small samples when the index uses fewer bits)."""
    if not isinstance(index, faiss.IndexPreTransform):
        return
    for i in range(index.chain.size()):
        vt = faiss.downcast_VectorTransform(index.chain.at(i))
        if isinstance(vt, faiss.OPQMatrix):
            pq = faiss.ProductQuantizer(vt.d_out, vt.M, nbits)
            vt.pq = pq
            vt._madr_pq = pq  # keep the Python object alive while the transform points at it


def _as_vectors(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{what}: expected [n, {dim}] vectors, got shape {x.shape}")
    if not np.isfinite(x).all():
        row = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise ValueError(f"{what}: row {row} has a NaN or infinite value")
    return x


def shard_index(trained: faiss.Index, dense: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """A copy of ``trained`` holding ``dense`` under global ``ids`` (IDMap2 unless the index is IVF)."""
    index = faiss.clone_index(trained)
    if ivf_of(index) is None:
        index = faiss.IndexIDMap2(index)
    if dense.shape[0]:
        gpu = _on_gpu(index) if ivf_of(index) is not None else None
        if gpu is not None:
            gpu.add_with_ids(dense, ids)
            return faiss.index_gpu_to_cpu(gpu)
        index.add_with_ids(dense, ids)
    return index


def write_shard(out_dir: str | Path, shard: int, trained: faiss.Index, dense: np.ndarray, ids: np.ndarray,
                sparse: SparseBatch | None = None, extra_files: Sequence[str] = (),
                lexical: SparseBatch | None = None, sparse_backend: SparseBackend | None = None,
                aspects: AspectTable | None = None) -> ShardInfo:
    """Write shard ``shard`` (rows sorted by id) atomically: index, ids, sparse part, lexical part (``lexical``:
    the raw word-piece term frequencies of the same rows, ``madr.index.lexical``), aspect part (``aspects``: the
    rows' calibrated top-k aspect values, ``madr.index.aspects``), then its record. An
    approximate ``sparse_backend`` (``madr.search.sparse.backend``) adds its own index of the sparse part.

    ``extra_files`` (paths relative to ``out_dir``, already written, e.g. the shard's display rows) get
    their checksums recorded too. Returns the record (also saved as ``shard-NNNNN.json``, which marks the
    shard complete)."""
    out = Path(out_dir)
    dense = _as_vectors(dense, trained.d, f"shard {shard} vectors")
    ids = document_ids(ids, dense.shape[0], f"shard {shard} ids", unique=True)
    if sparse is not None and len(sparse) != ids.size:
        raise ValueError(f"shard {shard}: {len(sparse)} sparse rows for {ids.size} documents")
    if lexical is not None and len(lexical) != ids.size:
        raise ValueError(f"shard {shard}: {len(lexical)} lexical rows for {ids.size} documents")
    bad = [a for a, t in (aspects or {}).items() if len(t) != ids.size]
    if bad:
        raise ValueError(f"shard {shard}: aspect rows of {bad} differ from its {ids.size} documents")
    order = np.argsort(ids, kind="stable")
    dense, ids = dense[order], ids[order]
    stem, backend = shard_stem(shard), sparse_backend or SparseBackend()
    files = {"dense": f"{stem}.faiss", "ids": f"{stem}.ids.npy",
             "sparse": f"{stem}.sparse.npz" if sparse is not None else None,
             "lexical": f"{stem}.lexical.npz" if lexical is not None else None,
             "approx": f"{stem}{SEISMIC_SUFFIX}" if sparse is not None and backend.approximate else None,
             "aspects": f"{stem}{ASPECTS_SUFFIX}" if aspects else None}
    index = shard_index(trained, dense, ids)
    atomic_write(out / files["dense"], lambda tmp: faiss.write_index(index, tmp))
    atomic_save_npy(out / files["ids"], ids)
    if sparse is not None:
        inv = InvertedIndex.build(sparse.select(order), ids)
        atomic_write(out / files["sparse"], lambda tmp: _save_npz(inv, tmp))
        if files["approx"]:
            atomic_write(out / files["approx"], lambda tmp: backend.write(inv, tmp))
    if lexical is not None:
        save_term_counts(out / files["lexical"], lexical.select(order))
    if aspects:
        save_shard_aspects(out / files["aspects"], select_rows(aspects, order))
    info = ShardInfo(shard=shard, dense_path=files["dense"], sparse_path=files["sparse"], ids_path=files["ids"],
                     count=int(ids.size), min_id=int(ids[0]) if ids.size else -1,
                     max_id=int(ids[-1]) if ids.size else -1, lexical_path=files["lexical"],
                     approx_sparse_path=files["approx"], aspects_path=files["aspects"])
    info.sha256 = {rel: sha256_file(out / rel) for rel in [*info.files(), *extra_files]}
    info.save(out / f"{stem}.json")
    return info


def _save_npz(inv: InvertedIndex, tmp: str) -> None:
    with open(tmp, "wb") as f:  # a file object keeps numpy from appending ".npz" to the temp name
        inv.save(f)


def completed_shard(out_dir: str | Path, shard: int, verify: bool = True) -> ShardInfo | None:
    """The record of shard ``shard`` when it is complete (record present and, with ``verify``, every
    checksum matching), else None."""
    path = Path(out_dir) / f"{shard_stem(shard)}.json"
    if not path.is_file():
        return None
    try:
        info = ShardInfo.load(path)
        if verify:
            info.verify(out_dir)
    except ValueError:
        return None
    return info if info.shard == shard else None


def write_docs(out_dir: str | Path, docs: pa.Table) -> str:
    """Write the display table (must have an int ``doc_id`` column) atomically; returns its relative path."""
    if "doc_id" not in docs.column_names:
        raise ValueError(f"docs table needs a 'doc_id' column, has {docs.column_names}")
    atomic_write(Path(out_dir) / DOCS_FILE, lambda tmp: pq.write_table(docs, tmp))
    return DOCS_FILE


def assemble_manifest(out_dir: str | Path, shards: Sequence[ShardInfo], dim: int, index_factory: str,
                      hybrid_lambda: float | None = None, sparse_vocab_size: int | None = None,
                      model_dir: str | None = None, config_hash: str | None = None,
                      docs_path: str | None = None, lexical_vocab_size: int | None = None,
                      fusion_lambda: float = 0.5, lexical_tokenizer: str | None = None,
                      sparse_backend: SparseBackend | None = None,
                      aspects: AspectInfo | None = None) -> Path:
    """Write ``manifest.json`` over complete shards (ids unique across shards, or a ValueError). With
    ``lexical_vocab_size`` (shards with a lexical part) the collection's BM25 statistics are merged from the
    shards' files first (``madr.index.lexical.merge_statistics``) and recorded with ``fusion_lambda``, and with
    ``lexical_tokenizer`` (a directory under ``out_dir`` holding the lexical part's own tokenizer) its files'
    checksums. ``aspects``: the record of the shards' aspect part (its values file already written)."""
    shards = sorted(shards, key=lambda s: s.shard)
    report = id_report(out_dir, shards)
    if report["duplicates"]:
        raise ValueError(f"{out_dir}: {len(report['duplicates'])} ids occur in more than one shard row, "
                         f"e.g. {report['duplicates'][:5]}")
    lexical = None
    if lexical_vocab_size is not None:
        missing = [s.shard for s in shards if not s.lexical_path]
        if missing:
            raise ValueError(f"{out_dir}: shards {missing} have no lexical part")
        lexical = merge_statistics(out_dir, [s.lexical_path for s in shards], lexical_vocab_size,
                                   fusion_lambda, tokenizer_path=lexical_tokenizer).to_dict()
    manifest = Manifest(dim=int(dim), index_factory=index_factory, num_docs=sum(s.count for s in shards),
                        shards=list(shards), model_dir=model_dir, config_hash=config_hash,
                        hybrid_lambda=hybrid_lambda,
                        sparse_vocab_size=sparse_vocab_size, docs_path=docs_path, lexical=lexical,
                        sparse_backend=_backend_record(shards, sparse_backend),
                        aspects=None if aspects is None else aspects.to_dict())
    return manifest.save(Path(out_dir) / MANIFEST_FILE)


def _backend_record(shards: Sequence[ShardInfo], backend: SparseBackend | None) -> dict | None:
    """The manifest's ``sparse_backend`` (None: exact); an approximate one needs its file in every shard."""
    if backend is None or not backend.approximate:
        return None
    missing = [s.shard for s in shards if s.sparse_path and not s.approx_sparse_path]
    if missing:
        raise ValueError(f"shards {missing} have no {backend.name} index (built with another sparse_backend?)")
    return backend.to_dict()


def id_report(out_dir: str | Path, shards: Sequence[ShardInfo],
              expected_ids: np.ndarray | None = None) -> dict[str, list[int] | int]:
    """Exactly-once check over the shards' id files: ``duplicates`` (ids held more than once),
    ``missing`` / ``unexpected`` (against ``expected_ids`` when given) and ``num_ids``."""
    parts = [np.load(Path(out_dir) / s.ids_path, allow_pickle=False) for s in shards]
    for s, ids in zip(shards, parts, strict=True):
        if ids.size != s.count:
            raise ValueError(f"shard {s.shard}: {s.ids_path} holds {ids.size} ids, its record says {s.count}")
    all_ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    uniq, counts = np.unique(all_ids, return_counts=True)
    report: dict[str, list[int] | int] = {"num_ids": int(all_ids.size),
                                          "duplicates": uniq[counts > 1].tolist(), "missing": [], "unexpected": []}
    if expected_ids is not None:
        expected = np.unique(np.asarray(expected_ids, dtype=np.int64))
        report["missing"] = np.setdiff1d(expected, uniq).tolist()
        report["unexpected"] = np.setdiff1d(uniq, expected).tolist()
    return report


def build_index(dense: np.ndarray, ids: np.ndarray, out_dir: str | Path, num_shards: int,
                index_factory: str = "Flat", sparse: SparseBatch | None = None, hybrid_lambda: float | None = None,
                model_dir: str | None = None, config_hash: str | None = None, docs: pa.Table | None = None,
                train_size: int | None = None, seed: int = 0, lexical: SparseBatch | None = None,
                fusion_lambda: float = 0.5, lexical_tokenizer: Any | None = None,
                sparse_backend: SparseBackend | None = None, aspects: AspectTable | None = None,
                aspect_values: dict[str, list[str]] | None = None, calibrated: bool = False) -> Path:
    """Build a sharded index in-process; returns the manifest path. ``lexical``: the documents' raw word-piece
    term frequencies (``madr.index.lexical.term_counts``), for BM25 fused with the dense scores at
    ``fusion_lambda`` by default; ``lexical_tokenizer``: the tokenizer they were counted with when it is not
    the model's (saved into the index, ``madr.index.lexical.TOKENIZER_DIR``; queries are then split by it);
    ``sparse_backend``: how the sparse part is searched (``madr.search.sparse.backend``; default exact);
    ``aspects`` / ``aspect_values``: the documents' calibrated top-k aspect values and each aspect's value strings
    (``madr.index.aspects``; ``calibrated``: the distributions were temperature-scaled).

    Rows are sorted by id and cut into ``num_shards`` contiguous id ranges (sizes differ by at most one).
    The quantiser is trained once on ``train_size`` rows sampled with ``seed`` (default: all rows up to
    ``DEFAULT_TRAIN_SIZE``). With ``sparse`` the manifest's ``hybrid_lambda`` defaults to 0.5 (paper 002 Eq. 1)."""
    dense = np.ascontiguousarray(dense, dtype=np.float32)
    if dense.ndim != 2 or dense.shape[0] == 0:
        raise ValueError(f"build_index: dense must be a non-empty [N, d] matrix, got shape {dense.shape}")
    ids = document_ids(ids, dense.shape[0], unique=True)
    if not 1 <= num_shards <= dense.shape[0]:
        raise ValueError(f"build_index: num_shards must be in [1, {dense.shape[0]}], got {num_shards}")
    if sparse is not None and hybrid_lambda is None:
        hybrid_lambda = 0.5
    if lexical_tokenizer is not None and (lexical is None or len(lexical_tokenizer) != lexical.vocab_size):
        raise ValueError("build_index: lexical_tokenizer needs lexical term counts over its vocabulary "
                         f"({len(lexical_tokenizer)} pieces)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trained = train_index(index_factory, dense.shape[1], sample_rows(dense, train_size, seed), seed)
    order = np.argsort(ids, kind="stable")
    infos = []
    for s, rows in enumerate(np.array_split(order, num_shards)):
        part = sparse.select(rows) if sparse is not None else None
        lex = lexical.select(rows) if lexical is not None else None
        infos.append(write_shard(out, s, trained, dense[rows], ids[rows], part, lexical=lex,
                                 sparse_backend=sparse_backend,
                                 aspects=None if aspects is None else select_rows(aspects, rows)))
    docs_path = write_docs(out, docs) if docs is not None else None
    if lexical_tokenizer is not None:
        save_tokenizer(lexical_tokenizer, out / TOKENIZER_DIR)
    return assemble_manifest(out, infos, dense.shape[1], index_factory, hybrid_lambda,
                             sparse.vocab_size if sparse is not None else None, model_dir, config_hash, docs_path,
                             lexical.vocab_size if lexical is not None else None, fusion_lambda,
                             TOKENIZER_DIR if lexical_tokenizer is not None else None, sparse_backend,
                             aspect_record(out, aspects, aspect_values, calibrated))


def aspect_record(out_dir: str | Path, aspects: AspectTable | None, values: dict[str, list[str]] | None,
                  calibrated: bool = False) -> AspectInfo | None:
    """Write ``aspect_values.json`` and return the manifest's aspects record (None without ``aspects``)."""
    if not aspects:
        return None
    return aspect_info(out_dir, list(aspects), int(next(iter(aspects.values())).values.shape[1]), values, calibrated)


def aspect_info(out_dir: str | Path, names: list[str], k: int, values: dict[str, list[str]] | None,
                calibrated: bool = False) -> AspectInfo:
    """Write ``aspect_values.json`` for the aspects ``names`` and return the manifest's record of a top-``k``
    aspect part."""
    if values is None or not set(names) <= set(values):
        raise ValueError(f"aspect values: need the value strings of every stored aspect {sorted(names)}")
    digest = write_aspect_values(out_dir, {a: list(values[a]) for a in names})
    return AspectInfo(k=k, aspects=list(names), sha256=digest, calibrated=calibrated)


def sample_rows(x: np.ndarray, size: int | None, seed: int = 0) -> np.ndarray:
    """``size`` rows of ``x`` drawn without replacement with ``seed`` (in row order), all when fewer."""
    size = DEFAULT_TRAIN_SIZE if size is None else size
    if size < 1:
        raise ValueError(f"train_size must be >= 1, got {size}")
    if x.shape[0] <= size:
        return x
    rows = np.sort(np.random.default_rng(seed).choice(x.shape[0], size, replace=False))
    return x[rows]


def describe(out_dir: str | Path) -> str:
    """One line per shard for logs."""
    m = Manifest.load(Path(out_dir) / MANIFEST_FILE)
    return json.dumps({"num_docs": m.num_docs, "shards": [(s.shard, s.count) for s in m.shards]})
