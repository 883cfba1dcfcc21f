"""Data stage: the recipe's sources -> one Parquet dataset per task -> Ray Data -> `TaskMixer`.

`prepare_data(cfg)` (driver):
1. the train / held-out sets: synthetic (`madr.recipes.multitask.data.build_data`) or, with `real_data:`, the
   real files (`madr.data.sources.real_multilingual.load_real_multilingual`, whose held-out splits never
   share a query, premise or English sentence with training; it stops at a bad row naming the file, row
   and field, and counts the rows it skips: SNLI without consensus, training rows of held-out queries);
   with `data.clicks`, a raw click log's debiased (query, document) pairs replace the training click records
   (`madr.recipes.multitask.click_log`: examination curve, quarantine and report under `data/clicks/`, the
   click summary in `data_summary.json` under `clicks`);
2. the tokenizer (`build_tokenizer`: the backbone's own, or a WordPiece trained on the training text) and the
   untrained encoder (`build_encoder`, weights from the seed), saved with `BiEncoder.save` as `init_model/`:
   every train worker starts from these same weights and this tokenizer;
3. each enabled task's *usable* records (`usable_records`: clicked pairs, no contradictions; the others are
   counted as `dropped`), in a seeded shuffled order, written as Parquet in the task's normalised schema
   (`pipelines.multitask.records`) under `data/<task>/`;
4. the sets themselves (training and held-out, every record) under `sets/<set>.parquet`, and what the stage
   wrote in `data_summary.json`: the later stages read these (`read_data_stage`), so each stage can run as its
   own process (`pipelines.multitask.stage`).

`mixer(...)` then reads them as Ray Data datasets and mixes them with `pipelines.data.mixing.TaskMixer` in the
schedule of `schedule:` (proportional by default, paper 004 Sec. III-B: one task per batch, every row once
per epoch), sharded over the train workers.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from madr.data.records import MultilingualData
from madr.recipes.multitask.data import build_data
from madr.recipes.multitask.encoders import build_encoder, build_tokenizer, make_tasks, task_records
from madr.recipes.multitask.trainer import usable_records
from pipelines.multitask.config import PipelineConfig
from pipelines.multitask.records import read_records, records_table

DATA_DIR, INIT_MODEL, SUMMARY, SETS_DIR = "data", "init_model", "data_summary.json", "sets"
SET_TASKS = {"clicks_train": "click", "clicks_eval": "click", "nli_train": "nli", "nli_eval": "nli",
             "parallel_train": "translation", "parallel_eval": "translation"}  # MultilingualData field -> schema
ROWS_PER_FILE = 50_000


@dataclass
class DataStage:
    """What the data stage wrote: per-task row counts (usable), rows dropped, the init model, and the sets
    (held-out for the evaluation, training texts for the distillation)."""

    task_dirs: dict[str, str]
    sizes: dict[str, int]
    dropped: dict[str, int]
    init_model: str
    sets: MultilingualData
    summary: dict[str, Any] = field(default_factory=dict)


def load_sets(cfg: PipelineConfig) -> MultilingualData:
    """Synthetic sets, or the real files of `real_data:` (paths against the current directory)."""
    if cfg.real_data is None:
        return build_data(cfg.recipe)
    from madr.data.sources.real_multilingual import load_real_multilingual

    real = dataclasses.replace(cfg.real_data, data_dir=str(Path(cfg.real_data.data_dir).resolve()))
    return load_real_multilingual(real)


def with_click_log(cfg: PipelineConfig, sets: MultilingualData) -> tuple[MultilingualData, dict[str, Any] | None]:
    """`sets` with `data.clicks`' records as the training clicks (None: no click log configured)."""
    clicks = cfg.recipe.data.clicks
    if clicks is None:
        return sets, None
    from madr.recipes.multitask.click_log import CLICKS_DIR, apply_click_log

    local = "://" not in clicks.path and Path(clicks.path).exists()
    clicks = dataclasses.replace(clicks, path=str(Path(clicks.path).resolve()) if local else clicks.path)
    return apply_click_log(sets, clicks, cfg.output_dir / CLICKS_DIR, cfg.recipe.tasks.click.field_order[0])


def _resolve_backbone(cfg: PipelineConfig) -> None:
    """A relative backbone path that exists here -> absolute (workers and tasks may run elsewhere)."""
    b = cfg.recipe.model.backbone
    if b.name_or_path and not b.name_or_path.startswith("pypi:") and Path(b.name_or_path).exists():
        b.name_or_path = str(Path(b.name_or_path).resolve())


def write_task(records: list[Any], task: str, out: Path, seed: int) -> int:
    """`records` shuffled with `seed` as `part-*.parquet` files under `out` (replacing any)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet"):
        old.unlink()
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    for part, start in enumerate(range(0, len(order), ROWS_PER_FILE)):
        rows = [records[i] for i in order[start:start + ROWS_PER_FILE]]
        pq.write_table(records_table(rows, task), out / f"part-{part:05d}.parquet")
    return len(records)


def write_sets(sets: MultilingualData, out: Path) -> None:
    """Every set of `sets` as `<out>/<set>.parquet` in its task's schema, in its order."""
    out.mkdir(parents=True, exist_ok=True)
    for name, task in SET_TASKS.items():
        pq.write_table(records_table(getattr(sets, name), task), out / f"{name}.parquet")


def read_sets(out: Path) -> MultilingualData:
    """The sets `write_sets` wrote under `out`."""
    return MultilingualData(**{name: read_records(str(out / f"{name}.parquet"), task)
                               for name, task in SET_TASKS.items()})


def prepare_data(cfg: PipelineConfig) -> DataStage:
    """Steps 1-4 of the module docstring; `data_summary.json` under the output directory."""
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    _resolve_backbone(cfg)
    recipe = cfg.recipe
    sets, clicks = with_click_log(cfg, load_sets(cfg))
    tokenizer = build_tokenizer(recipe, sets, out)
    model = build_encoder(recipe, tokenizer, recipe.seed)
    model.save(out / INIT_MODEL)
    dirs, sizes, dropped = {}, {}, {}
    for name, task in make_tasks(recipe, model, recipe.tasks.enabled, recipe.seed).items():
        records = task_records(sets, name)
        kept = usable_records(task, records)
        dropped[name] = len(records) - len(kept)
        if not kept:
            raise ValueError(f"task {name!r} has no usable training record (dropped {dropped[name]})")
        dirs[name] = str(out / DATA_DIR / name)
        sizes[name] = write_task(kept, name, Path(dirs[name]), recipe.seed)
    write_sets(sets, out / SETS_DIR)
    summary = {"sizes": sizes, "dropped": dropped, "sets": sets.sizes(),
               "source": "real" if cfg.real_data is not None else "synthetic",
               **({"real": sets.summary} if hasattr(sets, "summary") else {}),
               **({"clicks": clicks} if clicks is not None else {}),
               "task_dirs": dirs, "init_model": str(out / INIT_MODEL)}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))
    return DataStage(dirs, sizes, dropped, str(out / INIT_MODEL), sets, summary)


def read_data_stage(cfg: PipelineConfig) -> DataStage:
    """What `prepare_data` wrote under `output_dir` (a ValueError naming the file when the stage has not run)."""
    path = cfg.output_dir / SUMMARY
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the data stage first")
    summary = json.loads(path.read_text())
    return DataStage(dict(summary["task_dirs"]), dict(summary["sizes"]), dict(summary["dropped"]),
                     str(summary["init_model"]), read_sets(cfg.output_dir / SETS_DIR), summary)


def task_datasets(stage: DataStage, materialize: bool = False) -> dict[str, Any]:
    """One Ray Data dataset per task, in the order of `tasks.enabled` (what "sequential" reads): lazy
    (streamed while training), or read into the object store now with `materialize`."""
    import ray

    datasets = {name: ray.data.read_parquet(path) for name, path in stage.task_dirs.items()}
    return {name: ds.materialize() for name, ds in datasets.items()} if materialize else datasets


def needs_materialize(cfg: PipelineConfig) -> bool:
    """`scaling.materialize`, or when None: whether the train workers leave less than one CPU free."""
    if cfg.scaling.materialize is not None:
        return cfg.scaling.materialize
    import ray

    free = ray.cluster_resources().get("CPU", 0.0) - cfg.scaling.num_workers * cfg.scaling.cpus_per_worker
    return free < 1.0


def mixer(cfg: PipelineConfig, stage: DataStage) -> Any:
    """The `TaskMixer` of the recipe's schedule over the task datasets, sharded over `scaling.num_workers`."""
    from pipelines.data.mixing import TaskMixer

    s = cfg.recipe.schedule
    weights = None if s.weights is None else {k: v for k, v in s.weights.items() if k in stage.sizes}
    return TaskMixer(task_datasets(stage, needs_materialize(cfg)), batch_size=s.batch_size, mode=s.mode, weights=weights,
                     seed=cfg.recipe.seed, drop_last=s.drop_last, stopping_condition=s.stopping_condition,
                     sizes=stage.sizes, shuffle_buffer=cfg.scaling.shuffle_buffer,
                     world_size=cfg.scaling.num_workers, split=cfg.scaling.split)
