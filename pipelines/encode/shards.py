"""The job's Ray tasks that build index files from the encoders' part files: the quantiser
(``train_from_parts``, on a deterministic sample of every shard) and each shard (``finalize_shard``: FAISS
index, sparse index, BM25 term frequencies, display rows, written atomically)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.index.build import TRAINED_FILE, new_index, train_index, write_shard
from madr.index.manifest import atomic_write, atomic_write_text, sha256_file, shard_stem
from pipelines.encode.corpus import CorpusPlan, Piece
from pipelines.encode.stages import PARTS_DIR, parts_dir, read_aspects

TRAINED_RECORD = "trained.json"
DOCS_DIR = "docs"


def _shard_arrays(table: pa.Table, dim: int, vocab_size: int):
    from madr.search.sparse import SparseBatch

    ids = table.column("doc_id").to_numpy()
    dense = np.asarray(table.column("dense").combine_chunks().flatten().to_numpy(), np.float32).reshape(-1, dim)
    sparse = None
    if "sparse_indices" in table.column_names:
        ind = table.column("sparse_indices").combine_chunks()
        val = table.column("sparse_values").combine_chunks()
        offsets = ind.offsets.to_numpy().astype(np.int64)
        sparse = SparseBatch(offsets - offsets[0], ind.flatten().to_numpy(), val.flatten().to_numpy(), vocab_size)
    return ids, dense, sparse


def _term_counts(table: pa.Table, vocab_size: int):
    """The raw word-piece term frequencies of the ``lexical_ids`` column (rows in table order)."""
    from madr.index.lexical import term_counts

    col = table.column("lexical_ids").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.flatten().to_numpy()
    return term_counts([values[offsets[i]:offsets[i + 1]] for i in range(len(col))], vocab_size)


def finalize_shard(out_dir: str, run: str, shard: int, expected: int, index_factory: str, dim: int,
                   trained_path: str | None, vocab_size: int, store_docs: bool,
                   lexical: bool = False, lexical_vocab_size: int | None = None,
                   sparse_backend: dict | None = None) -> dict[str, Any]:
    """Build and write one shard from its part files (a Ray task); returns its ``ShardInfo`` as a dict.
    ``lexical_vocab_size``: the vocabulary of the BM25 pieces (default ``vocab_size``, the model's);
    ``sparse_backend``: ``madr.search.sparse.backend.SparseBackend.to_dict`` (None: exact)."""
    import faiss

    from madr.search.sparse.backend import SparseBackend

    src = parts_dir(out_dir, run, shard)
    files = sorted(src.glob("part-*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files]) if files else None
    if table is None or table.num_rows == 0:
        raise ValueError(f"shard {shard}: no rows were written (expected {expected})")
    _, first = np.unique(table.column("_pos").to_numpy(), return_index=True)
    table = table.take(pa.array(first))  # input order; a row written twice by a retried task counts once
    if table.num_rows != expected:
        raise ValueError(f"shard {shard}: {table.num_rows} distinct input rows were encoded, the plan has {expected}")
    ids, dense, sparse = _shard_arrays(table, dim, vocab_size)
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        dup = uniq[counts > 1]
        pos = table.column("_pos").to_numpy()[np.isin(ids, dup[:3])]
        raise ValueError(f"shard {shard}: {dup.size} duplicate document ids, e.g. {dup[:5].tolist()} "
                         f"(at input positions {pos[:6].tolist()})")
    extra = []
    if store_docs:
        docs = table.select(["doc_id", *[c for c in table.column_names if c.startswith("doc.")]])
        docs = docs.rename_columns([c.removeprefix("doc.") for c in docs.column_names])
        rel = f"{DOCS_DIR}/{shard_stem(shard)}.parquet"
        atomic_write(Path(out_dir) / rel, lambda tmp: pq.write_table(docs, tmp))
        extra.append(rel)
    trained = faiss.read_index(trained_path) if trained_path else new_index(index_factory, dim)
    lex = _term_counts(table, lexical_vocab_size or vocab_size) if lexical else None
    info = write_shard(out_dir, shard, trained, dense, ids, sparse, extra, lexical=lex,
                       sparse_backend=SparseBackend.from_dict(sparse_backend), aspects=read_aspects(table) or None)
    shutil.rmtree(src, ignore_errors=True)
    return info.to_dict()


def needs_training(index_factory: str, dim: int) -> bool:
    return not new_index(index_factory, dim).is_trained


def sample_pieces(plan: CorpusPlan, per_shard: int) -> list[Piece]:
    """The first pieces of every shard holding at least ``per_shard`` rows (the training sample's rows)."""
    out, have = [], dict.fromkeys(range(plan.num_shards), 0)
    for p in plan.pieces:
        if have[p.shard] < per_shard:
            out.append(p)
            have[p.shard] += p.rows
    return out


def train_from_parts(out_dir: str, run: str, pieces: list[int], per_shard: int, index_factory: str, dim: int,
                     seed: int) -> str:
    """(Ray task) Train the quantiser on the first ``per_shard`` rows of every shard, read back from the part
    files of the sample ``pieces``; writes ``trained.faiss`` and its checksum record; returns its path."""
    import faiss

    wanted = set(pieces)
    per: dict[int, list[pa.Table]] = {}
    for f in sorted((Path(out_dir) / PARTS_DIR / run).glob("shard-*/part-*.parquet")):
        t = pq.read_table(f, columns=["_shard", "_piece", "_pos", "dense"])
        t = t.filter(pa.array(np.isin(t.column("_piece").to_numpy(), list(wanted))))
        if t.num_rows:
            per.setdefault(int(t.column("_shard")[0].as_py()), []).append(t)
    sample = []
    for shard in sorted(per):
        t = pa.concat_tables(per[shard])
        _, first = np.unique(t.column("_pos").to_numpy(), return_index=True)  # input order, once each
        vecs = np.asarray(t.column("dense").combine_chunks().flatten().to_numpy(), np.float32).reshape(-1, dim)
        sample.append(vecs[first][:per_shard])
    trained = train_index(index_factory, dim, np.concatenate(sample), seed)
    path = Path(out_dir) / TRAINED_FILE
    atomic_write(path, lambda tmp: faiss.write_index(trained, tmp))
    atomic_write_text(Path(out_dir) / TRAINED_RECORD, json.dumps({"sha256": sha256_file(path)}))
    return str(path)


def existing_trained(out: Path) -> str | None:
    """``trained.faiss`` when its checksum record matches it."""
    path, record = out / TRAINED_FILE, out / TRAINED_RECORD
    if path.is_file() and record.is_file():
        if json.loads(record.read_text()).get("sha256") == sha256_file(path):
            return str(path)
    return None
