"""The driver of a training stage: prepare inputs, run Ray Train's `TorchTrainer`, export the model, plot.

`run_stage(cfg, kind)`:
1. prepare (driver, no Ray): the catalog (read, or generated under `<output_dir>/catalog`), the stage's
   starting model (pretrain: a new model with a tokenizer + aspect vocabularies built from the catalog;
   finetune: `init_from`, else the pretrain export when present, else new; distill: the teacher), and
   the stage's rows as Parquet (`pipelines.train.examples`);
2. fit: `TorchTrainer(train_loop_per_worker)` over `ScalingConfig(num_workers, use_gpu)`, gloo on CPU /
   nccl on GPU, the rows as the "train" dataset (streamed, split over workers), `CheckpointConfig
   (num_to_keep=keep_last)`, `FailureConfig(max_failures)`, the metrics callback, storage at
   `<storage_path>/<run_name>` (default run name: `default_run_name`, which hashes the data, model and
   train config): re-running the same stage with the same pair resumes from its latest
   checkpoint (Ray Train V2 resumes by run name, not `resume_from_checkpoint`);
3. export the final checkpoint's model to `<output_dir>/<stage>/model` (`BiEncoder.save` layout) and write
   `curves.png` and `result.json` beside it. TensorBoard: `tensorboard --logdir <output_dir>/<stage>/logs`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from madr.config import ExperimentConfig, config_hash
from madr.index.manifest import sha256_file
from madr.layout import RunLayout
from madr.recipes.aspects.experiment import (
    build_catalog_model,
    load_catalog,
    prepare_tokenizer,
    prepare_vocabularies,
)
from madr.recipes.aspects.experiment import catalog_dir as catalog_dir_of
from madr.training.loop import stage_negatives
from pipelines.runtime import exit_on_sigterm, start_reaper
from pipelines.train.config import distributed_config
from pipelines.train.examples import ROWS, finetune_rows, write_examples
from pipelines.train.loop import MODEL_DIR, JobSpec, train_loop_per_worker
from pipelines.train.metrics import MetricsLogger, plot_curves, read_history
from pipelines.train.trainer import TrainerSettings, torch_trainer

KINDS = ("pretrain", "finetune", "distill")


@dataclass
class StageResult:
    kind: str
    model_dir: str
    log_dir: str
    plot: str
    steps: int
    metrics: dict[str, Any]
    checkpoint: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stage_dir(cfg: ExperimentConfig, kind: str) -> Path:
    return Path(cfg.output_dir).resolve() / kind


def _absolute(cfg: ExperimentConfig) -> ExperimentConfig:
    cfg.output_dir = str(Path(cfg.output_dir).resolve())
    if cfg.data.catalog_dir:
        cfg.data.catalog_dir = str(Path(cfg.data.catalog_dir).resolve())
    storage = cfg.distributed.get("storage_path")
    if storage and "://" not in storage:
        cfg.distributed["storage_path"] = str(Path(storage).resolve())
    return cfg


def _starting_model(cfg: ExperimentConfig, kind: str, catalog: Any, out: Path) -> str:
    """The model directory a stage starts from (built and saved once when none is given)."""
    stage = getattr(cfg.train, kind)
    given = getattr(stage, "init_from", None)
    if given:
        return str(Path(given).resolve())
    previous = stage_dir(cfg, "pretrain") / "model"
    if kind == "finetune" and (previous / "config.json").is_file():
        return str(previous)
    init = out / "init_model"
    if not (init / "config.json").is_file():
        save_initial_model(cfg, catalog, init)
    return str(init)


def save_initial_model(cfg: ExperimentConfig, catalog: Any, path: Path) -> Path:
    """The model before any training (the backbone's weights, fresh heads from `train.seed`), saved to `path`."""
    torch.manual_seed(cfg.train.seed)
    tokenizer = prepare_tokenizer(cfg, catalog)
    model = build_catalog_model(cfg.model, catalog, tokenizer, prepare_vocabularies(cfg, catalog, tokenizer))
    model.save(path)
    return path


def _example_rows(cfg: ExperimentConfig, kind: str, catalog: Any):
    """The stage's training rows (`pipelines.train.examples.ROWS`); fine-tuning with `negatives: mined` mines its
    hard negatives with BM25 on the model's tokenizer first, with `negatives: index` reads the mine stage's output
    (`<output_dir>/mine/negatives.parquet`), as the in-process loop does (`madr.training.loop.stage_negatives`)."""
    stage = cfg.train.finetune
    if kind == "finetune" and stage.negatives != "judged":
        mined = stage_negatives(catalog, stage, prepare_tokenizer(cfg, catalog), "train", RunLayout.of(cfg).negatives)
        return finetune_rows(catalog, cfg.train.seed, mined=mined, judged_share=stage.judged_negative_share)
    return ROWS[kind](catalog, cfg.train.seed)


def _negatives_key(cfg: ExperimentConfig) -> list:
    """What the fine-tuning rows' hard negatives depend on: their source and depth, and for `negatives: index` the
    mine stage's file content (a new mining round writes new rows)."""
    stage, path = cfg.train.finetune, RunLayout.of(cfg).negatives
    digest = sha256_file(path) if stage.negatives == "index" and path.is_file() else None
    return [stage.negatives, stage.mined_depth, *([digest] if digest else [])]


def prepare_stage(cfg: ExperimentConfig, kind: str) -> JobSpec:
    """Everything the workers read, under `<output_dir>/<kind>` (see the module docstring, step 1)."""
    if kind not in KINDS:
        raise ValueError(f"--stage must be one of {', '.join(KINDS)}, got {kind!r}")
    distributed_config(cfg)  # a bad `distributed:` section fails here, before any work
    stage = getattr(cfg.train, kind)
    if stage.steps < 1:
        raise ValueError(f"train.{kind}.steps is {stage.steps}: nothing to train")
    cfg = _absolute(cfg)
    out = stage_dir(cfg, kind)
    out.mkdir(parents=True, exist_ok=True)
    catalog = load_catalog(cfg)
    catalog_dir = str(catalog_dir_of(cfg))
    spec = JobSpec(experiment=cfg.to_dict(), kind=kind, catalog_dir=catalog_dir,
                   drill_flag=str(out / "failure_drill.done"))
    if kind == "distill":
        teacher = Path(cfg.train.distill.teacher or stage_dir(cfg, "finetune") / "model").resolve()
        if not (teacher / "config.json").is_file():
            raise ValueError(f"train.distill.teacher: {teacher} is not a saved model (run --stage finetune first "
                             f"or set train.distill.teacher)")
        spec.teacher = str(teacher)
    else:
        spec.init_model = _starting_model(cfg, kind, catalog, out)
    fingerprint = config_hash({"data": asdict(cfg.data), "seed": cfg.train.seed, "kind": kind,
                               **({"negatives": _negatives_key(cfg)} if kind == "finetune" else {})})
    write_examples(kind, _example_rows(cfg, kind, catalog), out / "examples", fingerprint=fingerprint)
    return spec


def _ray_init(cfg: ExperimentConfig, address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    env = distributed_config(cfg).runtime_env or None
    if env and os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        # inside `ray job submit`: the job's runtime env and the config's are combined (config wins a key)
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
    if address:
        ray.init(address=address, runtime_env=env)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=env, include_dashboard=False)
    else:  # a local Ray of its own that ends with this driver (pipelines.runtime.init_ray)
        start_reaper()
        ray.init(address="local", runtime_env=env, include_dashboard=False)
        exit_on_sigterm()


def default_run_name(cfg: ExperimentConfig, kind: str) -> str:
    """`<name>-<stage>-<hash of data, model and train>`: a rerun of the same stage config resumes from its
    latest checkpoint, while a changed one (another learning rate, a retrained upstream stage's config)
    starts a run of its own instead of resuming a finished run of the old config."""
    return f"{cfg.name}-{kind}-{config_hash({'data': cfg.data, 'model': cfg.model, 'train': cfg.train})[:8]}"


def build_trainer(cfg: ExperimentConfig, spec: JobSpec) -> Any:
    """The `TorchTrainer` of a prepared stage (see the module docstring, step 2)."""
    from pipelines.train.data import read_examples, train_data_config

    d = distributed_config(cfg)
    out = stage_dir(cfg, spec.kind)
    settings = TrainerSettings(d.num_workers, d.use_gpu, d.cpus_per_worker, d.run_name or default_run_name(cfg, spec.kind),
                               d.storage_path or str(Path(cfg.output_dir) / "ray_results"), d.max_failures,
                               d.keep_last, d.runtime_env, d.placement_strategy)
    return torch_trainer(train_loop_per_worker, spec.to_dict(), settings, [MetricsLogger(str(out / "logs"))],
                         datasets={"train": read_examples(str(out / "examples"))},
                         dataset_config=train_data_config())


def run_stage(cfg: ExperimentConfig, kind: str, address: str | None = None) -> StageResult:
    """Prepare, fit and export one stage (see the module docstring)."""
    start = time.perf_counter()
    spec = prepare_stage(cfg, kind)
    cfg = _absolute(cfg)
    _ray_init(cfg, address)
    result = build_trainer(cfg, spec).fit()
    if result.error is not None:
        raise result.error
    out = stage_dir(cfg, kind)
    model_dir = out / "model"
    with result.checkpoint.as_directory() as ckpt:
        if model_dir.exists():
            shutil.rmtree(model_dir)
        shutil.copytree(Path(ckpt) / MODEL_DIR, model_dir)
    history = read_history(out / "logs")
    plot = plot_curves(out / "logs", out / "curves.png", title=f"{cfg.name}: {kind}")
    final = history[-1] if history else {}
    res = StageResult(kind, str(model_dir), str(out / "logs"), str(plot), int(final.get("step", 0)),
                      dict(result.metrics or {}), str(result.checkpoint.path), time.perf_counter() - start)
    (out / "result.json").write_text(json.dumps(res.to_dict(), indent=1, default=str))
    return res


def submit_command(config_path: str, kind: str, cfg: ExperimentConfig) -> str:
    """A `ray job submit` command line for this stage, with the config's runtime env (working dir = here)."""
    env = {"working_dir": ".", **distributed_config(cfg).runtime_env}
    return (f"RAY_AUTH_MODE=token ray job submit --runtime-env-json '{json.dumps(env)}' -- "
            f"python -m pipelines.train --config {config_path} --stage {kind}")
