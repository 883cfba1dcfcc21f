"""Streaming a stage's rows to the Ray Train workers, with a data position that survives a restart.

The driver passes `ray.data.read_parquet(examples)` (lazy) as the trainer's "train" dataset; Ray Train
splits it over the workers with `streaming_split(equal=True)`, and each worker pulls its shard with
`ray.train.get_dataset_shard("train").iter_batches(...)`: nothing is materialised, blocks stream through.

Resume exactness: `train_data_config()` asks Ray Data to preserve block order and switches off locality
hints, which makes the split's block -> worker assignment a function of the block sequence alone (the
splitter hands the next block to the worker that has received the fewest rows), so worker r sees the same
rows in the same order every epoch and after a restart. The local shuffle is seeded per epoch. A worker's
position is (epoch, next batch index in the epoch); `RowStream` resumes there by skipping the epoch's
batches already consumed (they are re-read, not re-trained: skipping costs reading, which is cheap next
to training on them). Each batch's `row_id`s are folded into a CRC so a test can check that the same rows
come back after a restart.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.train import DataConfig


@dataclass
class Position:
    """Where a worker is: optimiser steps done, epoch, the next batch index of the epoch, rows consumed."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    rows: int = 0
    resumes: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def train_data_config() -> DataConfig:
    """Ray Train's DataConfig for a deterministic, order-preserving streaming split of "train"."""
    options = DataConfig.default_ingest_options()
    options.preserve_order = True
    return DataConfig(datasets_to_split=["train"], execution_options=options, enable_shard_locality=False)


def example_files(path: str) -> list[str]:
    """The `part-*.parquet` files under `path` (local directory or pyarrow URI, e.g. s3://...), sorted."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=False))
    files = sorted(i.path for i in infos if i.is_file and Path(i.path).name.startswith("part-")
                   and i.path.endswith(".parquet"))
    if not files:
        raise ValueError(f"{path}: no part-*.parquet files (write them with pipelines.train.examples)")
    prefix = path.split("://", 1)[0] + "://" if "://" in path else ""
    return [prefix + f for f in files]


def _read_files(batch: dict[str, np.ndarray], files: list[str]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(files[int(i)]) for i in batch["id"]])


def read_examples(path: str) -> ray.data.Dataset:
    """The stage's rows as a lazy Dataset: one read task and one block per Parquet file, in file order.

    Built as `range(files) -> map_batches(read file)` rather than `ray.data.read_parquet`: each `read_parquet`
    execution (a new one every epoch) takes far longer to deliver a few hundred rows than the range-based one
    does after its first.
    """
    files = example_files(path)
    ds = ray.data.range(len(files), override_num_blocks=len(files)).map_batches(
        _read_files, fn_kwargs={"files": files}, batch_size=1, batch_format="numpy")
    ds.context.enable_progress_bars = False  # workers' logs stay readable; the metrics carry the progress
    return ds


class RowStream:
    """Batches of `batch_size` rows from a worker's shard, epoch after epoch, starting at `position`."""

    def __init__(self, shard: Any, batch_size: int, position: Position, shuffle_buffer: int = 0,
                 seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"per-worker batch size must be >= 1, got {batch_size}")
        self.shard, self.batch_size, self.position = shard, batch_size, position
        self.shuffle_buffer, self.seed = shuffle_buffer, seed
        self.crc = 0
        self._it = self._batches()

    def _epoch(self, epoch: int) -> Iterator[dict[str, np.ndarray]]:
        shuffle = self.shuffle_buffer if self.shuffle_buffer > 0 else None
        return iter(self.shard.iter_batches(
            batch_size=self.batch_size, batch_format="numpy", drop_last=True, prefetch_batches=1,
            local_shuffle_buffer_size=shuffle, local_shuffle_seed=self.seed * 1000 + epoch if shuffle else None))

    def _batches(self) -> Iterator[dict[str, np.ndarray]]:
        pos = self.position
        while True:
            seen = 0
            for index, batch in enumerate(self._epoch(pos.epoch)):
                seen += 1
                if index < pos.batch:
                    continue  # consumed before the restart
                pos.batch = index + 1
                pos.rows += len(batch["row_id"])
                yield batch
            if seen == 0:
                raise ValueError(f"the training shard holds fewer than {self.batch_size} rows: nothing to train on")
            pos.epoch, pos.batch = pos.epoch + 1, 0

    def next(self) -> dict[str, np.ndarray]:
        batch = next(self._it)
        self.crc = zlib.crc32(np.ascontiguousarray(batch["row_id"], dtype=np.int64).tobytes(), self.crc)
        return batch

    def take_crc(self) -> int:
        """CRC of the row ids consumed since the last call."""
        crc, self.crc = self.crc, 0
        return crc
