"""Where the job's stream and tasks run: ``RayExecutor`` (Ray Data: read tasks -> ``TokenizeDocs`` actors ->
``EncodeDocs`` actors, GPU when present, writing part files; shard tasks as Ray tasks) and ``LocalExecutor``
(the same stages and tasks in this process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.encode.config import EncodeConfig
from pipelines.encode.corpus import Piece, read_piece
from pipelines.encode.stages import EncodeDocs, TokenizeDocs, resolve_device


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


def _pool(actors: int, all_at_start: bool):
    """An actor pool of at most `actors`, starting with one (grows while work queues up) or all of them."""
    import ray

    return ray.data.ActorPoolStrategy(min_size=actors if all_at_start else 1, max_size=actors)


def _encoded_dataset(pieces: list[Piece], cfg: EncodeConfig, gpu: bool, run: str | None = None):
    """read -> tokenise (CPU actors) -> encode (GPU/CPU actors); with ``run`` the encoders write part files
    and the dataset carries only (shard, rows)."""
    import ray

    # batch_size=None: one piece = one block = one batch through every stage, so the forward batches (cut
    # from the length-sorted piece) and hence the vectors do not depend on scheduling: a re-run is identical.
    ds = ray.data.read_datasource(_datasource(pieces, cfg), override_num_blocks=len(pieces), num_cpus=cfg.io_cpus)
    spread = {"scheduling_strategy": "SPREAD"} if cfg.spread_actors else {}
    ds = ds.map_batches(TokenizeDocs, fn_constructor_kwargs={"model_dir": cfg.model_dir, "max_length": cfg.max_length,
                                                             "lexical": cfg.lexical is not None,
                                                             "lexical_tokenizer": lexical_tokenizer_dir(cfg)},
                        batch_size=None, batch_format="pyarrow", num_cpus=cfg.tokenize_cpus,
                        compute=_pool(cfg.tokenize_actors, cfg.spread_actors), **spread)
    threads = cfg.torch_threads or max(1, int(np.ceil(cfg.encode_cpus)))
    return ds.map_batches(EncodeDocs, fn_constructor_kwargs={"model_dir": cfg.model_dir, "batch_size": cfg.batch_size,
                                                             "device": "cuda" if gpu else "cpu", "dtype": cfg.dtype,
                                                             "torch_threads": threads,
                                                             "out_dir": cfg.output if run else None, "run": run},
                          batch_size=None, batch_format="pyarrow", num_cpus=0 if gpu else cfg.encode_cpus,
                          num_gpus=1 if gpu else 0, compute=_pool(cfg.encode_actors, cfg.spread_actors), **spread)


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
        tok = TokenizeDocs(self.cfg.model_dir, self.cfg.max_length, self.cfg.lexical is not None,
                           lexical_tokenizer_dir(self.cfg))
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
