"""The per-batch stages of the encode job, each a ``map_batches`` callable over Arrow tables.

- ``TokenizeDocs`` (CPU actor): ``text`` -> ``input_ids`` (ragged list<int32>, special tokens, truncated,
  unpadded), rows sorted by length within the window (length bucketing, so forward batches pad little);
  with ``lexical`` also ``lexical_ids``, the word pieces of the raw text (no model prefix, no special tokens,
  no truncation: ``madr.index.lexical.word_pieces``), which travel to the part files for the BM25 part; they
  are the pieces of ``lexical_tokenizer`` (the tokenizer the job saved in the index) when given, else the model's.
- ``EncodeDocs`` (GPU or CPU actor): the model is loaded once per actor; each window is cut, in length
  order, into forward batches of ``batch_size`` rows (``forward_batch_size``), padded per batch and run under autocast
  (bf16 / fp16 on GPUs); out come ``dense`` (fixed-size list<float32>) and, for hybrid models,
  ``sparse_indices`` / ``sparse_values`` (the top-k SPLADE term weights, paper 002 Sec. 4.2). In the
  job the actor writes them itself (``write_parts``: Parquet parts per shard under
  ``parts/<run>/shard-NNNNN/``) and returns only (shard, rows): vectors never travel to the driver.
- ``TokenizeEncodeDocs``: both in one actor (``encode.tokenize_in_encoder``, the default when encoding on CPU):
  one process to start instead of two, torch and the tokenizer imported once, no hop between the stages; the
  output equals ``EncodeDocs(TokenizeDocs(batch))``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.index.manifest import atomic_write, shard_stem
from pipelines.encode.trace import event

PARTS_DIR = "parts"

event("stages imported")  # a worker has imported the job's code (trace: benchmarks.speed.encode)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("encode.device is 'cuda' but torch sees no GPU")
    return device


def forward_batch_size(device: str, width: int) -> int:
    """Rows per forward pass when ``encode.batch_size`` is None: 128 on a GPU. On CPU, 32 rows for a backbone
    ``width`` (hidden size) of 384 or more, where a piece's length-sorted rows cut into small batches pad less and
    fit the caches (faster than 128 for MiniLM), and up to 128 for
    narrower models, whose batches cost little and whose per-batch overhead dominates."""
    if device == "cuda":
        return 128
    return int(min(128, max(32, 32 * 384 // max(width, 1))))


def resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        if device != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype == "int8":  # int8 weights (EncodeDocs quantises the model), float32 activations
        if device == "cuda":
            raise ValueError("encode.dtype: int8 (dynamic quantisation) runs on the CPU, not on cuda")
        return torch.float32
    return getattr(torch, dtype)


class TokenizeDocs:
    """``map_batches`` actor: the model's tokenizer, loaded once (``pipelines.data.tokenize.make_encoder``), and
    with ``lexical`` the tokenizer of the BM25 pieces (``lexical_tokenizer``, a directory; None: the model's)."""

    def __init__(self, model_dir: str, max_length: int | None = None, lexical: bool = False,
                 lexical_tokenizer: str | None = None) -> None:
        event("TokenizeDocs init start")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one actor per core share
        import json

        from madr.modeling.tokenization import load_tokenizer
        from pipelines.data.tokenize import make_encoder

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.max_length = int(max_length or cfg.get("max_doc_length", 128))
        self.prefix = (cfg.get("text_prefixes") or {}).get("doc", "")  # e.g. e5's "passage: "
        self.tokenizer = load_tokenizer(Path(model_dir) / "tokenizer")
        self.encode = make_encoder(self.tokenizer, self.max_length)
        self.lexical = lexical
        self.lexical_tokenizer = load_tokenizer(lexical_tokenizer) if lexical and lexical_tokenizer else self.tokenizer
        event("TokenizeDocs init end")

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        ids = ragged(self.encode([self.prefix + t for t in texts] if self.prefix else texts))
        lengths = np.diff(ids.offsets.to_numpy())
        out = batch.drop_columns(["text"]).append_column("input_ids", ids)
        if self.lexical:  # BM25 indexes the raw text: no prefix, no special tokens, no truncation
            from madr.index.lexical import word_pieces

            out = out.append_column("lexical_ids", ragged(word_pieces(self.lexical_tokenizer, texts)))
        return out.take(pa.array(np.argsort(lengths, kind="stable")))


class EncodeDocs:
    """``map_batches`` actor holding the ``BiEncoder`` on its device (see the module docstring). ``expect``
    (``dim``, ``vocab_size``: what the driver read from the model's files, ``resume.model_info``) is checked
    against the loaded model, so the manifest never records other values than the vectors have."""

    def __init__(self, model_dir: str, batch_size: int | None = None, device: str = "auto", dtype: str = "auto",
                 torch_threads: int | None = None, out_dir: str | None = None, run: str | None = None,
                 expect: dict[str, int] | None = None, aspect_top_k: int = 0) -> None:
        event("EncodeDocs init start")
        import torch

        from madr.modeling.backbone import hidden_size
        from madr.modeling.model import BiEncoder

        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model = BiEncoder.load(model_dir).to(self.device).eval()
        if dtype == "int8":
            from madr.export.quantize import int8_model

            self.model = int8_model(self.model)
        got = {"dim": int(self.model.embedding_dim), "vocab_size": len(self.model.tokenizer)}
        if expect and any(got[k] != v for k, v in expect.items()):
            raise ValueError(f"{model_dir}: the loaded model has {got}, its files said {expect}")
        backbone = self.model.query_tower.backbone
        width = hidden_size(backbone) if backbone is not None else 128
        self.batch_size = batch_size or forward_batch_size(self.device, width)
        self.out_dir, self.run = out_dir, run
        # the products' calibrated top-k aspect values (madr.index.aspects): aspect models only
        self.aspect_k = aspect_top_k if aspect_top_k and self.model.predicts_aspect_values else None
        self.calls = 0
        event("EncodeDocs init end")

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = self.encode(batch)
        out = out if self.out_dir is None else write_parts(out, self.out_dir, self.run)
        self.calls += 1
        if self.calls == 1:
            event(f"EncodeDocs first call end ({batch.num_rows} rows)")
        return out

    def encode(self, batch: pa.Table) -> pa.Table:
        from madr.index.encode import encode_token_batch

        rows = batch.column("input_ids").to_pylist()
        order = np.argsort([len(r) for r in rows], kind="stable")
        dense, sparse, aspects = [], [], []
        for i in range(0, len(rows), self.batch_size):
            chunk = [rows[j] for j in order[i:i + self.batch_size]]
            d, s, *a = encode_token_batch(self.model, chunk, "doc", self.device, self.dtype, self.aspect_k)
            dense.append(d)
            sparse.append(s)
            aspects.extend(a)
        out = batch.drop_columns(["input_ids"]).take(pa.array(order))
        if not dense:
            return out
        vecs = np.concatenate(dense).astype(np.float32)
        out = out.append_column("dense", pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), vecs.shape[1]))
        if sparse[0] is not None:
            from madr.search.sparse import SparseBatch

            sb = SparseBatch.concat(sparse)
            offsets = pa.array(sb.indptr.astype(np.int32))
            out = out.append_column("sparse_indices", pa.ListArray.from_arrays(offsets, pa.array(sb.indices)))
            out = out.append_column("sparse_values", pa.ListArray.from_arrays(offsets, pa.array(sb.values)))
        if aspects:
            out = append_aspects(out, aspects)
        return out


class TokenizeEncodeDocs:
    """``map_batches`` actor: ``TokenizeDocs`` then ``EncodeDocs`` in one process (module docstring)."""

    def __init__(self, tokenize: dict, encode: dict) -> None:
        event("TokenizeEncodeDocs init start")
        self.tokenize = TokenizeDocs(**tokenize)
        self.encoder = EncodeDocs(**encode)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.encoder(self.tokenize(batch))


def append_aspects(out: pa.Table, tables: list) -> pa.Table:
    """``out`` with the rows' aspect top-k as columns ``aspect.{a}.values`` / ``.probs`` (fixed-size lists of k)
    and ``aspect.{a}.presence`` (``madr.index.aspects``); ``tables``: the batches' aspect tables, in row order."""
    from madr.index.aspects import concat_tables

    table = concat_tables(tables)
    for a, t in table.items():
        k = t.values.shape[1]
        out = out.append_column(f"aspect.{a}.values", pa.FixedSizeListArray.from_arrays(pa.array(t.values.ravel()), k))
        out = out.append_column(f"aspect.{a}.probs", pa.FixedSizeListArray.from_arrays(pa.array(t.probs.ravel()), k))
        out = out.append_column(f"aspect.{a}.presence", pa.array(t.presence))
    return out


def read_aspects(table: pa.Table) -> dict:
    """The aspect table held by ``append_aspects``' columns of ``table`` (empty without them)."""
    from madr.index.aspects import AspectTopK

    names = [c.removeprefix("aspect.").removesuffix(".values") for c in table.column_names
             if c.startswith("aspect.") and c.endswith(".values")]
    out = {}
    for a in names:
        v, p = (table.column(f"aspect.{a}.{x}").combine_chunks() for x in ("values", "probs"))
        k = v.type.list_size
        out[a] = AspectTopK(v.flatten().to_numpy().reshape(-1, k), p.flatten().to_numpy().reshape(-1, k),
                            table.column(f"aspect.{a}.presence").to_numpy())
    return out


def ragged(rows: list[list[int]]) -> pa.ListArray:
    """Token id lists -> list<int32> without per-row Python objects in Arrow."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    values = np.fromiter((t for r in rows for t in r), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def parts_dir(out_dir: str | Path, run: str, shard: int) -> Path:
    return Path(out_dir) / PARTS_DIR / run / shard_stem(shard)


def write_parts(batch: pa.Table, out_dir: str, run: str) -> pa.Table:
    """One Parquet part per shard in ``batch``, named by a hash of its input positions (a retried task
    rewrites the same file); returns (shard, piece, rows) only, so vectors never travel to the driver."""
    shards, pieces = batch.column("_shard").to_numpy(), batch.column("_piece").to_numpy()
    out: dict[str, list[int]] = {"_shard": [], "_piece": [], "rows": []}
    for shard, piece in sorted(set(zip(shards.tolist(), pieces.tolist(), strict=True))):
        part = batch.filter(pa.array((shards == shard) & (pieces == piece)))
        key = hashlib.sha1(part.column("_pos").to_numpy().tobytes()).hexdigest()[:20]
        path = parts_dir(out_dir, run, int(shard)) / f"part-{key}.parquet"
        atomic_write(path, lambda tmp, t=part: pq.write_table(t, tmp))
        for name, value in (("_shard", shard), ("_piece", piece), ("rows", part.num_rows)):
            out[name].append(int(value))
    return pa.table({"_shard": pa.array(out["_shard"], pa.int32()), "_piece": pa.array(out["_piece"], pa.int32()),
                     "rows": pa.array(out["rows"], pa.int64())})
