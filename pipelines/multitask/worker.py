"""The Ray Train worker of the train stage: the madr multi-task trainer stepped on this rank's mixed batches.

Every worker (`train_loop_per_worker`):
1. loads the data stage's untrained encoder (`init_model/`: the same weights and tokenizer on every rank) and
   builds the recipe's tasks and losses (`madr.recipes.multitask.encoders.make_tasks`: triplet Eq. 3-7 on
   clicks, Eq. 2 on NLI, in-batch softmax on translation pairs) and one `MultiTaskTrainer` (AdamW, warm-up,
   clipping, Eq. 1's loss weights) whose tasks are sized by `ExternalSource`s: the records stream in;
2. with more than one worker, computes every loss through torch DDP around the trainer's `TaskLosses`
   (`find_unused_parameters`: a step of one task leaves the others' weights unused), so gradients are
   averaged over the ranks before each optimiser step;
3. iterates its `MixedShard` (one task per global step, this rank's part of the batch; epoch after epoch)
   for `steps` steps, turning each batch's columns back into records for the task's `make_batch`
   (`MultiTaskTrainer.train_records`);
4. reports the loss every `log_every` steps (on every rank: a report is a barrier) and, at the end, a
   checkpoint holding the model in `BiEncoder.save` form (`model/`), the trainer state and the loss history
   (rank 0 writes it).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray.train
import torch
from ray.train import Checkpoint

from madr.config import from_dict
from madr.modeling.model import BiEncoder
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.encoders import make_tasks
from madr.recipes.multitask.trainer import ExternalSource, MultiTaskTrainer
from pipelines.multitask.records import columns_to_records

MODEL_DIR, HISTORY_FILE, STATE_FILE = "model", "history.json", "trainer_state.pt"


@dataclass
class WorkerSpec:
    """What the driver sends every worker (`train_loop_config`)."""

    recipe: dict[str, Any]
    init_model: str
    sizes: dict[str, int]
    shards: list[Any]
    torch_threads: int = 1
    use_gpu: bool = False
    log_every: int = 10
    freeze_word_embeddings: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_trainer(spec: WorkerSpec, cfg: MultiTaskExperimentConfig, device: torch.device) -> MultiTaskTrainer:
    """Steps 1-2 of the module docstring."""
    model = BiEncoder.load(spec.init_model)
    if spec.freeze_word_embeddings:  # the e5 recipe keeps its 250k-row word table as pretrained
        for tower in model.towers():
            tower.backbone.get_input_embeddings().weight.requires_grad_(False)
    names = list(spec.sizes)
    tasks = make_tasks(cfg, model, names, cfg.seed)
    weights = {k: v for k, v in cfg.tasks.loss_weights.items() if k in names}
    trainer = MultiTaskTrainer(model, {n: (t, ExternalSource(spec.sizes[n])) for n, t in tasks.items()},
                               schedule={**asdict(cfg.schedule), "seed": cfg.seed, "weights": None,
                                         "mode": "proportional"},
                               optimizer=cfg.optimizer, loss_weights=weights, device=device)
    if ray.train.get_context().get_world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        trainer.wrap_losses(lambda m: DistributedDataParallel(m, device_ids=ids, find_unused_parameters=True))
    return trainer


def _checkpoint(trainer: MultiTaskTrainer, rank: int) -> tuple[Checkpoint | None, Path | None]:
    if rank != 0:
        return None, None
    tmp = Path(tempfile.mkdtemp(prefix="madr-mt-ckpt-"))
    trainer.model.save(tmp / MODEL_DIR)
    trainer.save_checkpoint(tmp / STATE_FILE)
    (tmp / HISTORY_FILE).write_text(json.dumps(trainer.history))
    return Checkpoint.from_directory(str(tmp)), tmp


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point (see the module docstring)."""
    spec = WorkerSpec(**config)
    cfg: MultiTaskExperimentConfig = from_dict(MultiTaskExperimentConfig, spec.recipe)
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    torch.set_num_threads(max(1, spec.torch_threads))
    torch.manual_seed(cfg.seed + rank)  # dropout differs per rank, as it would on one larger batch
    device = ray.train.torch.get_device() if spec.use_gpu else torch.device("cpu")
    trainer = build_trainer(spec, cfg, device)
    shard = spec.shards[rank]
    step, recent = 0, []
    while step < cfg.steps:
        for batch in shard:
            result = trainer.train_records(batch.task, columns_to_records(batch.data, batch.task), batch.epoch)
            step += 1
            recent.append(result.loss)
            last = step == cfg.steps
            if last or step % spec.log_every == 0:
                metrics = {"step": step, "epoch": batch.epoch, "loss": sum(recent) / len(recent), "rank": rank,
                           "world_size": ctx.get_world_size(), "rows": result.batch_size}
                checkpoint, tmp = _checkpoint(trainer, rank) if last else (None, None)
                ray.train.report(metrics, checkpoint=checkpoint)
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                recent = []
            if last:
                break
