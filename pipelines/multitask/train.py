"""Train stage (driver): the data stage's mixer -> Ray Train `TorchTrainer` -> the trained model on disk.

`run_training(cfg, stage)` builds the `TaskMixer` (one coordinator actor produces the global mixed stream once
and hands each rank its part, `pipelines.data.mixing`), starts `scaling.num_workers` workers running
`pipelines.multitask.worker.train_loop_per_worker` (gloo on CPU, nccl on GPU), and copies the final
checkpoint's `model/` to `<output_dir>/model` (`BiEncoder.save` layout) with the loss history beside it
(`train_history.json`). Storage: `scaling.storage_path` (default `<output_dir>/ray_results`) under
`scaling.run_name` (default `<name>-multitask`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.multitask.config import PipelineConfig
from pipelines.multitask.data import DataStage, mixer
from pipelines.multitask.worker import HISTORY_FILE, MODEL_DIR, WorkerSpec, train_loop_per_worker
from pipelines.train.trainer import TrainerSettings, torch_trainer

TRAINED_MODEL, TRAIN_HISTORY = "model", "train_history.json"


@dataclass
class TrainStage:
    model_dir: str
    history: dict[str, list[dict[str, float]]]
    metrics: dict[str, Any]
    steps_per_task: dict[str, int]
    seconds: float


def build_torch_trainer(cfg: PipelineConfig, stage: DataStage, shards: list[Any]) -> Any:
    """The `TorchTrainer` of the train stage (see the module docstring)."""
    s = cfg.scaling
    spec = WorkerSpec(recipe=cfg.recipe.to_dict(), init_model=stage.init_model, sizes=dict(stage.sizes),
                      shards=shards, torch_threads=s.threads,
                      use_gpu=s.use_gpu, log_every=s.log_every, freeze_word_embeddings=cfg.freeze_word_embeddings)
    settings = TrainerSettings(s.num_workers, s.use_gpu, s.cpus_per_worker, s.run_name or f"{cfg.recipe.name}-multitask",
                               s.storage_path or str(cfg.output_dir / "ray_results"), s.max_failures, 1,
                               s.runtime_env)
    return torch_trainer(train_loop_per_worker, spec.to_dict(), settings)


def run_training(cfg: PipelineConfig, stage: DataStage) -> TrainStage:
    """Fit and export (see the module docstring)."""
    if cfg.recipe.steps < 1:
        raise ValueError(f"steps is {cfg.recipe.steps}: nothing to train")
    start = time.perf_counter()
    mix = mixer(cfg, stage)
    try:
        result = build_torch_trainer(cfg, stage, mix.shards()).fit()
    finally:
        mix.shutdown()
    if result.error is not None:
        raise result.error
    out = cfg.output_dir / TRAINED_MODEL
    with result.checkpoint.as_directory() as ckpt:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(Path(ckpt) / MODEL_DIR, out)
        history = json.loads((Path(ckpt) / HISTORY_FILE).read_text())
    (cfg.output_dir / TRAIN_HISTORY).write_text(json.dumps(history))
    steps = {name: len(rows) for name, rows in history.items()}
    return TrainStage(str(out), history, dict(result.metrics or {}), steps, time.perf_counter() - start)


def loss_summary(history: dict[str, list[dict[str, float]]], n: int = 10) -> dict[str, dict[str, float]]:
    """Per task: the mean loss of its first and last `n` steps (rank 0's rows)."""
    out = {}
    for name, rows in history.items():
        losses = [r["loss"] for r in rows]
        if losses:
            k = min(n, max(1, len(losses) // 2))
            out[name] = {"first": sum(losses[:k]) / k, "last": sum(losses[-k:]) / k, "steps": float(len(losses))}
    return out


def as_dict(stage: TrainStage) -> dict[str, Any]:
    d = dataclasses.asdict(stage)
    d.pop("history")
    d["loss"] = loss_summary(stage.history)
    return d
