"""Multi-task training of paper 004 (Sec. III): tasks with their losses, the read schedule, the trainer core,
and the multilingual multi-task experiment.

| module | holds |
|---|---|
| `schedule` | `TaskSchedule`: which task each batch comes from (sequential / random / proportional, Sec. III-B) |
| `tasks` | `ClickTask`, `NLITask`, `TranslationTask` (record type + loss), `SideTokenizer`, `TaskBatch` |
| `trainer` | `MultiTaskTrainer`: one optimiser, one task per batch, exact resume |
| `config` | `MultiTaskExperimentConfig`: the experiment YAML (`configs/multitask.yaml`) |
| `data` | the experiment's synthetic click / NLI / parallel sets with held-out splits, and their text views |
| `click_log` | a raw click log (`data.clicks`) as the click task's training records: debiased weights, skip negatives |
| `encoders` | the experiment's tokenizer, encoder, tasks, multi-task training and distilled query student |
| `evaluation` | held-out metrics of an encoder: click NDCG, NLI AUC, cross-lingual top-1 |
| `baselines` | training-free rows: random, logged ranker, token BM25, minimum edit distance |
| `experiment` | `run_multitask_experiment`: multi-task vs click-only vs baselines (Table III shape) |

`schedule` needs only numpy (Ray Data mixers import it); the other names load torch and transformers, so
they are imported on first use (PEP 562) rather than when the package is.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from madr.recipes.multitask.schedule import MODES, STOPPING_CONDITIONS, ScheduledBatch, TaskSchedule

if TYPE_CHECKING:
    from madr.recipes.multitask.config import MultiTaskExperimentConfig, load_multitask_config
    from madr.recipes.multitask.experiment import MultiTaskResult, run_multitask_experiment
    from madr.recipes.multitask.tasks import (
        BaseTask,
        ClickTask,
        NLITask,
        SideTokenizer,
        Task,
        TaskBatch,
        TranslationTask,
        grid_triplet_loss,
    )
    from madr.recipes.multitask.trainer import (
        ExternalSource,
        MultiTaskTrainer,
        OptimizerSettings,
        RecordSource,
        ScheduleSettings,
        SequenceSource,
        StepResult,
        TaskLosses,
    )

_LAZY = {
    **{name: "madr.recipes.multitask.tasks" for name in (
        "BaseTask", "ClickTask", "NLITask", "SideTokenizer", "Task", "TaskBatch", "TranslationTask",
        "grid_triplet_loss")},
    **{name: "madr.recipes.multitask.trainer" for name in (
        "ExternalSource", "MultiTaskTrainer", "OptimizerSettings", "RecordSource", "ScheduleSettings",
        "SequenceSource", "StepResult", "TaskLosses")},
    "MultiTaskExperimentConfig": "madr.recipes.multitask.config",
    "load_multitask_config": "madr.recipes.multitask.config",
    "MultiTaskResult": "madr.recipes.multitask.experiment",
    "run_multitask_experiment": "madr.recipes.multitask.experiment",
}

__all__ = [
    "MODES",
    "STOPPING_CONDITIONS",
    "ScheduledBatch",
    "TaskSchedule",
    # tasks
    "BaseTask",
    "ClickTask",
    "NLITask",
    "SideTokenizer",
    "Task",
    "TaskBatch",
    "TranslationTask",
    "grid_triplet_loss",
    # trainer
    "ExternalSource",
    "MultiTaskTrainer",
    "OptimizerSettings",
    "RecordSource",
    "ScheduleSettings",
    "SequenceSource",
    "StepResult",
    "TaskLosses",
    # experiment
    "MultiTaskExperimentConfig",
    "MultiTaskResult",
    "load_multitask_config",
    "run_multitask_experiment",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'madr.recipes.multitask' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
