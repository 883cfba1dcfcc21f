"""The encode job: corpus -> Ray Data stream (read -> tokenise -> encode -> part files) -> N index shards.

Flow (``run_encode``):

1. Plan (``pipelines.encode.corpus``): pieces of <= ``rows_per_read`` rows in input order, contiguous
   runs of pieces = shards, with exact row counts. ``job.json`` records the job's identity (model,
   index type, columns, plan fingerprint); a re-run with another identity stops unless ``overwrite``.
2. Resume: a shard is complete when its ``shard-NNNNN.json`` record exists and every checksum in it
   matches (``madr.index.build.completed_shard``); complete shards are neither read nor encoded again.
   Any other shard (no record: the crash came before it was finished; a checksum mismatch: a file was
   damaged or replaced since) is encoded and written again, and the leftovers of the crashed run (its
   part files, unrenamed temporary files) are removed.
3. Quantiser (index types that train: IVF, PQ, OPQ, ...): trained once, in a task, on the vectors of
   the first ``train_size / num_shards`` rows of every shard (a deterministic sample; those pieces are
   streamed first and read back from their part files), saved as ``trained.faiss`` with its checksum
   in ``trained.json``; a re-run reuses it, so resumed shards share the quantiser of the completed ones.
4. Stream the pieces of the pending shards: read tasks -> ``TokenizeDocs`` actors -> ``EncodeDocs``
   actors (GPU when present), which write Parquet parts per shard. The driver only sees
   (shard, rows) counts; when a shard has all its rows, a ``finalize_shard`` task builds its FAISS index,
   sparse index and display rows from the parts and writes them atomically. Memory is bounded by the
   stream's buffers plus one shard per finalising task, whatever the corpus size.
5. Exactly-once: every shard must receive exactly its planned row count (rows re-written by a retried
   task are recognised by their input position), ids must be unique within and across shards; the
   manifest is written only then, with ``report.json`` (counts, duplicates).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.index.build import (
    TRAINED_FILE,
    assemble_manifest,
    completed_shard,
    id_report,
    new_index,
    train_index,
    write_shard,
)
from madr.index.manifest import (
    MANIFEST_FILE,
    ShardInfo,
    atomic_write,
    atomic_write_text,
    sha256_file,
    shard_stem,
)
from pipelines.encode.config import EncodeConfig
from pipelines.encode.corpus import CorpusPlan, Piece, plan_corpus, read_piece
from pipelines.encode.stages import PARTS_DIR, EncodeDocs, TokenizeDocs, parts_dir, resolve_device

JOB_FILE = "job.json"
TRAINED_RECORD = "trained.json"
REPORT_FILE = "report.json"
DOCS_DIR = "docs"


class InjectedFailure(RuntimeError):
    """Raised by ``run_encode(fail_after_shards=k)``: a crash for resume tests."""


@dataclass
class ModelInfo:
    dim: int
    hybrid: bool
    hybrid_lambda: float
    vocab_size: int
    fingerprint: str


@dataclass
class EncodeResult:
    manifest_path: Path
    num_docs: int
    shards_written: list[int]
    shards_skipped: list[int]
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)


def model_info(model_dir: str) -> ModelInfo:
    """Dimension, kind and a fingerprint (the contents of every file) of a saved model.

    Contents, not sizes: a retrained model has the same file sizes, and its index must not resume from
    shards the previous weights encoded."""
    from madr.modeling.model import BiEncoder

    model = BiEncoder.load(model_dir)
    path = Path(model_dir)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:".encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return ModelInfo(model.embedding_dim, model.config.has_sparse, model.config.hybrid_lambda,
                     len(model.tokenizer), h.hexdigest()[:16])


def job_identity(cfg: EncodeConfig, plan: CorpusPlan, info: ModelInfo) -> dict[str, Any]:
    """What must not change between a run and its resumption (performance knobs may)."""
    keys = ("id_column", "text_columns", "docs_columns", "store_docs", "index_factory", "train_size", "seed",
            "max_length")
    ident = {k: getattr(cfg, k) for k in keys}
    ident.update(model=info.fingerprint, plan=plan.fingerprint(), num_shards=plan.num_shards)
    ident["hash"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return ident


def _start_or_resume(out: Path, ident: dict[str, Any], overwrite: bool, replace_other_job: bool = False) -> None:
    """Resume the job in ``out`` when it has the same identity; start over with ``overwrite``, or when it
    holds another job and ``replace_other_job`` (the pipeline's setting: it owns the directory)."""
    path = out / JOB_FILE
    if not overwrite and path.is_file():
        old = json.loads(path.read_text()).get("identity", {})
        if old.get("hash") == ident["hash"]:
            return
        diff = sorted(k for k in set(old) | set(ident) if old.get(k) != ident.get(k) and k != "hash")
        if not replace_other_job:
            raise ValueError(f"{out} holds another encode job (differs in {diff}); use a new output or overwrite")
        overwrite = True
    if overwrite:
        for item in out.iterdir():
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    elif any(out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no encode job ({JOB_FILE}); use a new output or overwrite")
    atomic_write_text(path, json.dumps({"identity": ident}, indent=1))


# ---- Ray pieces ------------------------------------------------------------------------------------------

def _datasource(pieces: list[Piece], cfg: EncodeConfig):
    from functools import partial

    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    def read(piece: Piece):
        return [read_piece(piece, cfg.id_column, cfg.text_columns, cfg.docs_columns if cfg.store_docs else [])]

    class PieceDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                           data_context: Any = None) -> list[ReadTask]:
            return [ReadTask(partial(read, p), BlockMetadata(num_rows=p.rows, size_bytes=None, exec_stats=None,
                                                              input_files=[p.uri])) for p in pieces]

    return PieceDatasource()


def _encoded_dataset(pieces: list[Piece], cfg: EncodeConfig, gpu: bool, run: str | None = None):
    """read -> tokenise (CPU actors) -> encode (GPU/CPU actors); with ``run`` the encoders write part files
    and the dataset carries only (shard, rows)."""
    import ray

    # batch_size=None: one piece = one block = one batch through every stage, so the forward batches (cut
    # from the length-sorted piece) and hence the vectors do not depend on scheduling: a re-run is identical.
    ds = ray.data.read_datasource(_datasource(pieces, cfg), override_num_blocks=len(pieces), num_cpus=cfg.io_cpus)
    ds = ds.map_batches(TokenizeDocs, fn_constructor_kwargs={"model_dir": cfg.model_dir, "max_length": cfg.max_length},
                        batch_size=None, batch_format="pyarrow", num_cpus=cfg.tokenize_cpus,
                        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=cfg.tokenize_actors))
    threads = cfg.torch_threads or max(1, int(np.ceil(cfg.encode_cpus)))
    return ds.map_batches(EncodeDocs, fn_constructor_kwargs={"model_dir": cfg.model_dir, "batch_size": cfg.batch_size,
                                                             "device": "cuda" if gpu else "cpu", "dtype": cfg.dtype,
                                                             "torch_threads": threads,
                                                             "out_dir": cfg.output if run else None, "run": run},
                          batch_size=None, batch_format="pyarrow", num_cpus=0 if gpu else cfg.encode_cpus,
                          num_gpus=1 if gpu else 0,
                          compute=ray.data.ActorPoolStrategy(min_size=1, max_size=cfg.encode_actors))


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


def finalize_shard(out_dir: str, run: str, shard: int, expected: int, index_factory: str, dim: int,
                   trained_path: str | None, vocab_size: int, store_docs: bool) -> dict[str, Any]:
    """Build and write one shard from its part files (a Ray task); returns its ``ShardInfo`` as a dict."""
    import faiss

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
    info = write_shard(out_dir, shard, trained, dense, ids, sparse, extra)
    shutil.rmtree(src, ignore_errors=True)
    return info.to_dict()


# ---- the driver ------------------------------------------------------------------------------------------

def _needs_training(index_factory: str, dim: int) -> bool:
    return not new_index(index_factory, dim).is_trained


def _sample_pieces(plan: CorpusPlan, per_shard: int) -> list[Piece]:
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


def _existing_trained(out: Path) -> str | None:
    """``trained.faiss`` when its checksum record matches it."""
    path, record = out / TRAINED_FILE, out / TRAINED_RECORD
    if path.is_file() and record.is_file():
        if json.loads(record.read_text()).get("sha256") == sha256_file(path):
            return str(path)
    return None


def _clean_stale_parts(out: Path, run: str) -> None:
    """Remove what a crashed run can leave behind: part files of other runs, and temporary files of
    ``atomic_write`` (``.<name>.<random>.tmp``) that were never renamed."""
    root = out / PARTS_DIR
    if root.is_dir():
        for d in root.iterdir():
            if d.name != run:
                shutil.rmtree(d, ignore_errors=True)
    for folder in (out, out / DOCS_DIR):
        for tmp in folder.glob(".*.tmp") if folder.is_dir() else []:
            tmp.unlink(missing_ok=True)


class RayExecutor:
    """Runs the job's stream on Ray Data and its shard tasks as Ray tasks."""

    def __init__(self, cfg: EncodeConfig) -> None:
        import ray

        self.ray, self.cfg = ray, cfg
        gpus = ray.cluster_resources().get("GPU", 0)
        self.gpu = resolve_device(cfg.device) == "cuda" if cfg.device != "auto" else gpus > 0

    def stream(self, pieces: list[Piece], run: str) -> Iterator[pa.Table]:
        ds = _encoded_dataset(pieces, self.cfg, self.gpu, run)
        yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.ray.remote(num_cpus=self.cfg.io_cpus, max_retries=2)(fn).remote(*args)

    def wait(self, futures: list[Any], block: bool) -> list[Any]:
        ready, _ = self.ray.wait(futures, num_returns=len(futures) if block else 1, timeout=None if block else 0)
        return ready

    def get(self, future: Any) -> Any:
        return self.ray.get(future)


class LocalExecutor:
    """The same stages and tasks in this process, one piece after the other (tests, tiny corpora, debugging);
    produces the same files as ``RayExecutor`` (one piece = one batch in both)."""

    def __init__(self, cfg: EncodeConfig) -> None:
        self.cfg = cfg

    def stream(self, pieces: list[Piece], run: str) -> Iterator[pa.Table]:
        import torch

        threads = torch.get_num_threads()
        tok = TokenizeDocs(self.cfg.model_dir, self.cfg.max_length)
        enc = EncodeDocs(self.cfg.model_dir, self.cfg.batch_size, self.cfg.device, self.cfg.dtype,
                         self.cfg.torch_threads or max(1, int(np.ceil(self.cfg.encode_cpus))), self.cfg.output, run)
        try:
            for p in pieces:
                yield enc(tok(read_piece(p, self.cfg.id_column, self.cfg.text_columns,
                                         self.cfg.docs_columns if self.cfg.store_docs else [])))
        finally:
            torch.set_num_threads(threads)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return _Done(fn(*[a.value if isinstance(a, _Done) else a for a in args]))

    def wait(self, futures: list[Any], block: bool) -> list[Any]:
        return list(futures)

    def get(self, future: Any) -> Any:
        return future.value


@dataclass(eq=False)
class _Done:
    value: Any


class _Finalizer:
    """Tracks written rows per shard and piece; starts the quantiser training once the sample pieces are
    written, and one ``finalize_shard`` task per shard once all its rows are (after the training)."""

    def __init__(self, cfg: EncodeConfig, plan: CorpusPlan, run: str, info: ModelInfo, trained: str | None,
                 sample: list[Piece] | None, fail_after: int | None, executor: Any,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.plan, self.run, self.info, self.trained, self.log = cfg, plan, run, info, trained, log
        self.ex = executor
        self.sample = {p.index for p in sample} if sample else set()
        self.per_shard = -(-cfg.train_size // plan.num_shards)
        self.counts = dict.fromkeys(range(plan.num_shards), 0)
        self.pieces_done: set[int] = set()
        self.ready: list[int] = []  # shards whose rows are all written, waiting for the quantiser
        self.futures: dict[int, Any] = {}
        self.infos: dict[int, ShardInfo] = {}
        self.fail_after = fail_after

    def add(self, shard: int, piece: int, rows: int) -> None:
        self.counts[shard] += rows
        self.pieces_done.add(piece)
        expected = self.plan.shard_rows[shard]
        if self.counts[shard] > expected:
            self.log(f"shard {shard}: {self.counts[shard]} rows written for {expected} planned (retried tasks; "
                     f"duplicates are dropped by input position)")
        if self.counts[shard] >= expected and shard not in self.futures and shard not in self.ready:
            self.ready.append(shard)
        self.step()
        self.collect(block=False)

    def step(self) -> None:
        """Start the training when its sample is written, then the finalisation of every ready shard."""
        if self.trained is None and self.sample and self.sample <= self.pieces_done:
            self.log(f"training {self.cfg.index_factory!r} on {self.per_shard} vectors per shard")
            self.trained = self.ex.submit(train_from_parts, self.cfg.output, self.run, sorted(self.sample),
                                          self.per_shard, self.cfg.index_factory, self.info.dim, self.cfg.seed)
        if self.sample and self.trained is None:
            return
        while self.ready:
            if self.fail_after is not None and len(self.futures) >= self.fail_after:
                self.ready.clear()  # injected crash: no more shards are finalised in this run
                return
            shard = self.ready.pop(0)
            self.futures[shard] = self.ex.submit(finalize_shard, self.cfg.output, self.run, shard,
                                                 self.plan.shard_rows[shard], self.cfg.index_factory, self.info.dim,
                                                 self.trained, self.info.vocab_size, self.cfg.store_docs)

    def collect(self, block: bool) -> None:
        pending = {f: s for s, f in self.futures.items() if s not in self.infos}
        if not pending:
            return
        for f in self.ex.wait(list(pending), block):
            info = ShardInfo.from_dict(self.ex.get(f))
            self.infos[info.shard] = info
            self.log(f"shard {info.shard} written: {info.count} docs, ids {info.min_id}..{info.max_id} "
                     f"({len(self.infos)} finalised this run)")


def _stream(plan: CorpusPlan, pending: list[int], fin: _Finalizer, log: Callable[[str], None]) -> None:
    pieces = plan.pieces_of(pending)
    first = fin.sample  # the training sample's pieces go first, so the quantiser is ready early
    pieces = [p for p in pieces if p.index in first] + [p for p in pieces if p.index not in first]
    log(f"encoding {sum(p.rows for p in pieces)} docs of shards {pending} ({len(pieces)} pieces)")
    try:
        for batch in fin.ex.stream(pieces, fin.run):
            for shard, piece, rows in zip(*(batch.column(c).to_pylist() for c in ("_shard", "_piece", "rows")),
                                          strict=True):
                fin.add(int(shard), int(piece), int(rows))
        fin.step()
    finally:
        fin.collect(block=True)
    short = {s: (fin.counts[s], plan.shard_rows[s]) for s in pending if fin.counts[s] < plan.shard_rows[s]}
    if short:
        raise ValueError(f"shards lost rows in the stream (written, planned): {short}")


def run_encode(cfg: EncodeConfig, fail_after_shards: int | None = None, log: Callable[[str], None] = print,
               local: bool = False) -> EncodeResult:
    """Run (or resume) the encode job of ``cfg`` on the current Ray cluster (``local``: in this process);
    see the module docstring. ``fail_after_shards=k`` simulates a crash: only ``k`` shards are finalised,
    then ``InjectedFailure`` is raised."""
    cfg.check_paths()
    start = time.perf_counter()
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    info = model_info(cfg.model_dir)
    plan = plan_corpus(cfg.input, cfg.num_shards, cfg.max_docs_per_shard, cfg.rows_per_read, cfg.format)
    _start_or_resume(out, job_identity(cfg, plan, info), cfg.overwrite, cfg.replace_other_job)
    done = {s: i for s in range(plan.num_shards) if (i := completed_shard(out, s)) is not None}
    pending = [s for s in range(plan.num_shards) if s not in done]
    log(f"{plan.num_rows} docs in {len(plan.files)} files -> {plan.num_shards} shards "
        f"({len(done)} complete, {len(pending)} to write)")
    run = uuid.uuid4().hex[:12]
    _clean_stale_parts(out, run)
    if pending:
        trained, sample = _existing_trained(out), None
        if trained is None and _needs_training(cfg.index_factory, info.dim):
            if done:
                raise ValueError(f"{out / TRAINED_FILE} is missing or changed but shards {sorted(done)} were built "
                                 f"with it; re-run with overwrite to rebuild the index")
            sample = _sample_pieces(plan, -(-cfg.train_size // plan.num_shards))
        executor = LocalExecutor(cfg) if local else RayExecutor(cfg)
        fin = _Finalizer(cfg, plan, run, info, trained, sample, fail_after_shards, executor, log)
        _stream(plan, pending, fin, log)
        done.update(fin.infos)
        if fail_after_shards is not None:
            raise InjectedFailure(f"injected failure after {len(fin.infos)} shards: {sorted(fin.infos)}")
    shutil.rmtree(out / PARTS_DIR, ignore_errors=True)
    return _finish(cfg, plan, info, out, done, pending, start)


def _finish(cfg: EncodeConfig, plan: CorpusPlan, info: ModelInfo, out: Path, done: dict[int, ShardInfo],
            pending: list[int], start: float) -> EncodeResult:
    shards = [done[s] for s in range(plan.num_shards)]
    bad = {s.shard: (s.count, plan.shard_rows[s.shard]) for s in shards if s.count != plan.shard_rows[s.shard]}
    if bad:
        raise ValueError(f"shard counts differ from the plan (indexed, planned): {bad}")
    report = id_report(out, shards)
    report.update(planned=plan.num_rows, shards=plan.num_shards, written=sorted(pending))
    atomic_write_text(out / REPORT_FILE, json.dumps({k: v for k, v in report.items()}, indent=1))
    lam = (cfg.hybrid_lambda if cfg.hybrid_lambda is not None else info.hybrid_lambda) if info.hybrid else None
    path = assemble_manifest(out, shards, info.dim, cfg.index_factory, lam, info.vocab_size if info.hybrid else None,
                             str(Path(cfg.model_dir).resolve()), job_identity_hash(out),
                             DOCS_DIR if cfg.store_docs else None)
    return EncodeResult(path, plan.num_rows, sorted(pending), sorted(set(done) - set(pending)),
                        time.perf_counter() - start, report)


def job_identity_hash(out: Path) -> str | None:
    path = out / JOB_FILE
    return json.loads(path.read_text())["identity"]["hash"] if path.is_file() else None


def input_ids(cfg: EncodeConfig) -> np.ndarray:
    """Every id of the corpus, read piece by piece (only the id column)."""
    plan = plan_corpus(cfg.input, cfg.num_shards, cfg.max_docs_per_shard, cfg.rows_per_read, cfg.format)
    parts = [read_piece(p, cfg.id_column, cfg.text_columns, []).column("doc_id").to_numpy() for p in plan.pieces]
    return np.concatenate(parts)


def verify_index(cfg: EncodeConfig) -> dict[str, Any]:
    """Exactly-once check of a finished index against its input: checksums of every shard file, then
    ``duplicates`` (ids indexed more than once), ``missing`` (input ids not indexed) and ``unexpected``."""
    from madr.index.manifest import Manifest

    out = Path(cfg.output)
    manifest = Manifest.load(out / MANIFEST_FILE)
    manifest.verify(out)
    report = id_report(out, manifest.shards, expected_ids=input_ids(cfg))
    report["ok"] = not (report["duplicates"] or report["missing"] or report["unexpected"])
    return report
