"""Where the job's stream and tasks run: ``RayExecutor`` (Ray Data: read tasks -> ``TokenizeDocs`` actors ->
``EncodeDocs`` actors on GPUs, writing part files, or read tasks -> ``TokenizeEncodeDocs`` actors on CPU; shard
tasks as Ray tasks), ``ActorExecutor`` (``encode.executor: actors``: plain Ray actors that read, tokenise and encode
whole pieces, without Ray Data's executor) and ``LocalExecutor`` (the same stages and tasks in this process:
``--local``, and ``executor: auto`` for a corpus of at most ``IN_PROCESS_DOCS`` rows on a one-node cluster without
GPUs, ``encodes_in_process``). The encode actors all start at once (``min_encode_actors``).

GPU runs: each encode actor asks Ray for one GPU (``encode_actor_resources``), so on an autoscaling cluster whose
GPU node types start at zero the autoscaler adds a GPU node for it. ``encode_on_gpu`` decides: ``device: cuda``
always, ``auto`` when the cluster has a GPU or can add one (``pipelines.resources.cluster_can_have_gpus``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from madr.encode_config import EncodeConfig
from pipelines.encode.corpus import Piece, read_piece
from pipelines.encode.stages import EncodeDocs, TokenizeDocs, TokenizeEncodeDocs

# corpus rows up to which `executor: auto` encodes in the job's own process on a one-node cluster without GPUs
IN_PROCESS_DOCS = 4096


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


def lexical_tokenizer_dir(cfg: EncodeConfig) -> str | None:
    """Where the job saved the lexical part's own tokenizer (``cfg.lexical_tokenizer``; None: the model's)."""
    from madr.index.lexical import TOKENIZER_DIR

    return str(Path(cfg.output).resolve() / TOKENIZER_DIR) if cfg.lexical is not None and cfg.lexical_tokenizer else None


def _pool(actors: int, all_at_start: bool, min_size: int | None = None):
    """An actor pool of at most `actors`, starting with `min_size` (default one; grows while work queues up) or
    all of them."""
    import ray

    return ray.data.ActorPoolStrategy(min_size=actors if all_at_start else (min_size or 1), max_size=actors)


def _stage_kwargs(cfg: EncodeConfig, gpu: bool, run: str | None, expect: dict[str, int] | None,
                  threads: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Constructor arguments of ``TokenizeDocs`` and ``EncodeDocs`` for this job; ``threads``: the encode actors'
    torch threads (default: ``torch_threads``, else their CPU share rounded up)."""
    tokenize = {"model_dir": cfg.model_dir, "max_length": cfg.max_length, "lexical": cfg.lexical is not None,
                "lexical_tokenizer": lexical_tokenizer_dir(cfg)}
    threads = threads or cfg.torch_threads or max(1, int(np.ceil(cfg.encode_cpus)))
    encode = {"model_dir": cfg.model_dir, "batch_size": cfg.batch_size, "device": "cuda" if gpu else "cpu",
              "dtype": cfg.dtype, "torch_threads": threads, "out_dir": cfg.output if run else None, "run": run,
              "expect": expect, "aspect_top_k": cfg.aspect_top_k}
    return tokenize, encode


def encode_on_gpu(cfg: EncodeConfig) -> bool:
    """Whether the encode actors run on GPUs, one each, on the connected cluster: ``device: cuda`` always (a
    ValueError when the cluster has no GPU and cannot add one, where the actors would wait forever), ``auto`` when
    the cluster has a GPU or can add one (``encode.gpu_nodes``, else the node types Ray's GCS records), ``cpu``
    never."""
    from pipelines.resources import cluster_can_have_gpus

    if cfg.device == "cpu":
        return False
    can = cluster_can_have_gpus(cfg.gpu_nodes)
    if cfg.device == "cuda" and not can:
        raise ValueError("encode.device is 'cuda' but the Ray cluster has no GPU and no GPU node type it is known "
                         "to add; set encode.gpu_nodes: true when its autoscaler adds GPU nodes")
    return cfg.device == "cuda" or can


def encode_actor_resources(cfg: EncodeConfig, gpu: bool) -> dict[str, float]:
    """What one encode actor asks Ray for: one GPU and no CPU on GPU runs (the node's CPUs stay for the tokenise
    pool), ``encode_cpus`` CPUs otherwise."""
    return {"num_cpus": 0, "num_gpus": 1} if gpu else {"num_cpus": cfg.encode_cpus, "num_gpus": 0}


def tokenize_in_encoder(cfg: EncodeConfig, gpu: bool) -> bool:
    """Whether the encode actors tokenise themselves (``encode.tokenize_in_encoder``; None: on CPU)."""
    return (not gpu) if cfg.tokenize_in_encoder is None else bool(cfg.tokenize_in_encoder)


def _encoded_dataset(pieces: list[Piece], cfg: EncodeConfig, gpu: bool, run: str | None = None,
                     expect: dict[str, int] | None = None):
    """read -> tokenise (CPU actors) -> encode (GPU/CPU actors), or read -> tokenise + encode in one actor
    (``tokenize_in_encoder``); with ``run`` the encoders write part files and the dataset carries only
    (shard, rows)."""
    import ray

    # batch_size=None: one piece = one block = one batch through every stage, so the forward batches (cut
    # from the length-sorted piece) and hence the vectors do not depend on scheduling: a re-run is identical.
    ds = ray.data.read_datasource(_datasource(pieces, cfg), override_num_blocks=len(pieces), num_cpus=cfg.io_cpus)
    tokenize, encode = _stage_kwargs(cfg, gpu, run, expect, actor_threads(cfg, gpu))
    spread = {"scheduling_strategy": "SPREAD"} if cfg.spread_actors else {}
    encoders = _pool(cfg.encode_actors, cfg.spread_actors, cfg.min_encode_actors or cfg.encode_actors)
    resources = encode_actor_resources(cfg, gpu)
    if tokenize_in_encoder(cfg, gpu):
        return ds.map_batches(TokenizeEncodeDocs, fn_constructor_kwargs={"tokenize": tokenize, "encode": encode},
                              batch_size=None, batch_format="pyarrow", compute=encoders, **resources, **spread)
    ds = ds.map_batches(TokenizeDocs, fn_constructor_kwargs=tokenize, batch_size=None, batch_format="pyarrow",
                        num_cpus=cfg.tokenize_cpus, compute=_pool(cfg.tokenize_actors, cfg.spread_actors), **spread)
    return ds.map_batches(EncodeDocs, fn_constructor_kwargs=encode, batch_size=None, batch_format="pyarrow",
                          compute=encoders, **resources, **spread)


class RayExecutor:
    """Runs the job's stream on Ray Data and its shard tasks as Ray tasks; ``expect``: the model's ``dim`` and
    ``vocab_size`` as the driver read them (checked by every encode actor)."""

    def __init__(self, cfg: EncodeConfig, expect: dict[str, int] | None = None) -> None:
        import ray

        self.ray, self.cfg, self.expect = ray, cfg, expect
        self.gpu = encode_on_gpu(cfg)

    def stream(self, pieces: list[Piece], run: str) -> Iterator[pa.Table]:
        ds = _encoded_dataset(pieces, self.cfg, self.gpu, run, self.expect)
        yield from ds.iter_batches(batch_size=None, batch_format="pyarrow")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.ray.remote(num_cpus=self.cfg.io_cpus, max_retries=2)(fn).remote(*args)

    def wait(self, futures: list[Any], block: bool) -> list[Any]:
        ready, _ = self.ray.wait(futures, num_returns=len(futures) if block else 1, timeout=None if block else 0)
        return ready

    def get(self, future: Any) -> Any:
        return self.ray.get(future)


class PieceEncoder:
    """One actor of ``ActorExecutor``: reads a piece, tokenises and encodes it (``TokenizeEncodeDocs``), writes its
    part files and returns (shard, piece, rows), as the Ray Data stream's encode stage does."""

    def __init__(self, columns: tuple[str, list[str], list[str]], tokenize: dict, encode: dict) -> None:
        self.columns = columns
        self.stage = TokenizeEncodeDocs(tokenize, encode)

    def encode_piece(self, piece: Piece) -> pa.Table:
        return self.stage(read_piece(piece, *self.columns))


class ActorExecutor(RayExecutor):
    """``RayExecutor`` with plain Ray actors in place of the Ray Data stream: ``encode_actors`` ``PieceEncoder``
    actors (tokenising themselves, also on a GPU) start at once, one piece each; the next piece goes to whichever
    finishes first (a queue on each actor would leave one idle at the end while another works through its queue;
    the round trip costs milliseconds against seconds per piece). A dead actor restarts and its piece runs again
    (``max_restarts`` / ``max_task_retries``). No Ray Data executor to start and no Ray Data import in the actors, so the job
    starts sooner. The pieces and their forward batches are those of the other executors, so are the files."""

    def stream(self, pieces: list[Piece], run: str) -> Iterator[pa.Table]:
        ray, cfg = self.ray, self.cfg
        tokenize, encode = _stage_kwargs(cfg, self.gpu, run, self.expect, actor_threads(cfg, self.gpu))
        columns = (cfg.id_column, cfg.text_columns, cfg.docs_columns if cfg.store_docs else [])
        spread = {"scheduling_strategy": "SPREAD"} if cfg.spread_actors else {}
        worker = ray.remote(PieceEncoder).options(**encode_actor_resources(cfg, self.gpu), max_restarts=2,
                                                  max_task_retries=2, **spread)
        actors = [worker.remote(columns, tokenize, encode) for _ in range(min(cfg.encode_actors, len(pieces)))]
        todo, pending = iter(pieces), {}

        def give(actor: Any) -> None:
            piece = next(todo, None)
            if piece is not None:
                pending[actor.encode_piece.remote(piece)] = actor

        try:
            for actor in actors:
                give(actor)
            while pending:
                [done], _ = ray.wait(list(pending), num_returns=1)
                give(pending.pop(done))
                yield ray.get(done)
        finally:
            for actor in actors:
                ray.kill(actor)


class LocalExecutor:
    """The same stages and tasks in this process, one piece after the other (small corpora, tests, debugging);
    produces the same files as ``RayExecutor`` (one piece = one batch in both) at the same ``torch_threads``.
    ``threads``: torch's threads while encoding (default: an encode actor's, ``torch_threads`` or its CPU share)."""

    def __init__(self, cfg: EncodeConfig, expect: dict[str, int] | None = None, threads: int | None = None) -> None:
        self.cfg, self.expect, self.threads = cfg, expect, threads

    def stream(self, pieces: list[Piece], run: str) -> Iterator[pa.Table]:
        import torch

        threads = torch.get_num_threads()
        tokenize, encode = _stage_kwargs(self.cfg, False, run, self.expect)
        tok = TokenizeDocs(**tokenize)
        enc = EncodeDocs(**{**encode, "device": self.cfg.device, "torch_threads": self.threads or encode["torch_threads"]})
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


def actor_threads(cfg: EncodeConfig, gpu: bool) -> int:
    """Torch threads of each encode actor: ``torch_threads``; else, for CPU actors on a one-node cluster, its CPUs
    shared by the ``encode_actors`` (at least their CPU share: the actors all run on that machine, and a share of one
    CPU each would leave the others idle while the job encodes); else their CPU share rounded up."""
    from pipelines.resources import single_node_cpus

    share = max(1, int(np.ceil(cfg.encode_cpus)))
    if cfg.torch_threads or gpu:
        return cfg.torch_threads or share
    cpus = single_node_cpus()
    return share if cpus is None else max(share, cpus // max(1, cfg.encode_actors))


def encodes_in_process(cfg: EncodeConfig, rows: int) -> int | None:
    """Whether ``executor: auto`` encodes ``rows`` documents in this process, and with how many torch threads: on
    a one-node Ray cluster without GPUs (nor a GPU node it can add) the actors would run on this machine anyway, and
    starting one (a process importing torch and loading the model) costs more than encoding at most
    ``IN_PROCESS_DOCS`` documents; the threads are ``torch_threads`` or the node's CPUs. None: Ray actors."""
    from pipelines.resources import single_node_cpus

    if cfg.executor != "auto" or rows > IN_PROCESS_DOCS:
        return None
    cpus = single_node_cpus()
    if cpus is None or encode_on_gpu(cfg):
        return None
    return cfg.torch_threads or cpus


def ray_executor(cfg: EncodeConfig, expect: dict[str, int] | None = None) -> RayExecutor:
    """The executor `encode.executor` names; `auto`: plain actors where the encode actors tokenise themselves (CPU
    runs, where they are the faster of the two end to end), the Ray Data stream where a tokenise pool feeds
    them (GPU runs)."""
    ex = RayExecutor(cfg, expect)
    if cfg.executor == "actors" or (cfg.executor == "auto" and tokenize_in_encoder(cfg, ex.gpu)):
        return ActorExecutor(cfg, expect)
    return ex
