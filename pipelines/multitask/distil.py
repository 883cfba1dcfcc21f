"""Distil stage (optional, `student.enabled`): the serving towers of paper 004 Sec. V-A, in a Ray task.

The trained encoder's query tower cut to `student.num_layers` layers and trained with the L2 loss to the
teacher on the query-side training texts (and, with `student.doc_layers`, the document tower likewise):
`madr.recipes.multitask.encoders.distil_query_student`, run as one Ray task of `cpus` CPUs; the served
encoder is saved as `<output_dir>/served_model` (`BiEncoder.save`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from madr.data.records import MultilingualData

SERVED_MODEL = "served_model"


def _distil(recipe: dict[str, Any], teacher_dir: str, data: MultilingualData, out_dir: str,
            threads: int) -> dict[str, float]:
    import torch

    from madr.config import from_dict
    from madr.modeling.model import BiEncoder
    from madr.recipes.multitask.config import MultiTaskExperimentConfig
    from madr.recipes.multitask.encoders import distil_query_student

    torch.set_num_threads(threads)
    cfg = from_dict(MultiTaskExperimentConfig, recipe)
    served, report = distil_query_student(cfg, BiEncoder.load(teacher_dir), data, cfg.seed)
    served.save(out_dir)
    return report


def run_distillation(recipe: Any, teacher_dir: str, data: MultilingualData, output_dir: Path,
                     cpus: float = 1.0, threads: int = 1) -> tuple[str, dict[str, float]]:
    """(served model directory, distillation report: held-out L2 distance before / after per side), in a task
    holding `cpus`, on `threads` torch threads."""
    import ray

    out = str(output_dir / SERVED_MODEL)
    task = ray.remote(num_cpus=cpus)(_distil)
    report = ray.get(task.remote(recipe.to_dict(), teacher_dir, data, out, threads))
    return out, report
