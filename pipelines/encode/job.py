"""The encode job: corpus -> Ray Data stream (read -> tokenise -> encode -> part files) -> N index shards.

Flow (``run_encode``):

1. Plan (``pipelines.encode.corpus``): pieces of <= ``rows_per_read`` rows in input order, contiguous
   runs of pieces = shards, with exact row counts. ``job.json`` records the job's identity (model,
   index type, columns, plan fingerprint); a re-run with another identity stops unless ``overwrite``.
2. Resume (``pipelines.encode.resume``): a shard is complete when its ``shard-NNNNN.json`` record exists
   and every checksum in it matches (``madr.index.build.completed_shard``); complete shards are neither
   read nor encoded again. Any other shard (no record: the crash came before it was finished; a checksum
   mismatch: a file was damaged or replaced since) is encoded and written again, and the leftovers of the
   crashed run (its part files, unrenamed temporary files) are removed.
3. Quantiser (index types that train: IVF, PQ, OPQ, ...; ``pipelines.encode.shards``): trained once, in a
   task, on the vectors of the first ``train_size / num_shards`` rows of every shard (a deterministic
   sample; those pieces are streamed first and read back from their part files), saved as
   ``trained.faiss`` with its checksum in ``trained.json``; a re-run reuses it, so resumed shards share
   the quantiser of the completed ones.
4. Stream the pieces of the pending shards (``pipelines.encode.executors``): read tasks -> ``TokenizeDocs``
   actors -> ``EncodeDocs`` actors (one GPU each where the cluster has or can add GPUs, ``encode.device``; on CPU
   one ``TokenizeEncodeDocs`` actor does both), which
   write Parquet parts per shard. The driver
   only sees (shard, rows) counts; when a shard has all its rows, a ``finalize_shard`` task
   (``pipelines.encode.shards``) builds its FAISS index, sparse index, BM25 term frequencies (``lexical:
   bm25``) and display rows from the parts and writes them atomically. Memory is bounded by the stream's buffers plus one shard per finalising task,
   whatever the corpus size.
5. Exactly-once: every shard must receive exactly its planned row count (rows re-written by a retried
   task are recognised by their input position), ids must be unique within and across shards; the
   manifest is written only then, with ``report.json`` (counts, duplicates). With ``lexical: bm25`` the
   collection's BM25 statistics (document frequencies, N, tokens) are summed from the complete shards'
   files at that point (``madr.index.lexical.merge_statistics``), so shards written by a crashed run and by
   its resumption count exactly once. With ``lexical_tokenizer`` the BM25 pieces are that tokenizer's, not
   the model's: it is saved into the index first (``lexical_tokenizer/``, ``madr.index.lexical.save_tokenizer``;
   its fingerprint is part of the job's identity), the tokenise actors load it from there, and the manifest's
   ``lexical`` record names its files with their checksums, so queries are split by the same tokenizer.
6. Aspects: a model with aspect heads (``model_aspects``) and ``aspect_top_k`` > 0 also stores every product's
   calibrated top-k aspect values, computed by the encode actors in the same forward pass and written per shard
   (``madr.index.aspects``), with the value strings and the manifest's ``aspects`` record.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from madr.encode_config import EncodeConfig
from madr.index.build import TRAINED_FILE, aspect_info, assemble_manifest, completed_shard, id_report
from madr.index.lexical import TOKENIZER_DIR, load_lexical_tokenizer, save_tokenizer
from madr.index.manifest import MANIFEST_FILE, ShardInfo, atomic_write_text
from madr.search.sparse.backend import SparseBackend
from pipelines.encode.corpus import CorpusPlan, Piece, plan_corpus, read_piece
from pipelines.encode.executors import LocalExecutor, actor_threads, encodes_in_process, ray_executor
from pipelines.encode.resume import (
    ModelInfo,
    clean_stale_parts,
    job_identity,
    job_identity_hash,
    lexical_tokenizer_fingerprint,
    model_aspects,
    model_info,
    start_or_resume,
)
from pipelines.encode.shards import (
    DOCS_DIR,
    existing_trained,
    finalize_shard,
    needs_training,
    sample_pieces,
    train_from_parts,
)
from pipelines.encode.stages import PARTS_DIR

REPORT_FILE = "report.json"


class InjectedFailure(RuntimeError):
    """Raised by ``run_encode(fail_after_shards=k)``: a crash for resume tests."""


@dataclass
class EncodeResult:
    manifest_path: Path
    num_docs: int
    shards_written: list[int]
    shards_skipped: list[int]
    seconds: float
    report: dict[str, Any] = field(default_factory=dict)


class _Finalizer:
    """Tracks written rows per shard and piece; starts the quantiser training once the sample pieces are
    written, and one ``finalize_shard`` task per shard once all its rows are (after the training)."""

    def __init__(self, cfg: EncodeConfig, plan: CorpusPlan, run: str, info: ModelInfo, trained: str | None,
                 sample: list[Piece] | None, fail_after: int | None, executor: Any,
                 log: Callable[[str], None], lexical_vocab: int | None = None) -> None:
        self.cfg, self.plan, self.run, self.info, self.trained, self.log = cfg, plan, run, info, trained, log
        self.lexical_vocab = lexical_vocab
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
                                                 self.trained, self.info.vocab_size, self.cfg.store_docs,
                                                 self.cfg.lexical is not None, self.lexical_vocab,
                                                 self.cfg.sparse_backend)

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
    if cfg.lexical is not None and info.hybrid:
        raise ValueError("encode.lexical: a hybrid model has its own sparse part; BM25 fusion is for dense models")
    plan = plan_corpus(cfg.input, cfg.num_shards, cfg.max_docs_per_shard, cfg.rows_per_read, cfg.format)
    lex_tok = load_lexical_tokenizer(cfg.lexical_tokenizer) if cfg.lexical is not None and cfg.lexical_tokenizer \
        else None
    aspects = model_aspects(cfg.model_dir) if cfg.aspect_top_k else None
    ident = job_identity(cfg, plan, info, None if lex_tok is None else lexical_tokenizer_fingerprint(lex_tok),
                         cfg.aspect_top_k if aspects else 0)
    start_or_resume(out, ident, cfg.overwrite, cfg.replace_other_job)
    lex_vocab = None
    if cfg.lexical is not None:
        lex_vocab = info.vocab_size if lex_tok is None else len(lex_tok)
        if lex_tok is not None:  # the documents' (tokenise actors) and the queries' tokenizer
            save_tokenizer(lex_tok, out / TOKENIZER_DIR)
    done = {s: i for s in range(plan.num_shards) if (i := completed_shard(out, s)) is not None}
    pending = [s for s in range(plan.num_shards) if s not in done]
    log(f"{plan.num_rows} docs in {len(plan.files)} files -> {plan.num_shards} shards "
        f"({len(done)} complete, {len(pending)} to write)")
    run = uuid.uuid4().hex[:12]
    clean_stale_parts(out, run)
    if pending:
        trained, sample = existing_trained(out), None
        if trained is None and needs_training(cfg.index_factory, info.dim):
            if done:
                raise ValueError(f"{out / TRAINED_FILE} is missing or changed but shards {sorted(done)} were built "
                                 f"with it; re-run with overwrite to rebuild the index")
            sample = sample_pieces(plan, -(-cfg.train_size // plan.num_shards))
        expect = {"dim": info.dim, "vocab_size": info.vocab_size}  # what the manifest records: actors check it
        executor = LocalExecutor(cfg, expect) if local else _cluster_executor(cfg, plan, pending, expect, log)
        fin = _Finalizer(cfg, plan, run, info, trained, sample, fail_after_shards, executor, log, lex_vocab)
        _stream(plan, pending, fin, log)
        done.update(fin.infos)
        if fail_after_shards is not None:
            raise InjectedFailure(f"injected failure after {len(fin.infos)} shards: {sorted(fin.infos)}")
    shutil.rmtree(out / PARTS_DIR, ignore_errors=True)
    return _finish(cfg, plan, info, out, done, pending, start, lex_vocab, aspects)


def _cluster_executor(cfg: EncodeConfig, plan: CorpusPlan, pending: list[int], expect: dict[str, int],
                      log: Callable[[str], None]) -> Any:
    """Ray actors, or this process for a small corpus on a one-node cluster (``encodes_in_process``)."""
    threads = encodes_in_process(cfg, sum(plan.shard_rows[s] for s in pending))
    if threads is None:
        ex = ray_executor(cfg, expect)
        log(f"encoding on {cfg.encode_actors} Ray actor(s), " + ("a GPU each" if ex.gpu else
            f"{actor_threads(cfg, False)} torch threads each"))
        return ex
    log(f"encoding in this process with {threads} torch threads (a one-node cluster without GPUs, a corpus small "
        f"enough that starting an actor would cost more)")
    return LocalExecutor(cfg, expect, threads)


def _finish(cfg: EncodeConfig, plan: CorpusPlan, info: ModelInfo, out: Path, done: dict[int, ShardInfo],
            pending: list[int], start: float, lexical_vocab: int | None = None,
            aspects: tuple[dict[str, list[str]], bool] | None = None) -> EncodeResult:
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
                             DOCS_DIR if cfg.store_docs else None,
                             lexical_vocab, cfg.fusion_lambda,
                             TOKENIZER_DIR if lexical_vocab is not None and cfg.lexical_tokenizer else None,
                             SparseBackend.from_dict(cfg.sparse_backend) if info.hybrid else None,
                             None if aspects is None else aspect_info(out, list(aspects[0]), cfg.aspect_top_k,
                                                                      aspects[0], aspects[1]))
    return EncodeResult(path, plan.num_rows, sorted(pending), sorted(set(done) - set(pending)),
                        time.perf_counter() - start, report)


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
