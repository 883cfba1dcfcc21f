"""What `plan` and `pipeline` check before any stage runs: the run config as every stage will read it.

Each stage reads the experiment YAML (typed: `madr.config.ExperimentConfig`; unknown keys, values of the wrong type
and combinations a job would refuse fail naming their dotted path, in every section: `encode:`, `evaluate:`,
`serve:` and `distributed:` are checked against the job settings the experiment implies, `madr.job_settings`). Here,
besides: what only some stages read (the mining job's derived config, a Serve settings file named by
`serve.config`, the `search:` settings the built index can serve), and a backbone or input that cannot be
resolved on this machine; each fails now, naming the key, instead of after training. `not_applicable` says which stages the
recipe leaves out (a training stage with 0 steps or epochs, a tune stage with no BM25 part to fuse, a baseline no
reference asks for).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from madr.config import ExperimentConfig, from_dict
from madr.job_settings import SERVE_FILE_KEY


def experiment(data: Mapping[str, Any], where: str = "") -> ExperimentConfig:
    """The typed experiment of a parsed YAML mapping (`where` names the file in errors)."""
    try:
        return from_dict(ExperimentConfig, dict(data))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: {err}" if where else str(err)) from None


OPTIONAL_IN_RECIPE = ("pretrain", "finetune", "distill", "aspects", "tune", "baseline")  # a recipe may leave them out


def not_applicable(stage: str, data: Mapping[str, Any], where: str = "") -> str | None:
    """Why the recipe of the experiment `data` (parsed YAML, from file `where`) leaves stage `stage` out (None:
    it runs)."""
    if stage not in OPTIONAL_IN_RECIPE:
        return None
    cfg = experiment(data, where)
    if stage in ("pretrain", "finetune", "distill") and getattr(cfg.train, stage).steps == 0:
        return f"train.{stage}.steps is 0"
    if stage == "aspects" and cfg.train.aspects.epochs == 0:
        return "train.aspects.epochs is 0"
    if stage == "tune":
        if not cfg.tune.enabled:
            return "tune.enabled is false"
        if cfg.index.lexical is None:
            return "index.lexical is null: no BM25 part to fuse"
    if stage == "baseline":
        from pipelines.jobs.experiment import has_baseline

        if "untrained" not in cfg.eval.references:
            return "eval.references has no untrained"
        if not has_baseline(cfg):
            return "no training stage runs: the model is the untrained backbone"
    return None


def check_backbone(cfg: ExperimentConfig) -> None:
    """The model's backbone can be resolved on this machine (a `pypi:` package installed, a path present, or a
    hub name where the hub is allowed); a clear error naming `model.backbone.name_or_path` otherwise."""
    from madr.modeling.backbone import check_backbone_name

    name = cfg.model.backbone.name_or_path
    if name is not None and cfg.model.has_backbone:
        try:
            check_backbone_name(name)
        except ValueError as err:
            raise ValueError(f"model.backbone.name_or_path: {err}") from None


def check_inputs(cfg: ExperimentConfig) -> None:
    """The data stage's local inputs exist here (`data.catalog_dir`, the click log of `data.clicks`); URIs and a
    cluster's paths are its nodes' to read."""
    from pathlib import Path

    paths = {"data.catalog_dir": cfg.data.catalog_dir}
    if cfg.data.clicks is not None:
        paths.update({"data.clicks.path": cfg.data.clicks.path, "data.clicks.queries": cfg.data.clicks.queries})
    for key, path in paths.items():
        if path and "://" not in str(path) and not Path(path).exists():
            raise ValueError(f"{key}: {path} does not exist")


def check_search(cfg: ExperimentConfig) -> None:
    """`search:` settings the index the experiment builds can serve: a sharded SPLADE-hybrid index interpolates
    unnormalised scores (a document's score must not depend on its shard), so it takes no normalisation."""
    sparse_hybrid = cfg.model.has_sparse and cfg.index.lexical is None
    if sparse_hybrid and cfg.search.normalisation not in (None, "none"):
        raise ValueError(f"search.normalisation: {cfg.search.normalisation!r} cannot be served by the sharded hybrid "
                         f"(dense + SPLADE) index of model {cfg.model.name!r}; use none or null")


def check_stages(cfg: ExperimentConfig, stages: Sequence[str], backbone: bool = True) -> None:
    """What the named stages need beyond what loading the experiment checks (module docstring); `backbone`: also
    check that the backbone resolves here (not when the stages run on a cluster, whose nodes install their own)."""
    from pipelines.jobs import experiment as derive

    if any(s in stages for s in ("encode", "mine", "evaluate", "deploy")):
        check_search(cfg)
    if backbone and any(s in stages for s in ("data", "pretrain", "finetune", "distill", "baseline")):
        check_backbone(cfg)
    if backbone and "data" in stages:
        check_inputs(cfg)
    if "mine" in stages:
        from pipelines.mine.job import MineConfig

        from_dict(MineConfig, derive.mine_settings(cfg), "mine.")
    if SERVE_FILE_KEY in cfg.serve:  # a Serve settings file of its own, merged under the section's keys
        from serve.config import settings_from_dict

        settings_from_dict(derive.serve_args(cfg))


def check_config(configs: Mapping[str, Mapping[str, Any]], paths: Mapping[str, str], stages: Sequence[str],
                 backbone: bool = True) -> None:
    """Every named stage's config (`configs[stage]`, read from `paths[stage]`) as the stage will load it."""
    by_path: dict[str, list[str]] = {}
    for stage in stages:
        by_path.setdefault(paths[stage], []).append(stage)
    for path, names in by_path.items():
        cfg = experiment(configs[names[0]], path)
        try:
            check_stages(cfg, names, backbone)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: {err}") from None
