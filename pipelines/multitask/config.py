"""The pipeline's YAML: the multi-task recipe (`madr.recipes.multitask.config.MultiTaskExperimentConfig`, top
level) plus what only the Ray run needs.

| section | dataclass | holds |
|---|---|---|
| (top level) | `MultiTaskExperimentConfig` | data sizes, model, tasks, schedule, optimiser, student, eval (paper 004) |
| `real_data:` | `madr.data.sources.real_multilingual.RealMultilingualConfig` | real files instead of synthetic data |
| `scaling:` | `ScalingConfig` | Ray Train workers, threads, checkpoint storage, runtime env |
| `index:` | `IndexSettings` | the encode stage's shards, FAISS factory and actors; search depth |
| `bench:` | (read, not required) | `pooling` and `freeze_word_embeddings` of the in-process e5 benchmark, so
  `configs/real/multitask_e5.yaml` trains the same recipe here; its other keys are that script's own |
| `serve:` | `madr.serve_config.ServeSettings` keys | the deploy stage's Serve args over the ones derived from the run
  (e.g. `encoder_backend: onnx`, `encoder_precision: int8`: the int8 query tower) |
| `recipe:` | `multilingual` | which stage table `python -m pipelines.jobs` runs (`pipelines.jobs.recipes`) |

Unknown keys are errors naming their dotted path (`madr.config.from_dict`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madr.config import from_dict
from madr.config_files import read_config_file
from madr.config_overrides import apply_overrides
from madr.data.sources.real_multilingual import RealMultilingualConfig
from madr.recipes.multitask.config import MultiTaskExperimentConfig

SPLITS = ("batch", "step")
RECIPE = "multilingual"
SECTIONS = ("recipe", "real_data", "scaling", "index", "bench", "serve")  # the top-level keys beside the recipe's
BENCH_KEYS = ("pooling", "freeze_word_embeddings")


@dataclass
class ScalingConfig:
    """How the train stage runs on Ray Train.

    `num_workers` data-parallel workers of `cpus_per_worker` CPUs (+1 GPU each with `use_gpu`); with more than
    one, torch DDP (gloo on CPU, nccl on GPU) synchronises the gradients. `split`: "batch" (every worker
    runs the same task at every step on its part of the global batch of `schedule.batch_size` rows: what DDP
    needs) or "step" (`pipelines.data.mixing`). In-batch negatives are each worker's own rows.
    `shuffle_buffer`: rows of the mixer's local shuffle buffer per task (0: the stream order, which the data
    stage already shuffled once with the seed). `torch_threads`: intra-op threads per worker (default: its
    CPUs). `storage_path` / `run_name`: where Ray Train keeps the run (default `<output_dir>/ray_results`,
    `<name>-multitask`). `runtime_env`: Ray runtime env of the workers (e.g. for `ray job submit`).
    `materialize`: read the task datasets into the object store before training starts instead of streaming
    them during it; None (default) does so only when the workers leave less than one CPU of the cluster free,
    because Ray Data's read tasks need one and would otherwise wait for the workers forever (a
    2-CPU Ray with 2 workers of 1 CPU hangs in the first batch).
    """

    num_workers: int = 1
    cpus_per_worker: float = 1.0
    use_gpu: bool = False
    torch_threads: int | None = None
    split: str = "batch"
    shuffle_buffer: int = 0
    storage_path: str | None = None
    run_name: str | None = None
    max_failures: int = 0
    log_every: int = 10
    materialize: bool | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.cpus_per_worker <= 0:
            raise ValueError(f"scaling: need num_workers >= 1 and cpus_per_worker > 0, got {self.num_workers}, "
                             f"{self.cpus_per_worker}")
        if self.split not in SPLITS:
            raise ValueError(f"scaling.split: {self.split!r} is not one of {', '.join(SPLITS)}")
        if self.shuffle_buffer < 0 or self.log_every < 1:
            raise ValueError("scaling: shuffle_buffer must be >= 0 and log_every >= 1")

    @property
    def threads(self) -> int:
        """Torch intra-op threads of a worker or stage task: `torch_threads`, else one per CPU it holds."""
        return self.torch_threads or max(1, int(self.cpus_per_worker))


@dataclass
class IndexSettings:
    """The encode stage (`pipelines.encode`): the held-out English candidates -> `num_shards` FAISS shards of
    `index_factory` with a manifest; `top_k`: the evaluate stage's search depth."""

    num_shards: int = 2
    index_factory: str = "Flat"
    batch_size: int = 128
    rows_per_read: int = 2048
    encode_actors: int = 1
    tokenize_actors: int = 1
    top_k: int = 10

    def __post_init__(self) -> None:
        for name in ("num_shards", "batch_size", "rows_per_read", "encode_actors", "tokenize_actors", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"index.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PipelineConfig:
    """One run of `python -m pipelines.multitask` (see the module docstring)."""

    recipe: MultiTaskExperimentConfig
    real_data: RealMultilingualConfig | None = None
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    index: IndexSettings = field(default_factory=IndexSettings)
    freeze_word_embeddings: bool = False
    serve: dict[str, Any] = field(default_factory=dict)

    @property
    def output_dir(self) -> Path:
        return Path(self.recipe.output_dir).resolve()

    def to_dict(self) -> dict[str, Any]:
        out = self.recipe.to_dict()
        if self.real_data is not None:
            out["real_data"] = dataclasses.asdict(self.real_data)
        out["scaling"] = dataclasses.asdict(self.scaling)
        out["index"] = dataclasses.asdict(self.index)
        out["bench"] = {"freeze_word_embeddings": self.freeze_word_embeddings, "pooling": self.recipe.model.pooling}
        out["serve"] = dict(self.serve)
        out["recipe"] = RECIPE
        return out


def check_serve_section(serve: Any) -> None:
    """The `serve:` section as the deploy stage will read it (`madr.serve_config.ServeSettings` over the args the run
    derives), checked at load so a typo fails before training, naming the dotted key."""
    if not isinstance(serve, dict):
        raise ValueError(f"serve: expected a mapping of Serve settings, got {serve!r}")
    derived = {"manifest_path", "doc_text_field"} & set(serve)
    if derived:
        raise ValueError(f"serve.{sorted(derived)[0]}: set by the run (the encode stage's index), not by the config")
    from madr.serve_config import ServeSettings

    from_dict(ServeSettings, {"manifest_path": "<the encode stage's manifest>", "doc_text_field": "text", **serve},
              "serve.")


def load_pipeline_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """The YAML at `path` (defaults when None) with dotted-key `overrides` (`--set a.b=value`) applied."""
    data, _ = read_config_file(path)
    return pipeline_config(apply_overrides(data, overrides or {}), str(path) if path is not None else "<config>")


def pipeline_config(data: dict[str, Any], where: str = "<config>") -> PipelineConfig:
    """The typed config of a parsed YAML mapping; errors name `where` and the dotted key."""
    data = dict(data)
    try:
        unknown = sorted(set(data) - set(SECTIONS) - {f.name for f in dataclasses.fields(MultiTaskExperimentConfig)})
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(unknown)}; known: the recipe's "
                             f"{', '.join(f.name for f in dataclasses.fields(MultiTaskExperimentConfig))} and "
                             f"the pipeline's {', '.join(SECTIONS)}")
        recipe_name = data.pop("recipe", RECIPE)
        if recipe_name != RECIPE:
            raise ValueError(f"recipe: {recipe_name!r} is not this config's recipe ({RECIPE})")
        real = data.pop("real_data", None)
        scaling = from_dict(ScalingConfig, data.pop("scaling", None), "scaling.")
        index = from_dict(IndexSettings, data.pop("index", None), "index.")
        bench = dict(data.pop("bench", None) or {})
        serve = data.pop("serve", None) or {}
        check_serve_section(serve)
        recipe = from_dict(MultiTaskExperimentConfig, data)
        real_cfg = None if real is None else from_dict(RealMultilingualConfig, real, "real_data.")
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    if bench.get("pooling"):
        recipe.model = dataclasses.replace(recipe.model, pooling=str(bench["pooling"]))
    return PipelineConfig(recipe, real_cfg, scaling, index, bool(bench.get("freeze_word_embeddings", False)),
                          dict(serve))
