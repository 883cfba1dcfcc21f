"""The whole recipe on Ray: data -> train -> (distil) -> encode -> evaluate, one call (`run_pipeline`).

Each stage is its module (`data`, `train`, `distil`, `encode`, `evaluate`); this one chains them on the
current Ray cluster and writes `pipeline.json` (what each stage did and how long it took) beside
`metrics.json` under `output_dir`:

    <output_dir>/data/<task>/part-*.parquet   usable training rows per task (normalised task schema)
    <output_dir>/data_summary.json            rows per task, rows dropped, set sizes (+ real-data counts)
    <output_dir>/init_model/                  the untrained encoder every worker starts from
    <output_dir>/ray_results/                 Ray Train's run (checkpoint)
    <output_dir>/model/                       the trained encoder (BiEncoder.save), train_history.json
    <output_dir>/served_model/                with student.enabled: the distilled serving towers
    <output_dir>/index/                       FAISS shards + manifest of the held-out English candidates
    <output_dir>/metrics.json                 held-out metrics of every model + index top-1
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pipelines.multitask.config import PipelineConfig
from pipelines.multitask.data import prepare_data
from pipelines.multitask.distil import run_distillation
from pipelines.multitask.encode import run_index
from pipelines.multitask.evaluate import run_evaluation
from pipelines.multitask.train import as_dict, run_training

PIPELINE_FILE = "pipeline.json"
UNTRAINED, TRAINED, SERVED = "untrained", "multitask", "served"


def run_pipeline(cfg: PipelineConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage (see the module docstring); returns what `pipeline.json` holds."""
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    data = prepare_data(cfg)
    seconds["data"] = time.perf_counter() - clock
    log(f"data: {data.sizes} usable rows per task (dropped {data.dropped})")

    clock = time.perf_counter()
    trained = run_training(cfg, data)
    seconds["train"] = time.perf_counter() - clock
    log(f"train: {trained.steps_per_task} steps per task on {cfg.scaling.num_workers} worker(s) -> {trained.model_dir}")

    models = {UNTRAINED: data.init_model, TRAINED: trained.model_dir}
    served, distillation = trained.model_dir, {}
    if cfg.recipe.student.enabled:
        clock = time.perf_counter()
        served, distillation = run_distillation(cfg.recipe, trained.model_dir, data.sets, out,
                                                cfg.scaling.cpus_per_worker)
        seconds["distil"] = time.perf_counter() - clock
        models[SERVED] = served
        log(f"distil: {distillation}")

    clock = time.perf_counter()
    encoded = run_index(served, data.sets, cfg.index, out, log=log)
    seconds["encode"] = time.perf_counter() - clock

    clock = time.perf_counter()
    summary = {"stages": ["data", "train", *(["distil"] if cfg.recipe.student.enabled else []), "encode", "evaluate"],
               "data": data.summary, "train": as_dict(trained), "distillation": distillation,
               "encode": {"manifest": str(encoded.manifest_path), "documents": encoded.num_docs,
                          "shards": len(encoded.shards_written) + len(encoded.shards_skipped)},
               "config": cfg.to_dict()}
    metrics = run_evaluation(cfg.recipe, models, served, str(encoded.manifest_path), data.sets,
                             cfg.index.top_k, out, {"train_loss": summary["train"]["loss"]},
                             cfg.scaling.cpus_per_worker)
    seconds["evaluate"] = time.perf_counter() - clock
    summary.update(seconds=seconds, metrics=str(out / "metrics.json"))
    (out / PIPELINE_FILE).write_text(json.dumps(summary, indent=1, default=str))
    log(f"evaluate: index top-1 {metrics['index']['index_xling_top1']:.3f}; "
        + "; ".join(f"{name} xling_top1 {row['xling_top1']:.3f}" for name, row in metrics["rows"].items()))
    return summary
