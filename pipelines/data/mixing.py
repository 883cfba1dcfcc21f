"""Task mixing for multi-task training: one-task batches from several Ray Data streams, in the order a
`madr.recipes.multitask.schedule.TaskSchedule` decides, sharded over data-parallel workers.

Paper 004 Sec. III-B: every batch holds records of one task; the read schedule is proportional (default,
the paper's best), sequential, random, or explicit weights. The schedule is built from the task sizes with
`shuffle=False`, so its k-th batch of a task is that task's k-th `batch_size` rows *in stream order*: the
mixer pulls exactly that batch from the task's stream (`Dataset.iter_batches`, optionally shuffled with a
local buffer) and checks that sizes agree, so the schedule's guarantees carry over:

* proportional / sequential / random: every row of every task is used exactly once per epoch (the last,
  smaller batch of a task too, unless `drop_last`); a task with more or fewer rows than `sizes` says is
  an error, not a silent loss;
* weights: task i is drawn with probability w_i / sum(w) at each step; `stopping_condition` as in
  `TaskSchedule` ("all_exhausted" restarts an exhausted task's stream, so its rows repeat).

Sharding over `world_size` workers reuses `TaskSchedule.shard(rank, world_size, split)`: with
`split="batch"` (default, what DDP needs) every worker runs the same task at every step, the same number
of steps, and takes a disjoint contiguous part of each global batch (sizes differ by at most one row); with
`split="step"` worker r takes the whole global batches r, r + world_size, ... Either way each row goes to
exactly one worker. The global stream is produced once, by a coordinator actor (`num_cpus=0`) that runs the
Ray Data executions and hands each worker its part; `TaskMixer.shards()` gives one picklable `MixedShard`
per rank (pass it to the Ray Train worker of that rank). With one worker, iterate the `TaskMixer` itself:
no actor is involved.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from ray.data import Dataset

from madr.recipes.multitask.schedule import TaskSchedule

Collate = Callable[[dict[str, np.ndarray]], Any]
_EVERY_ROW_ONCE = ("proportional", "sequential", "random")


@dataclass(frozen=True)
class MixedBatch:
    """One step of one worker: the `task` its rows come from and the (collated) `data` columns."""

    epoch: int
    step: int
    task: str
    data: Any
    cycle: int = 0

    @property
    def num_rows(self) -> int:
        first = next(iter(self.data.values()))
        return len(first)


@dataclass(frozen=True)
class StreamOptions:
    batch_size: int
    drop_last: bool
    shuffle_buffer: int
    seed: int


class _EpochStreams:
    """The global batches of one epoch, in schedule order, pulled from one stream per task (and cycle)."""

    def __init__(self, datasets: Mapping[str, Dataset], schedule: TaskSchedule, epoch: int,
                 options: StreamOptions) -> None:
        self.datasets, self.schedule, self.epoch, self.options = datasets, schedule, epoch, options
        schedule.set_epoch(epoch)
        self.num_steps = len(schedule)
        self.produced = 0
        self.iters: dict[str, tuple[int, Iterator[dict[str, np.ndarray]]]] = {}
        self.read: dict[tuple[str, int], int] = {}

    def _stream(self, task: str, cycle: int) -> Iterator[dict[str, np.ndarray]]:
        if task in self.iters and self.iters[task][0] == cycle:
            return self.iters[task][1]
        self._close(task)
        opts = self.options
        seed = zlib.crc32(f"{opts.seed}/{self.epoch}/{task}/{cycle}".encode())
        it = iter(self.datasets[task].iter_batches(
            batch_size=opts.batch_size, batch_format="numpy", drop_last=opts.drop_last, prefetch_batches=1,
            local_shuffle_buffer_size=opts.shuffle_buffer or None,
            local_shuffle_seed=seed if opts.shuffle_buffer else None))
        self.iters[task] = (cycle, it)
        return it

    def _close(self, task: str) -> None:
        if task in self.iters:
            close = getattr(self.iters.pop(task)[1], "close", None)
            if close is not None:
                close()

    def produce(self) -> tuple[int, str, int, dict[str, np.ndarray]]:
        """The next global batch: (global step, task, cycle, columns)."""
        if self.produced >= self.num_steps:
            raise ValueError(f"epoch {self.epoch} has only {self.num_steps} steps")
        step = self.produced
        planned = self.schedule.batch_at(step, self.epoch)
        task, cycle = planned.task, planned.cycle
        number = self.read.get((task, cycle), 0)
        try:
            batch = next(self._stream(task, cycle))
        except StopIteration:
            raise ValueError(f"task {task!r} ran out of rows at its batch {number}: its dataset has fewer rows "
                             f"than sizes[{task!r}]={self.schedule.sizes[task]}") from None
        rows = len(next(iter(batch.values())))
        expected = planned.indices
        if rows != len(expected) or (len(expected) and expected[0] != number * self.options.batch_size):
            raise ValueError(f"task {task!r} batch {number}: the stream gave {rows} rows, the schedule expects "
                             f"{len(expected)} (sizes[{task!r}]={self.schedule.sizes[task]} is wrong?)")
        self.read[(task, cycle)] = number + 1
        self.produced += 1
        if self.produced == self.num_steps:
            self._finish()
        return step, task, cycle, batch

    def _finish(self) -> None:
        if self.schedule.mode in _EVERY_ROW_ONCE:
            for task, (_, it) in list(self.iters.items()):
                if next(it, None) is not None:
                    raise ValueError(f"task {task!r} has more rows than sizes[{task!r}]="
                                     f"{self.schedule.sizes[task]}: rows would be lost")
        for task in list(self.iters):
            self._close(task)


def _part(batch: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    return {k: v[lo:hi] for k, v in batch.items()}


class _Coordinator:
    """Produces each epoch's global batches once and hands every rank its part (see the module docstring)."""

    def __init__(self, datasets: Mapping[str, Dataset], schedule: TaskSchedule, world_size: int, split: str,
                 options: StreamOptions) -> None:
        self.datasets, self.schedule, self.options = datasets, schedule, options
        self.world_size, self.split = world_size, split
        self.shards = [schedule.shard(r, world_size, split) for r in range(world_size)]
        self.epochs: dict[int, _EpochStreams] = {}
        self.pending: dict[tuple[int, int], list[Any]] = {}  # (epoch, global step) -> [task, cycle, batch, ranks]

    def num_steps(self, rank: int, epoch: int) -> int:
        shard = self.shards[rank]
        shard.set_epoch(epoch)
        return len(shard)

    def _epoch(self, epoch: int) -> _EpochStreams:
        if epoch not in self.epochs:
            for old in [e for e in self.epochs if e < epoch - 1]:  # abandoned epochs
                del self.epochs[old]
                self.pending = {k: v for k, v in self.pending.items() if k[0] != old}
            self.epochs[epoch] = _EpochStreams(self.datasets, self.schedule, epoch, self.options)
        return self.epochs[epoch]

    def get(self, rank: int, epoch: int, step: int) -> MixedBatch:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside [0, {self.world_size})")
        global_step = rank + step * self.world_size if self.split == "step" else step
        streams = self._epoch(epoch)
        while streams.produced <= global_step:
            g, task, cycle, batch = streams.produce()
            ranks = {g % self.world_size} if self.split == "step" else set(range(self.world_size))
            self.pending[(epoch, g)] = [task, cycle, batch, ranks]
        task, cycle, batch, ranks = self.pending[(epoch, global_step)]
        if rank not in ranks:
            raise ValueError(f"rank {rank} already took epoch {epoch} step {step}")
        if self.split == "batch" and self.world_size > 1:
            whole = self.schedule.batch_at(global_step, epoch).indices
            mine = self.shards[rank].batch_at(step, epoch).indices
            lo = int(mine[0] - whole[0]) if len(mine) else 0
            batch = _part(batch, lo, lo + len(mine))
        ranks.discard(rank)
        if not ranks:
            del self.pending[(epoch, global_step)]
            if streams.produced == streams.num_steps and not any(k[0] == epoch for k in self.pending):
                del self.epochs[epoch]
        return MixedBatch(epoch, step, task, batch, cycle)


_RemoteCoordinator = ray.remote(num_cpus=0, max_concurrency=1)(_Coordinator)


class MixedShard:
    """Rank `rank`'s part of the mixed stream; iterate it once per epoch (picklable: send it to a worker)."""

    def __init__(self, coordinator: Any, rank: int, world_size: int, collate: Collate | None = None,
                 epoch: int = 0, prefetch: int = 2) -> None:
        self.coordinator, self.rank, self.world_size = coordinator, rank, world_size
        self.collate, self.epoch, self.prefetch = collate, epoch, max(prefetch, 1)

    def __len__(self) -> int:
        return ray.get(self.coordinator.num_steps.remote(self.rank, self.epoch))

    def __iter__(self) -> Iterator[MixedBatch]:
        epoch, steps = self.epoch, len(self)
        refs = [self.coordinator.get.remote(self.rank, epoch, s) for s in range(min(self.prefetch, steps))]
        for step in range(steps):
            if step + len(refs) < steps:
                refs.append(self.coordinator.get.remote(self.rank, epoch, step + len(refs)))
            batch = ray.get(refs.pop(0))
            yield _collated(batch, self.collate)
        self.epoch = epoch + 1


def _collated(batch: MixedBatch, collate: Collate | None) -> MixedBatch:
    if collate is None:
        return batch
    return MixedBatch(batch.epoch, batch.step, batch.task, collate(batch.data), batch.cycle)


class TaskMixer:
    """One-task batches from `datasets` (task name -> Dataset) in `TaskSchedule` order.

    Args:
        datasets: one Dataset per task, in the order "sequential" reads them.
        batch_size: rows per global batch (split over the workers with `split="batch"`).
        mode, weights, seed, drop_last, stopping_condition: as in `TaskSchedule`.
        sizes: rows per task; default `Dataset.count()` of each (cheap for Parquet reads and 1:1 maps).
        shuffle_buffer: rows of a local shuffle buffer per task stream (0: stream order).
        collate: applied to each batch's columns (e.g. `pipelines.data.tokenize.collate_to_torch`).
        world_size, split: data-parallel workers and how a global step is split (see the module docstring).
    """

    def __init__(self, datasets: Mapping[str, Dataset], *, batch_size: int = 32, mode: str = "proportional",
                 weights: Mapping[str, float] | None = None, seed: int = 0, drop_last: bool = False,
                 stopping_condition: str = "first_exhausted", sizes: Mapping[str, int] | None = None,
                 shuffle_buffer: int = 0, collate: Collate | None = None, world_size: int = 1,
                 split: str = "batch") -> None:
        if not datasets:
            raise ValueError("TaskMixer: give at least one task dataset")
        if sizes is None:
            sizes = {name: ds.count() for name, ds in datasets.items()}
        elif set(sizes) != set(datasets):
            raise ValueError(f"sizes keys {sorted(sizes)} differ from the tasks {sorted(datasets)}")
        empty = [name for name, n in sizes.items() if n < 1]
        if empty:
            raise ValueError(f"TaskMixer: tasks {empty} have no rows")
        self.datasets = dict(datasets)
        self.schedule = TaskSchedule({name: int(sizes[name]) for name in datasets}, mode, weights, batch_size,
                                     seed, drop_last, shuffle=False, stopping_condition=stopping_condition)
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if world_size > 1:
            self.schedule.shard(0, world_size, split)  # raises if a batch is too small to split
        self.options = StreamOptions(batch_size, drop_last, shuffle_buffer, seed)
        self.collate, self.world_size, self.split = collate, world_size, split
        self.epoch = 0
        self._coordinator = None

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.schedule.sizes)

    def tasks(self, epoch: int = 0) -> list[str]:
        """The task of every global step of `epoch` (what the schedule decides)."""
        return self.schedule.tasks(epoch)

    def __iter__(self) -> Iterator[MixedBatch]:
        """One epoch in this process (world_size 1); the next iteration is the next epoch."""
        if self.world_size != 1:
            raise ValueError(f"world_size={self.world_size}: iterate shards() (one per worker), not the mixer")
        streams = _EpochStreams(self.datasets, self.schedule, self.epoch, self.options)
        self.epoch += 1
        while streams.produced < streams.num_steps:
            step, task, cycle, batch = streams.produce()
            yield _collated(MixedBatch(streams.epoch, step, task, batch, cycle), self.collate)

    def shards(self) -> list[MixedShard]:
        """One `MixedShard` per rank, served by one coordinator actor (created on the first call)."""
        if self._coordinator is None:
            self._coordinator = _RemoteCoordinator.remote(self.datasets, self.schedule, self.world_size,
                                                          self.split, self.options)
        return [MixedShard(self._coordinator, r, self.world_size, self.collate) for r in range(self.world_size)]

    def shutdown(self) -> None:
        """Stop the coordinator actor (if any)."""
        if self._coordinator is not None:
            ray.kill(self._coordinator)
            self._coordinator = None
