"""Data-parallel engines for one optimiser step: torch DDP or DeepSpeed ZeRO, same interface.

`train_step(micro_batches, step)` runs `grad_accum` micro-batches (forward + backward, or GradCache's three
passes per micro-batch when `stage.gradcache_chunk > 0`), synchronises gradients once, clips them to norm
1, and steps the optimiser and the learning-rate schedule (warm-up for `warmup_ratio` of the steps, then
linear or cosine decay, or constant). `save(dir)` / `load(dir)` write and read everything a resume needs.

DDP: gloo on CPU, nccl on GPU (the process group comes from the caller, e.g. Ray Train);
`find_unused_parameters=True` because a stage leaves parts of the bi-encoder unused (the MLM heads while
fine-tuning). Gradients are synchronised only on the last backward of a step (`no_sync` before it).
DeepSpeed: ZeRO stage `zero_stage`, bf16 when `bf16` and on GPU (untested here: no GPU), torch's AdamW
(no FusedAdam JIT build on CPU); on CPU it runs over the gloo group. DeepSpeed counts every backward as a
micro-step (its gradient_accumulation_steps = grad_accum x GradCache chunks) and reduces at the boundary.
Ray-free: pipelines/train/loop.py drives it inside Ray Train; tests may drive it in plain processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from madr.config import StageConfig
from madr.distributed_config import DistributedConfig
from madr.training.distributed import world_size
from madr.training.gradcache import chunk_slices, gradcache_step, take_rows
from madr.training.loop import Optimisation, build_scheduler
from madr.training.stage_module import FinetuneBatch, StageModule, num_rows
from pipelines.train.ops import deepspeed_env

STATE_FILE = "stage_module.safetensors"
TRAINER_FILE = "trainer_state.pt"
DS_DIR, DS_TAG = "deepspeed", "state"


def to_device(batch: Any, device: torch.device) -> Any:
    """Every tensor of a (nested) batch moved to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if hasattr(batch, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(batch, **{f: to_device(getattr(batch, f), device) for f in batch.__dataclass_fields__})
    return batch


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def _merge(parts: list[dict[str, float]], weights: list[float]) -> dict[str, float]:
    keys = {k for p in parts for k in p}
    total = sum(weights) or 1.0
    return {k: sum(w * p.get(k, 0.0) for p, w in zip(parts, weights, strict=True)) / total for k in keys}


class Engine:
    """Common step logic; subclasses say how the wrapped module is called and how backward / step happen."""

    backend = "none"

    def __init__(self, module: StageModule, stage: StageConfig, device: torch.device) -> None:
        self.module, self.stage, self.device = module, stage, device
        self.accum = stage.grad_accum

    # subclass hooks
    def call(self, *args: Any) -> Any:
        raise NotImplementedError

    def backward(self, value: torch.Tensor, sync: bool) -> None:
        raise NotImplementedError

    def finish_step(self) -> None:
        raise NotImplementedError

    @property
    def lr(self) -> float:
        raise NotImplementedError

    # the step
    def train_step(self, micro_batches: Sequence[Any], step: int,
                   seed_fn: Callable[[int], int] | None = None) -> dict[str, float]:
        """One optimiser step over `grad_accum` micro-batches; returns the mean loss parts and the LR."""
        out = self.accumulate(micro_batches, step, seed_fn)
        self.finish_step()
        out["lr"] = self.lr
        return out

    def accumulate(self, micro_batches: Sequence[Any], step: int,
                   seed_fn: Callable[[int], int] | None = None) -> dict[str, float]:
        """Forward + backward of every micro-batch, gradients synchronised after the last (no update yet)."""
        if len(micro_batches) != self.accum:
            raise ValueError(f"train_step: got {len(micro_batches)} micro-batches, grad_accum={self.accum}")
        self.module.train()
        parts, weights = [], []
        for m, batch in enumerate(micro_batches):
            if seed_fn is not None:
                torch.manual_seed(seed_fn(m))
            batch = to_device(batch, self.device)
            last = m == len(micro_batches) - 1
            if self.stage.gradcache_chunk > 0 and isinstance(batch, FinetuneBatch):
                parts.append(self._gradcache(batch, step, last))
            else:
                loss, p = self.call("loss", batch, step)
                self.backward(loss / self.accum, last)
                parts.append(p)
            weights.append(num_rows(batch))
        return _merge(parts, weights)

    def _gradcache(self, batch: FinetuneBatch, step: int, last_micro: bool) -> dict[str, float]:
        """GradCache (madr.training.gradcache) over chunks of `stage.gradcache_chunk` rows of this worker's micro-batch."""
        n = num_rows(batch)
        chunks = [take_rows(batch, s) for s in chunk_slices(n, self.stage.gradcache_chunk)]
        mod = self.module
        info: dict[str, float] = {}
        local_parts: list[dict[str, float]] = []

        def encode(chunk: FinetuneBatch) -> dict[str, torch.Tensor]:
            reps = mod.finetune_reps(mod.encode_finetune(chunk))
            w = num_rows(chunk) / n
            _, lp = mod.local_loss(reps["q"], reps["p"], reps.get("n"), chunk, w)
            local_parts.append((w, lp))
            return reps

        def rep_loss(reps: dict[str, torch.Tensor]) -> torch.Tensor:
            value, p = mod.rep_loss(reps, batch, step)
            info.update(p)
            return value

        def surrogate(i: int, chunk: FinetuneBatch, grads: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.call("surrogate", chunk, grads, num_rows(chunk) / n) / self.accum

        def backward(value: torch.Tensor, last_chunk: bool) -> None:
            self.backward(value, last_micro and last_chunk)

        loss, _ = gradcache_step(chunks, encode, rep_loss, surrogate, backward)
        local = {k: sum(w * lp.get(k, 0.0) for w, lp in local_parts) for k in {k for _, lp in local_parts for k in lp}}
        info.update(local)
        info["loss"] = float(loss) + self.stage.pointwise_weight * local.get("ce", 0.0)
        return info


class DDPEngine(Engine):
    """torch DistributedDataParallel (a plain module with one process), `madr.training.loop.Optimisation` (AdamW,
    warm-up + decay schedule, clipping at 1)."""

    backend = "ddp"

    def __init__(self, module: StageModule, stage: StageConfig, device: torch.device) -> None:
        super().__init__(module.to(device), stage, device)
        self.wrapped: nn.Module = module
        if world_size() > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.wrapped = DistributedDataParallel(module, device_ids=ids, find_unused_parameters=True)
        self.optimisation = Optimisation.for_stage(trainable(module), stage)
        self.zero_stage = 0

    def call(self, *args: Any) -> Any:
        return self.wrapped(*args)

    def backward(self, value: torch.Tensor, sync: bool) -> None:
        no_sync = getattr(self.wrapped, "no_sync", None)
        with (contextlib.nullcontext() if sync or no_sync is None else no_sync()):
            value.backward()

    def finish_step(self) -> None:
        self.optimisation.apply()
        self.optimisation.zero_grad()

    @property
    def lr(self) -> float:
        return self.optimisation.lr

    def save(self, directory: Path, rank: int) -> None:
        if rank != 0:
            return
        state = {k: v.detach().cpu().clone().contiguous() for k, v in self.module.state_dict().items()}
        save_file(state, str(directory / STATE_FILE))
        torch.save(self.optimisation.state_dict(), directory / TRAINER_FILE)

    def load(self, directory: Path) -> None:
        state = load_file(str(directory / STATE_FILE), device=str(self.device))
        self.module.load_state_dict(state)
        self.optimisation.load_state_dict(torch.load(directory / TRAINER_FILE, map_location=self.device,
                                                     weights_only=True))


def deepspeed_config(dist_cfg: DistributedConfig, stage: StageConfig, local_batch: int) -> dict[str, Any]:
    """The DeepSpeed config of a stage: ZeRO stage, bf16 on GPU, AdamW with torch's implementation."""
    chunks = len(chunk_slices(local_batch, stage.gradcache_chunk)) if stage.gradcache_chunk > 0 else 1
    micro = -(-local_batch // chunks)
    gas = stage.grad_accum * chunks
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "train_batch_size": micro * gas * max(world_size(), 1),
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": dist_cfg.zero_stage},
        "bf16": {"enabled": bool(dist_cfg.bf16 and dist_cfg.use_gpu)},
        "optimizer": {"type": "AdamW", "params": {"lr": stage.learning_rate, "weight_decay": stage.weight_decay,
                                                   "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine(Engine):
    """A DeepSpeed engine over the stage module (ZeRO stage from the config, visible as `zero_stage`)."""

    backend = "deepspeed"

    def __init__(self, module: StageModule, stage: StageConfig, device: torch.device,
                 dist_cfg: DistributedConfig, local_batch: int) -> None:
        super().__init__(module, stage, device)
        deepspeed_env(dist_cfg.use_gpu)  # its JIT-built op: pipelines.train.ops
        import deepspeed

        self.ds_config = deepspeed_config(dist_cfg, stage, local_batch)
        self.chunks = self.ds_config["gradient_accumulation_steps"] // stage.grad_accum
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=module, model_parameters=trainable(module), config=self.ds_config,
            lr_scheduler=lambda opt: build_scheduler(opt, stage), dist_init_required=False)
        self.zero_stage = int(self.engine.zero_optimization_stage())

    def call(self, *args: Any) -> Any:
        return self.engine(*args)

    def backward(self, value: torch.Tensor, sync: bool) -> None:
        # the values are already divided by grad_accum (and weighted per GradCache chunk)
        self.engine.backward(value, scale_wrt_gas=False)
        self.engine.step()  # a no-op except at the accumulation boundary (the last backward of the step)

    def finish_step(self) -> None:
        pass  # engine.step() after the last backward of the step applied the update (accumulation boundary)

    @property
    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save(self, directory: Path, rank: int) -> None:
        self.engine.save_checkpoint(str(directory / DS_DIR), tag=DS_TAG)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory / DS_DIR), tag=DS_TAG)
        if path is None:
            raise ValueError(f"{directory / DS_DIR}: no DeepSpeed checkpoint with tag {DS_TAG!r}")


def make_engine(dist_cfg: DistributedConfig, module: StageModule, stage: StageConfig, device: torch.device,
                local_batch: int) -> Engine:
    """DDP or DeepSpeed per `distributed.backend` ("auto": DeepSpeed with GPUs)."""
    if dist_cfg.resolved_backend == "deepspeed":
        return DeepSpeedEngine(module, stage, device, dist_cfg, local_batch)
    return DDPEngine(module, stage, device)
