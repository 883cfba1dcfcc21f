"""The multilingual multi-task recipe (paper 004) as a stage table of `python -m pipelines.jobs`.

Each stage is `python -m pipelines.multitask.stage NAME --config <yaml>` (`pipelines.multitask.run`): data
(sources -> usable rows per task, the sets, the untrained encoder) -> train (the multi-task teacher on Ray Train,
proportional task sampling, Sec. III-B) -> distil (the query student of Sec. V-A; left out without
`student.enabled`) -> encode (the held-out English candidates through the served encoder into FAISS shards) ->
evaluate (`metrics.json`) -> deploy (optional: the Serve app over that index and the served encoder; its
`serve:` section may ask for the int8 onnxruntime query tower, `encoder_precision: int8`).

The config is `pipelines.multitask.config.PipelineConfig` (unknown keys fail naming their dotted path);
`check` loads it as every stage will, and checks the backbone, the real data, the click log and the Serve settings here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipelines.jobs.stages import Stage

MODULE = "pipelines.multitask.stage"
_LATER = ("eval", "index", "serve")  # sections read only from the encode stage on
STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("data", MODULE, ("data", "--config", "{config}"),
          ignores=("steps", "schedule", "optimizer", "student", "scaling", *_LATER),
          help="sources (synthetic or real_data:) -> usable rows per task as Parquet, the sets, the untrained "
               "encoder and its tokenizer (paper 004 Sec. III-A)"),
    Stage("train", MODULE, ("train", "--config", "{config}"), ignores=("student", *_LATER),
          help="the multi-task teacher on Ray Train: clicks + NLI + translation, proportional task sampling "
               "(paper 004 Sec. III-B, Eq. 1-7)"),
    Stage("distil", MODULE, ("distil", "--config", "{config}"), ignores=_LATER,
          help="the query student distilled from the teacher (paper 004 Sec. V-A)"),
    Stage("encode", MODULE, ("encode", "--config", "{config}"), ignores=("eval", "serve"),
          help="held-out English candidates -> FAISS shards + manifest (pipelines.encode)"),
    Stage("evaluate", MODULE, ("evaluate", "--config", "{config}"), ignores=("serve",),
          reads=("serve.encoder_backend", "serve.encoder_precision"),
          help="click NDCG, NLI AUC, cross-lingual top-1 of every encoder and through the index, the served query "
               "tower (serve: encoder_backend / encoder_precision) paired with fp32 -> metrics.json"),
    Stage("deploy", "serve", (), kind="deploy", optional=True,
          help="deploy the Ray Serve app over the index and the served encoder"),
)}


def config(data: Mapping[str, Any], where: str = "") -> Any:
    """The typed `PipelineConfig` of a parsed YAML mapping (`where` names the file in errors)."""
    from pipelines.multitask.config import pipeline_config

    return pipeline_config(dict(data), where or "<config>")


def not_applicable(stage: str, data: Mapping[str, Any], where: str = "") -> str | None:
    """Why the config `data` leaves stage `stage` out (None: it runs)."""
    if stage == "distil" and not config(data, where).recipe.student.enabled:
        return "student.enabled is false"
    return None


def serve_args(cfg: Any) -> dict[str, Any]:
    """The Serve app's args (`madr.serve_config.ServeSettings`): the encode stage's manifest (whose model is the
    served encoder) and the corpus's `text` field, under the config's `serve:` section."""
    from pipelines.multitask.encode import INDEX_DIR

    return {"manifest_path": str(cfg.output_dir / INDEX_DIR / "manifest.json"), "doc_text_field": "text",
            **cfg.serve}


def check(configs: Mapping[str, Mapping[str, Any]], paths: Mapping[str, str], stages: Sequence[str],
          here: bool = True) -> None:
    """Every named stage's config as the stage will load it; `here`: the stages run on this machine, so the
    backbone, `real_data.data_dir` and `data.clicks.path` must resolve here. A ValueError naming the file and the key otherwise."""
    for stage in stages:
        where = paths[stage]
        cfg = config(configs[stage], where)
        try:
            _check_one(cfg, stage, here)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{where}: {err}") from None


def _check_one(cfg: Any, stage: str, here: bool) -> None:
    if stage == "train" and cfg.recipe.steps < 1:
        raise ValueError(f"steps is {cfg.recipe.steps}: nothing to train")
    if here and stage == "data":
        name = cfg.recipe.model.backbone.name_or_path
        if name is not None:
            from madr.modeling.backbone import check_backbone_name

            try:
                check_backbone_name(name)
            except ValueError as err:
                raise ValueError(f"model.backbone.name_or_path: {err}") from None
        if cfg.real_data is not None and not Path(cfg.real_data.data_dir).exists():
            raise ValueError(f"real_data.data_dir: {cfg.real_data.data_dir} does not exist")
        clicks = cfg.recipe.data.clicks
        if clicks is not None and "://" not in clicks.path and not Path(clicks.path).exists():
            raise ValueError(f"data.clicks.path: {clicks.path} does not exist")
