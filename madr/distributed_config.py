"""The experiment's `distributed:` section (`DistributedConfig`): how `python -m pipelines.train` runs a training
stage on Ray Train: workers, backend, checkpoint storage, runtime env.

Ray-only settings, but plain data: they are defined here, in the library, so that loading an experiment
(`madr.config.ExperimentConfig`) checks every key and value of the section, while Ray is imported only by the
layer that runs them (`pipelines.train`, which reads the section with `pipelines.train.config.distributed_config`).
The in-process training loop never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("auto", "ddp", "deepspeed")
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class DistributedConfig:
    """How `python -m pipelines.train` runs a stage on Ray Train (ignored by the in-process loop).

    backend: "ddp" (torch DDP: gloo on CPU, nccl on GPU), "deepspeed" (ZeRO `zero_stage`, bf16 when
    `bf16` and `use_gpu`; on CPU it runs over gloo with torch's AdamW), or "auto" (deepspeed with GPUs,
    ddp without). `num_workers` data-parallel workers of `cpus_per_worker` CPUs (+1 GPU each with
    `use_gpu`); a stage's `batch_size` is the global micro-batch, split evenly over the workers.
    placement_strategy: how Ray places the workers' bundles over nodes (Ray Train's `ScalingConfig`): "PACK"
    (default: as few nodes as fit), "SPREAD" (over nodes where possible), "STRICT_SPREAD" (one worker per
    node, or the fit waits for nodes), "STRICT_PACK" (all on one node).
    gather_negatives: in-batch negatives are every worker's documents (`madr.training.distributed`), not the local ones.
    storage_path / run_name: where Ray Train keeps checkpoints (default `<output_dir>/ray_results`,
    `<name>-<stage>`); re-running with the same pair resumes from the latest checkpoint. keep_last: the
    checkpoints kept; max_failures: worker-group restarts before the job fails (-1: unlimited).
    shuffle_buffer: rows of the per-worker local shuffle buffer (seeded per epoch, so resumable).
    runtime_env: Ray runtime env of the job (env_vars, pip, working_dir, ...), e.g. for `ray job submit`.
    fail_at_step / fail_rank: failure drill: that worker SIGKILLs itself once after reporting that step.
    val_corpus: fine-tuning's validation searches the dev queries over their judged products plus a seeded sample
    of the others, this many products in all (0: the whole catalog; a 12-layer encoder spends minutes per pass
    over tens of thousands of products on CPU); where the judged products alone are more, a seeded sample of the
    dev queries whose judged products fill half of it.
    """

    backend: str = "auto"
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    zero_stage: int = 2
    bf16: bool = True
    gather_negatives: bool = True
    storage_path: str | None = None
    run_name: str | None = None
    keep_last: int = 2
    max_failures: int = 1
    shuffle_buffer: int = 256
    torch_threads: int | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
    fail_at_step: int | None = None
    fail_rank: int = 1
    val_corpus: int = 2000

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"distributed.backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.placement_strategy not in PLACEMENTS:
            raise ValueError(f"distributed.placement_strategy: {self.placement_strategy!r} is not one of "
                             f"{', '.join(PLACEMENTS)}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"distributed.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.num_workers < 1 or self.cpus_per_worker <= 0 or self.keep_last < 1:
            raise ValueError(f"distributed: need num_workers >= 1, cpus_per_worker > 0 and keep_last >= 1, got "
                             f"{self.num_workers}, {self.cpus_per_worker}, {self.keep_last}")
        if self.fail_at_step is not None and not 0 <= self.fail_rank < self.num_workers:  # only a drill needs it
            raise ValueError(f"distributed.fail_rank={self.fail_rank} is not a worker rank "
                             f"(num_workers={self.num_workers})")

    @property
    def resolved_backend(self) -> str:
        """"auto" -> "deepspeed" with GPUs, "ddp" on CPU."""
        if self.backend == "auto":
            return "deepspeed" if self.use_gpu else "ddp"
        return self.backend
