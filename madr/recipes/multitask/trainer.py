"""The multi-task trainer of paper 004 (Eq. 1, Sec. III-B): one task per batch, in `TaskSchedule` order.

Eq. 1 minimises `sum_i w_i L_i(theta, D_i)` over T tasks (w_i = 1 in the paper: "we treat each sample pair as
being equally important"; `loss_weights` sets others). Every step reads the next `ScheduledBatch` of the
schedule (proportional read by default, the paper's best), asks that task's records from its source, lets the
task batch them and compute its loss, and steps one optimiser over the model and the tasks' own weights.

Where records come from is a `RecordSource`: anything with `len()` and `take(indices) -> records`. A plain
list (or any indexable sequence) is wrapped in `SequenceSource`, after dropping the records the task cannot
use (`task.accepts`: unclicked pairs, contradictions), so that every usable record is read exactly once per
epoch. A streaming source (Ray Data) can implement the same two methods.

`state_dict()` holds the model, optimiser, learning-rate schedule, schedule position, step count, history and
RNG states: `load_state_dict` on a trainer built the same way continues with exactly the same batches (and,
on the same device, the same losses).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from madr.modeling.model import BiEncoder
from madr.recipes.multitask.schedule import TaskSchedule
from madr.recipes.multitask.tasks import Task
from madr.training.loop import Optimisation

Evaluator = Callable[[BiEncoder], Mapping[str, float]]


@runtime_checkable
class RecordSource(Protocol):
    """Records of one task, addressable by row: what the schedule's indices refer to."""

    def __len__(self) -> int: ...

    def take(self, indices: Sequence[int]) -> list[Any]: ...


class ExternalSource:
    """A `RecordSource` of `size` records held outside the trainer (e.g. a Ray Data stream): it sizes the
    schedule; batches arrive through `MultiTaskTrainer.train_records`, so `take` is an error."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __len__(self) -> int:
        return self.size

    def take(self, indices: Sequence[int]) -> list[Any]:
        raise ValueError("ExternalSource holds no records: feed batches with MultiTaskTrainer.train_records")


class TaskLosses(nn.Module):
    """The model and its tasks as one module: `forward(name, batch)` is task `name`'s loss (Eq. 1's L_i).

    What a data-parallel wrapper wraps (torch DDP synchronises the gradients of a module's `forward`); tasks
    that are not `nn.Module`s are called the same way but hold no weights of their own.
    """

    def __init__(self, model: BiEncoder, tasks: Mapping[str, Task]) -> None:
        super().__init__()
        self.model = model
        self.task_modules = nn.ModuleDict({n: t for n, t in tasks.items() if isinstance(t, nn.Module)})
        self._plain = {n: t for n, t in tasks.items() if not isinstance(t, nn.Module)}

    def forward(self, name: str, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        task = self.task_modules[name] if name in self.task_modules else self._plain[name]
        return task.loss(self.model, batch)


class SequenceSource:
    """A `RecordSource` over an in-memory sequence."""

    def __init__(self, records: Sequence[Any]) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def take(self, indices: Sequence[int]) -> list[Any]:
        return [self.records[int(i)] for i in indices]


def usable_records(task: Task, records: Sequence[Any]) -> list[Any]:
    """The records `task` can use, in order; a bad record raises ValueError naming the task and row."""
    kept = []
    for i, record in enumerate(records):
        if not isinstance(record, task.record_type):
            raise ValueError(f"task {task.name!r}: record {i} is a {type(record).__name__}, expected "
                             f"{task.record_type.__name__}")
        try:
            ok = task.accepts(record)
        except ValueError as err:
            raise ValueError(f"task {task.name!r}: record {i}: {err}") from err
        if ok:
            kept.append(record)
    return kept


@dataclass
class ScheduleSettings:
    """Arguments of `TaskSchedule` except the sizes (which come from the sources)."""

    mode: str = "proportional"
    weights: dict[str, float] | None = None
    batch_size: int = 32
    seed: int = 0
    drop_last: bool = False
    shuffle: bool = True
    stopping_condition: str = "first_exhausted"


@dataclass
class OptimizerSettings:
    """AdamW with linear warm-up to `learning_rate` over `warmup_steps`, then constant; gradient clipping."""

    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0


@dataclass
class StepResult:
    """What one step did: which task, which records (rows of its source, after filtering), the loss and parts."""

    step: int
    epoch: int
    task: str
    indices: list[int]
    batch_size: int
    loss: float
    parts: dict[str, float] = field(default_factory=dict)


class MultiTaskTrainer:
    """One optimiser over a `BiEncoder` and its tasks, fed one task per batch by a `TaskSchedule`.

    Args:
        model: the bi-encoder trained by every task.
        tasks: task name -> (task, records): a sequence (filtered by `task.accepts`) or a `RecordSource`
            (used as is). The name keys the schedule, the history and `loss_weights`.
        schedule: `ScheduleSettings` (or a dict of its fields).
        optimizer: `OptimizerSettings` (or a dict of its fields).
        evaluators: name -> callable(model) -> metrics, run by `evaluate()` in eval mode without gradients.
        loss_weights: task name -> weight of its loss in Eq. 1 (default 1).
        device: where the model and batches live (default: the model's device).
    """

    def __init__(self, model: BiEncoder, tasks: Mapping[str, tuple[Task, Sequence[Any] | RecordSource]],
                 schedule: ScheduleSettings | Mapping[str, Any] | None = None,
                 optimizer: OptimizerSettings | Mapping[str, Any] | None = None,
                 evaluators: Mapping[str, Evaluator] | None = None,
                 loss_weights: Mapping[str, float] | None = None, device: torch.device | str | None = None) -> None:
        if not tasks:
            raise ValueError("tasks is empty: give at least one (task, records) pair")
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)
        self.tasks: dict[str, Task] = {}
        self.sources: dict[str, RecordSource] = {}
        self.dropped: dict[str, int] = {}
        for name, (task, records) in tasks.items():
            self._add_task(str(name), task, records)
        self.schedule_settings = _settings(ScheduleSettings, schedule, "schedule")
        self.optimizer_settings = _settings(OptimizerSettings, optimizer, "optimizer")
        self.schedule = TaskSchedule({n: len(s) for n, s in self.sources.items()},
                                     **dataclasses.asdict(self.schedule_settings))
        self.loss_weights = {name: 1.0 for name in self.tasks}
        unknown = sorted(set(loss_weights or {}) - set(self.tasks))
        if unknown:
            raise ValueError(f"loss_weights names unknown task(s) {unknown}; tasks: {sorted(self.tasks)}")
        self.loss_weights.update({k: float(v) for k, v in (loss_weights or {}).items()})
        self.evaluators = dict(evaluators or {})
        self.losses = TaskLosses(self.model, self.tasks)
        self.loss_forward: Callable[[str, Any], tuple[torch.Tensor, dict[str, float]]] = self.losses
        self._params = self._parameters()
        self.optimisation = self._build_optimisation()
        self.global_step = 0
        self.history: dict[str, list[dict[str, float]]] = {name: [] for name in self.tasks}
        self.eval_history: list[dict[str, Any]] = []

    def _add_task(self, name: str, task: Task, records: Sequence[Any] | RecordSource) -> None:
        if not isinstance(task, Task):
            raise ValueError(f"task {name!r}: {type(task).__name__} does not implement the Task protocol")
        if isinstance(records, RecordSource):
            source: RecordSource = records
            self.dropped[name] = 0
        else:
            kept = usable_records(task, records)
            self.dropped[name] = len(records) - len(kept)
            source = SequenceSource(kept)
        if len(source) == 0:
            raise ValueError(f"task {name!r} has no usable record (dropped {self.dropped[name]})")
        if isinstance(task, nn.Module):
            task.to(self.device)
        self.tasks[name], self.sources[name] = task, source

    def _parameters(self) -> list[nn.Parameter]:
        """The model's parameters plus every task's own, each once, in a fixed order."""
        seen: set[int] = set()
        params = []
        for p in [*self.model.parameters(), *(q for t in self.tasks.values() for q in t.parameters())]:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        return params

    def _build_optimisation(self) -> Optimisation:
        s = self.optimizer_settings
        if s.learning_rate <= 0 or s.weight_decay < 0 or s.warmup_steps < 0:
            raise ValueError(f"optimizer settings need learning_rate > 0, weight_decay >= 0, warmup_steps >= 0; "
                             f"got {s}")
        warmup = s.warmup_steps

        def schedule(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)

        return Optimisation(self._params, s.learning_rate, s.weight_decay, schedule, s.max_grad_norm)

    # ------------------------------------------------------------------ training

    def next_batch(self) -> tuple[int, str, np.ndarray]:
        """(epoch, task, record indices) of the next step, without moving (a new epoch starts when one ends)."""
        if self.schedule.position >= len(self.schedule):
            self.schedule.set_epoch(self.schedule.epoch + 1)
        scheduled = self.schedule.batch_at(self.schedule.position)
        return scheduled.epoch, scheduled.task, scheduled.indices

    def step(self) -> StepResult:
        """Train on the next scheduled batch: that task's loss, one optimiser step."""
        epoch, name, indices = self.next_batch()
        result = self._train_on(name, self.sources[name].take(indices.tolist()), epoch, indices.tolist())
        self.schedule.position += 1  # only once the step is done, so a saved state never skips a batch
        return result

    def train_records(self, name: str, records: Sequence[Any], epoch: int = 0) -> StepResult:
        """One optimiser step of task `name` on `records` chosen outside the trainer (see the module
        docstring); the trainer's schedule does not move. Records the task cannot use are dropped by its
        `make_batch`, as in `step`."""
        if name not in self.tasks:
            raise ValueError(f"unknown task {name!r}; tasks: {sorted(self.tasks)}")
        return self._train_on(name, records, epoch, list(range(len(records))))

    def wrap_losses(self, wrapper: Callable[[nn.Module], nn.Module]) -> None:
        """Compute every loss through `wrapper(self.losses)` (e.g. torch DDP over a process group)."""
        self.loss_forward = wrapper(self.losses)

    def _train_on(self, name: str, records: Sequence[Any], epoch: int, indices: list[int]) -> StepResult:
        task = self.tasks[name]
        batch = task.make_batch(records).to(self.device)
        self.model.train()
        if isinstance(task, nn.Module):
            task.train()
        loss, parts = self.loss_forward(name, batch)
        if not torch.isfinite(loss):
            raise ValueError(f"task {name!r}: non-finite loss {float(loss)} at step {self.global_step}")
        self.optimisation.step(loss * self.loss_weights[name])
        result = StepResult(self.global_step, epoch, name, indices, batch.size, float(loss.detach()), dict(parts))
        self.history[name].append({"step": float(self.global_step), "epoch": float(epoch), "loss": result.loss,
                                   **result.parts})
        self.global_step += 1
        return result

    def train(self, steps: int, eval_every: int | None = None,
              callback: Callable[[StepResult], None] | None = None) -> list[StepResult]:
        """Run `steps` steps (crossing epochs as needed); evaluate every `eval_every` steps when given."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        results = []
        for _ in range(steps):
            result = self.step()
            results.append(result)
            if callback is not None:
                callback(result)
            if eval_every and self.global_step % eval_every == 0:
                self.evaluate()
        return results

    def train_epoch(self) -> list[StepResult]:
        """Run to the end of the current epoch (a whole new one if the current one is finished)."""
        if self.schedule.position >= len(self.schedule):
            self.schedule.set_epoch(self.schedule.epoch + 1)
        return self.train(len(self.schedule) - self.schedule.position)

    @torch.no_grad()
    def task_loss(self, name: str, records: Sequence[Any]) -> float:
        """`name`'s loss on `records` in eval mode, without training (e.g. held-out monitoring)."""
        task = self.tasks[name]
        batch = task.make_batch(records).to(self.device)
        modules = [self.model, *([task] if isinstance(task, nn.Module) else [])]
        modes = [m.training for m in modules]
        for m in modules:
            m.eval()
        try:
            return float(task.loss(self.model, batch)[0])
        finally:
            for m, mode in zip(modules, modes, strict=True):
                m.train(mode)

    @torch.no_grad()
    def evaluate(self) -> dict[str, dict[str, float]]:
        """Run every evaluator on the model (eval mode, no gradients); appended to `eval_history`."""
        was_training = self.model.training
        self.model.eval()
        try:
            metrics = {name: {k: float(v) for k, v in fn(self.model).items()} for name, fn in self.evaluators.items()}
        finally:
            self.model.train(was_training)
        self.eval_history.append({"step": self.global_step, "metrics": metrics})
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights, optimiser, schedule position, history, RNG.

        A deep copy: training on does not change a state taken earlier.
        """
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return copy.deepcopy({
            "model": self.model.state_dict(),
            "tasks": {name: t.state_dict() for name, t in self.tasks.items() if isinstance(t, nn.Module)},
            "optimizer": self.optimisation.optimizer.state_dict(),
            "lr_scheduler": self.optimisation.scheduler.state_dict(),
            "schedule": self.schedule.state_dict(),
            "global_step": self.global_step,
            "history": {name: [dict(h) for h in rows] for name, rows in self.history.items()},
            "eval_history": list(self.eval_history),
            "rng": rng,
        })

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state` (from a trainer built with the same tasks, sources and settings)."""
        missing = {"model", "optimizer", "lr_scheduler", "schedule", "global_step"} - set(state)
        if missing:
            raise ValueError(f"trainer state is missing {sorted(missing)}")
        if set(state.get("history", self.history)) != set(self.tasks):
            raise ValueError(f"trainer state has tasks {sorted(state['history'])}, this trainer {sorted(self.tasks)}")
        self.schedule.load_state_dict(state["schedule"])
        self.model.load_state_dict(state["model"])
        for name, task_state in state.get("tasks", {}).items():
            self.tasks[name].load_state_dict(task_state)
        self.optimisation.optimizer.load_state_dict(state["optimizer"])
        self.optimisation.scheduler.load_state_dict(state["lr_scheduler"])
        self.global_step = int(state["global_step"])
        self.history = {name: [dict(h) for h in rows] for name, rows in state.get("history", {}).items()}
        self.eval_history = list(state.get("eval_history", []))
        rng = state.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"].cpu())
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu(), self.device)

    def save_checkpoint(self, path: str | Path) -> Path:
        """`state_dict()` to one file (tensors and plain Python values only)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Resume from `save_checkpoint`'s file; loads with `weights_only=True` (no arbitrary unpickling)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such checkpoint file")
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def _settings(cls: type, value: Any, what: str) -> Any:
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{what} settings: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**value)
    raise ValueError(f"{what} settings must be a {cls.__name__} or a dict, got {type(value).__name__}")
