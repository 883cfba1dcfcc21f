"""Which task each training batch comes from: the multi-task read schedules of paper 004 Sec. III-B.

Each task is a dataset of known size with its own loss; every batch holds records of one task only. One
epoch of a `TaskSchedule` is a fixed, seeded sequence of steps `(task, record indices)`:

* `"sequential"` (sequential read, Fig. 3a): every batch of task 1, then of task 2, ..., in the order of
  `sizes`.
* `"random"` (random read, Fig. 3b): each step picks a task uniformly among those with batches left (an
  exhausted task is skipped until the epoch ends), so the last batches of an epoch come from the largest tasks.
* `"proportional"` (proportional read, Fig. 3c; the paper's best): each step picks a task with probability
  proportional to its *remaining* batches, i.e. the epoch is a uniformly random shuffle of the multiset of all
  batches. Guarantee: every task is exhausted exactly at the end of the epoch (no task runs dry early), and
  after any m of the M steps task i has contributed m * n_i / M batches in expectation (n_i = its batch count,
  proportional to its size), with hypergeometric spread sd = sqrt(m p (1 - p) (M - m) / (M - 1)), p = n_i / M.
* `"weights"`: each step picks task i with probability w_i / sum(w), independently of what is left (paper
  004 Eq. 1 remark: "the loss of each dataset could be differentially weighted"). `stopping_condition`:
  `"first_exhausted"` (default) ends the epoch right after the first task delivers its last batch (other
  tasks are only partly read); `"all_exhausted"` restarts an exhausted task on a fresh shuffle (it cycles)
  and ends the epoch once every task has delivered all its batches at least once (records of over-weighted
  tasks are then read more than once).

In the first three modes every record of every task is used exactly once per epoch (the last batch of a
task may be smaller; `drop_last=True` drops it, and its records, instead). Records are shuffled within a
task each epoch (`shuffle=True`); everything derives from `(seed, epoch)`, so a schedule is reproducible and
`state_dict()` (epoch, position) resumes it exactly. `shard(rank, world_size)` splits the same schedule
over workers so that each record is used once across them. Pure Python + numpy.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

MODES = ("proportional", "sequential", "random", "weights")
STOPPING_CONDITIONS = ("first_exhausted", "all_exhausted")
SPLITS = ("batch", "step")


@dataclass(frozen=True)
class ScheduledBatch:
    """One step: the `task` the batch comes from and its record `indices` (rows of that task's dataset).

    `step` is the position in this (shard's) epoch, `epoch` the epoch, `cycle` how many times the task had
    already been read through in this epoch (> 0 only for `"weights"` with `"all_exhausted"`).
    """

    epoch: int
    step: int
    task: str
    indices: np.ndarray
    cycle: int = 0


@dataclass(frozen=True)
class _Plan:
    """Global steps of one epoch: task number, batch number within the task's cycle, cycle."""

    task: np.ndarray
    batch: np.ndarray
    cycle: np.ndarray


class TaskSchedule:
    """Seeded multi-task batch schedule of paper 004 Sec. III-B (see the module docstring).

    Args:
        sizes: records per task, in the order used by `"sequential"`; every size >= 1.
        mode: "proportional" (default, the paper's best), "sequential", "random" or "weights".
        weights: per-task weights > 0 for `mode="weights"` (normalised; same keys as `sizes`).
        batch_size: records per batch (global batch when sharded with `split="batch"`).
        seed: seeds both the task order and the record shuffles (with the epoch).
        drop_last: drop each task's last, smaller batch.
        shuffle: shuffle records within each task every epoch (else batches are consecutive ranges).
        stopping_condition: "first_exhausted" or "all_exhausted", for `mode="weights"`.

    Iterating yields `ScheduledBatch`es from the current position to the end of the current epoch; the
    next iteration starts the following epoch (or call `set_epoch`). The position counts batches handed
    out: save `state_dict()` after the step that used the last batch is done.
    """

    def __init__(self, sizes: Mapping[str, int], mode: str = "proportional", weights: Mapping[str, float] | None = None,
                 batch_size: int = 32, seed: int = 0, drop_last: bool = False, shuffle: bool = True,
                 stopping_condition: str = "first_exhausted") -> None:
        self._validate(sizes, mode, weights, batch_size, stopping_condition)
        self.names = [str(name) for name in sizes]
        self.sizes = {name: int(sizes[name]) for name in self.names}
        self.mode = mode
        self.weights = None if weights is None else {name: float(weights[name]) for name in self.names}
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.stopping_condition = stopping_condition
        counts = [size // batch_size if drop_last else math.ceil(size / batch_size) for size in self.sizes.values()]
        empty = [name for name, count in zip(self.names, counts, strict=True) if count == 0]
        if empty:
            raise ValueError(f"task(s) {empty} have fewer records than batch_size={batch_size} with drop_last=True")
        self.num_batches = dict(zip(self.names, counts, strict=True))
        self.rank, self.world_size, self.split = 0, 1, "batch"
        self.epoch, self.position = 0, 0
        self._plan_cache: tuple[int, _Plan] | None = None
        self._perm_cache: dict[tuple[int, int, int], np.ndarray] = {}

    @staticmethod
    def _validate(sizes: Mapping[str, int], mode: str, weights: Mapping[str, float] | None, batch_size: int,
                  stopping_condition: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        if stopping_condition not in STOPPING_CONDITIONS:
            raise ValueError(f"stopping_condition {stopping_condition!r} is not one of {', '.join(STOPPING_CONDITIONS)}")
        if not sizes:
            raise ValueError("sizes is empty: give at least one task")
        bad = {name: size for name, size in sizes.items() if isinstance(size, bool) or not isinstance(size, int)
               or size < 1}
        if bad:
            raise ValueError(f"task sizes must be ints >= 1, got {bad}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if (mode == "weights") != (weights is not None):
            raise ValueError("weights must be given exactly when mode='weights'")
        if weights is not None:
            if set(weights) != set(sizes):
                raise ValueError(f"weights keys {sorted(weights)} must equal the task names {sorted(sizes)}")
            bad = {name: w for name, w in weights.items() if not (math.isfinite(float(w)) and float(w) > 0)}
            if bad:
                raise ValueError(f"weights must be finite and > 0, got {bad}")

    # ------------------------------------------------------------------ the epoch plan

    def _plan(self, epoch: int) -> _Plan:
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (epoch, self._build_plan(np.random.default_rng([self.seed, epoch, 0])))
            self._perm_cache = {}
        return self._plan_cache[1]

    def _build_plan(self, rng: np.random.Generator) -> _Plan:
        counts = np.array([self.num_batches[name] for name in self.names], dtype=np.int64)
        if self.mode in ("sequential", "proportional"):
            task = np.repeat(np.arange(len(counts)), counts)
            if self.mode == "proportional":
                task = rng.permutation(task)
            return self._number_batches(task, counts)
        if self.mode == "random":
            return self._number_batches(self._random_read(rng, counts), counts)
        return self._weighted_plan(rng, counts)

    @staticmethod
    def _random_read(rng: np.random.Generator, counts: np.ndarray) -> np.ndarray:
        """Tasks drawn uniformly among those with batches left, one phase per set of live tasks: draw
        uniformly from the live set until the first of them runs out, drop it, repeat."""
        left = counts.copy()
        pieces = []
        while left.any():
            alive = np.flatnonzero(left)
            draws = alive[rng.integers(alive.shape[0], size=int(left[alive].sum()))]
            end = draws.shape[0]  # some live task runs out within the draws (they sum to what is left)
            for t in alive:
                hits = np.flatnonzero(draws == t)
                if hits.shape[0] >= left[t]:
                    end = min(end, int(hits[left[t] - 1]) + 1)
            pieces.append(draws[:end])
            left -= np.bincount(draws[:end], minlength=left.shape[0])
        return np.concatenate(pieces)

    @staticmethod
    def _number_batches(task: np.ndarray, counts: np.ndarray) -> _Plan:
        """Batch number of each step within its task: the k-th occurrence of a task reads its k-th batch."""
        batch = np.empty_like(task)
        for t, count in enumerate(counts):
            batch[task == t] = np.arange(count)
        return _Plan(task, batch, np.zeros_like(task))

    def _weighted_plan(self, rng: np.random.Generator, counts: np.ndarray) -> _Plan:
        probs = np.array([self.weights[name] for name in self.names]) / sum(self.weights.values())
        read = [0] * len(counts)
        cycles = [0] * len(counts)
        done = [False] * len(counts)
        task, batch, cycle = [], [], []
        while True:
            for t in rng.choice(len(counts), size=max(1024, int(counts.sum())), p=probs).tolist():
                task.append(t)
                batch.append(read[t])
                cycle.append(cycles[t])
                read[t] += 1
                if read[t] == counts[t]:
                    if self.stopping_condition == "first_exhausted":
                        return _Plan(np.array(task), np.array(batch), np.array(cycle))
                    done[t] = True
                    if all(done):
                        return _Plan(np.array(task), np.array(batch), np.array(cycle))
                    read[t], cycles[t] = 0, cycles[t] + 1

    def _permutation(self, epoch: int, task: int, cycle: int) -> np.ndarray:
        key = (epoch, task, cycle)
        if key not in self._perm_cache:
            size = self.sizes[self.names[task]]
            if self.shuffle:
                name_key = zlib.crc32(self.names[task].encode("utf-8"))
                rng = np.random.default_rng([self.seed, epoch, 1, name_key, cycle])
                self._perm_cache[key] = rng.permutation(size)
            else:
                self._perm_cache[key] = np.arange(size)
        return self._perm_cache[key]

    def _global_batch(self, epoch: int, step: int) -> tuple[int, int, np.ndarray]:
        plan = self._plan(epoch)
        task, number, cycle = int(plan.task[step]), int(plan.batch[step]), int(plan.cycle[step])
        start = number * self.batch_size
        return task, cycle, self._permutation(epoch, task, cycle)[start:start + self.batch_size]

    # ------------------------------------------------------------------ iteration

    def _global_steps(self, epoch: int) -> int:
        return int(self._plan(epoch).task.shape[0])

    def __len__(self) -> int:
        """Number of steps of the current epoch for this shard."""
        total = self._global_steps(self.epoch)
        if self.split == "step":
            return len(range(self.rank, total, self.world_size))
        return total

    def batch_at(self, step: int, epoch: int | None = None) -> ScheduledBatch:
        """The `step`-th batch of this shard in `epoch` (default: the current one), without moving."""
        epoch = self.epoch if epoch is None else epoch
        global_step = self.rank + step * self.world_size if self.split == "step" else step
        task, cycle, indices = self._global_batch(epoch, global_step)
        if self.split == "batch" and self.world_size > 1:
            indices = np.array_split(indices, self.world_size)[self.rank]
        return ScheduledBatch(epoch, step, self.names[task], indices, cycle)

    def __iter__(self) -> Iterator[ScheduledBatch]:
        if self.position >= len(self):
            self.set_epoch(self.epoch + 1)
        while self.position < len(self):
            batch = self.batch_at(self.position)
            self.position += 1
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of `epoch` (>= 0)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch, self.position = int(epoch), 0

    def tasks(self, epoch: int | None = None) -> list[str]:
        """Task name of every step of this shard in `epoch` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        plan = self._plan(epoch).task
        if self.split == "step":
            plan = plan[self.rank::self.world_size]
        return [self.names[t] for t in plan.tolist()]

    # ------------------------------------------------------------------ resume and sharding

    def _config(self) -> dict:
        return {"sizes": dict(self.sizes), "mode": self.mode, "weights": self.weights, "batch_size": self.batch_size,
                "seed": self.seed, "drop_last": self.drop_last, "shuffle": self.shuffle,
                "stopping_condition": self.stopping_condition}

    def _position_unit(self) -> str:
        """What `position` counts: global steps, or this shard's steps under a `world_size`-way step split."""
        return "global" if self.world_size == 1 or self.split == "batch" else f"step/{self.world_size}"

    def state_dict(self) -> dict:
        """Exact position (epoch, batches handed out) plus the configuration it is valid for."""
        return {"epoch": self.epoch, "position": self.position, "position_unit": self._position_unit(),
                "config": self._config()}

    def load_state_dict(self, state: Mapping) -> None:
        """Resume at `state`'s position; the configuration must match (ValueError names what differs).

        With `split="batch"` (or unsharded) the position counts global steps, so a state resumes under any
        world size; with `split="step"` the world size must be the same.
        """
        missing = {"epoch", "position", "position_unit", "config"} - set(state)
        if missing:
            raise ValueError(f"schedule state is missing {sorted(missing)}")
        config = self._config()
        differ = sorted(key for key in set(config) | set(state["config"]) if config.get(key) != state["config"].get(key))
        if differ:
            raise ValueError(f"schedule state was saved with a different {', '.join(differ)}")
        if state["position_unit"] != self._position_unit():
            raise ValueError(f"schedule state counts positions as {state['position_unit']!r}, this schedule as "
                             f"{self._position_unit()!r} (resume a step split with the same world_size)")
        epoch, position = int(state["epoch"]), int(state["position"])
        self.set_epoch(epoch)
        if not 0 <= position <= len(self):
            raise ValueError(f"schedule state position {position} is outside epoch {epoch} (0..{len(self)})")
        self.position = position

    def shard(self, rank: int, world_size: int, split: str = "batch") -> TaskSchedule:
        """This schedule's part for worker `rank` of `world_size`, starting at the current epoch.

        `split="batch"` (default): every worker walks the same steps and takes a disjoint, contiguous part
        of each global batch (sizes differ by at most 1): all workers run the same task at the same step and
        the same number of steps, as DDP needs. Every batch must then hold >= world_size records (use
        drop_last or a larger batch otherwise). `split="step"`: worker r takes the whole batches of global
        steps r, r + world_size, ...; step counts may differ by one between workers.
        Either way each record is used exactly once across the workers (modes other than "weights").
        """
        if self.world_size != 1:
            raise ValueError("this schedule is already a shard; shard the full schedule")
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank={rank}, "
                             f"world_size={world_size}")
        if split == "batch":
            smallest = {name: self.batch_size if self.drop_last or size % self.batch_size == 0
                        else size % self.batch_size for name, size in self.sizes.items()}
            small = {name: n for name, n in smallest.items() if n < world_size}
            if small:
                raise ValueError(f"tasks {small} have a batch smaller than world_size={world_size} records; "
                                 "use drop_last=True, a batch_size that divides the size, or split='step'")
        part = TaskSchedule(self.sizes, self.mode, self.weights, self.batch_size, self.seed, self.drop_last,
                            self.shuffle, self.stopping_condition)
        part.rank, part.world_size, part.split = int(rank), int(world_size), split
        part.set_epoch(self.epoch)
        return part
