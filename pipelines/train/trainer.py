"""The Ray Train `TorchTrainer` every training job here builds (aspect stages in `pipelines.train.job`, the
multi-task recipe in `pipelines.multitask.train`): CPU or GPU workers, gloo / nccl, a named run under a
storage path, retries and kept checkpoints; the job brings its loop, its config and its datasets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainerSettings:
    """What a job tells Ray Train beyond its loop: workers and their resources, the run's name and storage,
    failure retries, checkpoints kept, the workers' runtime_env, how the workers are placed over nodes
    (`placement_strategy`: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD)."""

    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    run_name: str
    storage_path: str
    max_failures: int = 0
    keep_checkpoints: int = 1
    runtime_env: dict[str, Any] = field(default_factory=dict)
    placement_strategy: str = "PACK"


def worker_resources(s: TrainerSettings) -> dict[str, float]:
    """What each training worker asks Ray for: `cpus_per_worker` CPUs and, with `use_gpu`, one GPU (its placement
    group bundle: on an autoscaling cluster whose GPU node types start at zero, the autoscaler adds the GPU nodes)."""
    return {"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})}


def scaling_config(s: TrainerSettings) -> Any:
    """Ray Train's `ScalingConfig` of `s`: `num_workers` workers of `worker_resources`, placed by
    `placement_strategy`."""
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=s.num_workers, use_gpu=s.use_gpu, resources_per_worker=worker_resources(s),
                         placement_strategy=s.placement_strategy)


def torch_trainer(loop: Callable[[dict], None], loop_config: dict[str, Any], s: TrainerSettings,
                  callbacks: list[Any] | None = None, **data: Any) -> Any:
    """A `TorchTrainer` running `loop(loop_config)` on every worker; `data`: `datasets=` / `dataset_config=`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=scaling_config(s),
        torch_config=TorchConfig(backend="nccl" if s.use_gpu else "gloo"),
        run_config=RunConfig(name=s.run_name, storage_path=s.storage_path,
                             failure_config=FailureConfig(max_failures=s.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=s.keep_checkpoints),
                             callbacks=callbacks or None, worker_runtime_env=s.runtime_env or None),
        **data,
    )
