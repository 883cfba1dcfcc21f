"""The recipe's stages, each reading what the stages before it wrote under `output_dir`, and `run_pipeline`: all of
them in order in this process, on the current Ray cluster.

Every stage is a function `(cfg, log) -> summary` over the module of its step (`data`, `train`, `distil`,
`encode`, `evaluate`); `python -m pipelines.multitask.stage NAME` runs one of them as its own process (the
stage table of `python -m pipelines.jobs` for `recipe: multilingual`), `python -m pipelines.multitask` runs them
all in one. The evaluate stage writes `pipeline.json` (what each stage did and how long it took) beside
`metrics.json`:

    <output_dir>/data/<task>/part-*.parquet   usable training rows per task (normalised task schema)
    <output_dir>/data/clicks/                 with data.clicks: the log's impressions, quarantine, examination
                                              curve (examination.json / .png) and report.json
    <output_dir>/sets/<set>.parquet           the training and held-out sets (read by distil, encode, evaluate)
    <output_dir>/data_summary.json            rows per task, rows dropped, set sizes (+ real-data counts)
    <output_dir>/init_model/                  the untrained encoder every worker starts from
    <output_dir>/ray_results/                 Ray Train's run (checkpoint)
    <output_dir>/model/                       the trained encoder (BiEncoder.save), train_history.json
    <output_dir>/served_model/                with student.enabled: the distilled serving towers
    <output_dir>/index/                       FAISS shards + manifest of the held-out English candidates
    <output_dir>/<stage>_summary.json         what the train, distil and encode stages did
    <output_dir>/metrics.json                 held-out metrics of every model + index top-1
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.multitask.config import PipelineConfig
from pipelines.multitask.data import SUMMARY, prepare_data, read_data_stage
from pipelines.multitask.distil import SERVED_MODEL, run_distillation
from pipelines.multitask.encode import INDEX_DIR, run_index
from pipelines.multitask.evaluate import METRICS_FILE, run_evaluation
from pipelines.multitask.train import TRAINED_MODEL, as_dict, run_training

PIPELINE_FILE = "pipeline.json"
UNTRAINED, TRAINED, SERVED = "untrained", "multitask", "served"
Log = Callable[[str], None]


def summary_path(cfg: PipelineConfig, stage: str) -> Path:
    """Where stage `stage` records what it did (the data stage: `data_summary.json`)."""
    return cfg.output_dir / (SUMMARY if stage == "data" else f"{stage}_summary.json")


def read_summary(cfg: PipelineConfig, stage: str) -> dict[str, Any]:
    path = summary_path(cfg, stage)
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the {stage} stage first")
    return json.loads(path.read_text())


def _write(cfg: PipelineConfig, stage: str, summary: dict[str, Any], started: float) -> dict[str, Any]:
    summary = {**summary, "seconds": time.perf_counter() - started}
    summary_path(cfg, stage).write_text(json.dumps(summary, indent=1, default=str))
    return summary


def served_model(cfg: PipelineConfig) -> str:
    """The encoder that is indexed and served: the distilled towers with `student.enabled`, else the trained
    one (paper 004 Sec. V-A)."""
    return str(cfg.output_dir / (SERVED_MODEL if cfg.recipe.student.enabled else TRAINED_MODEL))


def data_stage(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Sources -> usable rows per task, the sets and the untrained encoder (`pipelines.multitask.data`)."""
    started = time.perf_counter()
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    data = prepare_data(cfg)
    log(f"data: {data.sizes} usable rows per task (dropped {data.dropped})")
    return _write(cfg, "data", data.summary, started)


def train_stage(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """The multi-task teacher on Ray Train over the data stage's mixed rows (`pipelines.multitask.train`)."""
    started = time.perf_counter()
    trained = run_training(cfg, read_data_stage(cfg))
    log(f"train: {trained.steps_per_task} steps per task on {cfg.scaling.num_workers} worker(s) -> {trained.model_dir}")
    return _write(cfg, "train", as_dict(trained), started)


def distil_stage(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """The query student of Sec. V-A distilled from the trained teacher (`pipelines.multitask.distil`)."""
    if not cfg.recipe.student.enabled:
        raise ValueError("student.enabled is false: the recipe has no distil stage")
    started = time.perf_counter()
    data = read_data_stage(cfg)
    served, report = run_distillation(cfg.recipe, str(cfg.output_dir / TRAINED_MODEL), data.sets, cfg.output_dir,
                                      cfg.scaling.cpus_per_worker, cfg.scaling.threads)
    log(f"distil: {report}")
    return _write(cfg, "distil", {"served_model": served, "report": report}, started)


def encode_stage(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """The held-out English candidates through the served encoder into FAISS shards (`pipelines.multitask.encode`)."""
    started = time.perf_counter()
    encoded = run_index(served_model(cfg), read_data_stage(cfg).sets, cfg.index, cfg.output_dir, log=log)
    return _write(cfg, "encode", {"manifest": str(encoded.manifest_path), "documents": encoded.num_docs,
                                  "shards": len(encoded.shards_written) + len(encoded.shards_skipped)}, started)


def evaluate_stage(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Held-out metrics of every encoder and top-1 through the index (`pipelines.multitask.evaluate`);
    `metrics.json` and `pipeline.json`."""
    started = time.perf_counter()
    out = cfg.output_dir
    data = read_data_stage(cfg)
    train = read_summary(cfg, "train")
    distil = read_summary(cfg, "distil") if cfg.recipe.student.enabled else {}
    encode = read_summary(cfg, "encode")
    models = {UNTRAINED: data.init_model, TRAINED: str(out / TRAINED_MODEL),
              **({SERVED: served_model(cfg)} if cfg.recipe.student.enabled else {})}
    metrics = run_evaluation(cfg.recipe, models, served_model(cfg), str(out / INDEX_DIR / "manifest.json"),
                             data.sets, cfg.index.top_k, out, {"train_loss": train["loss"]},
                             cfg.scaling.cpus_per_worker, cfg.scaling.threads, cfg.serve)
    seconds = {"data": data.summary.get("seconds"), "train": train.pop("seconds"),
               **({"distil": distil.pop("seconds")} if distil else {}), "encode": encode.pop("seconds"),
               "evaluate": time.perf_counter() - started}
    summary = {"stages": stage_names(cfg), "data": data.summary, "train": train,
               "distillation": distil.get("report", {}), "encode": encode, "config": cfg.to_dict(),
               "seconds": seconds, "metrics": str(out / METRICS_FILE)}
    (out / PIPELINE_FILE).write_text(json.dumps(summary, indent=1, default=str))
    log(f"evaluate: index top-1 {metrics['index']['index_xling_top1']:.3f}; "
        + "; ".join(f"{name} xling_top1 {row['xling_top1']:.3f}" for name, row in metrics["rows"].items()))
    if tower := metrics.get("served_tower"):
        auc, top1 = tower["click_auc_minus_fp32"], tower["index_top1_minus_fp32"]
        log(f"evaluate: served query tower ({tower['encoder_backend']} {tower['encoder_precision']}) minus fp32: "
            f"click AUC {auc['diff']:+.4f} (p {auc['p_bootstrap']:.3f}), index top-1 {top1['diff']:+.4f} "
            f"(p {top1['p_randomisation']:.3f})")
    return summary


STAGES: dict[str, Callable[[PipelineConfig, Log], dict[str, Any]]] = {
    "data": data_stage, "train": train_stage, "distil": distil_stage, "encode": encode_stage,
    "evaluate": evaluate_stage}
NEEDS_RAY = ("train", "distil", "encode", "evaluate")  # the data stage writes Parquet with pyarrow alone


def stage_names(cfg: PipelineConfig) -> list[str]:
    """The stages this config runs, in order (distil only with `student.enabled`)."""
    return [name for name in STAGES if name != "distil" or cfg.recipe.student.enabled]


def run_pipeline(cfg: PipelineConfig, log: Log = print) -> dict[str, Any]:
    """Run every stage in this process (see the module docstring); returns what `pipeline.json` holds."""
    summary: dict[str, Any] = {}
    for name in stage_names(cfg):
        summary = STAGES[name](cfg, log)
    return summary
