"""The settings each job of the pipeline runs with, as one experiment (`madr.config.ExperimentConfig`) implies them.

The encode, evaluate and mine jobs each have their own config (`madr.encode_config.EncodeConfig`,
`madr.evaluate_config.EvaluateConfig`, `pipelines.mine.job.MineConfig`) and the deploy stage its Serve settings
(`madr.serve_config.ServeSettings`); inside the pipeline their values follow from the experiment (the paths of
`madr.layout`, `index:`, `eval:`, `search:`), and the experiment's `encode:` / `evaluate:` / `serve:` sections
override single keys. `check_sections` checks those sections, and `distributed:` (`madr.distributed_config`),
against the one definition of their keys when the experiment loads: an unknown key, a value of the wrong type or
a combination the job would refuse is an error naming its dotted key, before any stage runs.
`pipelines.jobs.experiment` writes these settings to the jobs' config files.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from madr.config import check_types, from_dict
from madr.layout import RunLayout
from madr.search.params import SearchParams
from madr.storage import is_uri

if TYPE_CHECKING:
    from madr.config import ExperimentConfig

DISPLAY = ["title"]


def _merge(derived: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`derived` with the keys of `overrides` set (a mapping over a mapping key by key)."""
    out = dict(derived)
    for key, value in overrides.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _abs(path: Path) -> str:
    return str(path.resolve())


def encode_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The corpus of the data stage -> `index.num_shards` shards of `index.index_factory` (+ sparse for hybrid
    models), encoded by the export of `index.model_stage`."""
    layout = RunLayout.of(cfg)
    derived = {"input": [_abs(layout.corpus)], "output": _abs(layout.index),
               "model_dir": _abs(layout.model(cfg.index.model_stage)), "id_column": "doc_id",
               "text_columns": ["title", "description"], "display_columns": DISPLAY + list(cfg.model.aspects),
               "external_id_column": "product_id", "num_shards": cfg.index.num_shards,
               "index_factory": cfg.index.index_factory, "max_length": cfg.model.max_doc_length,
               "lexical": cfg.index.lexical, "fusion_lambda": cfg.index.fusion_lambda,
               "lexical_tokenizer": cfg.index.lexical_tokenizer, "sparse_backend": cfg.index.sparse_backend,
               "aspect_top_k": cfg.index.aspect_top_k,
               "replace_other_job": True}  # the pipeline reran this stage: a changed model or corpus rebuilds
    docs = _corpus_size(layout)
    if docs:  # pieces small enough that every shard gets rows (a piece never spans two shards)
        derived["rows_per_read"] = max(1, min(2048, docs // cfg.index.num_shards))
    return _merge(derived, cfg.encode)


def baseline_encode_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """`encode_settings` for the baseline stage: the same corpus, shards and BM25 part, encoded by the untrained
    model (`<output_dir>/baseline/model`) into `<output_dir>/baseline/index`."""
    layout = RunLayout.of(cfg)
    return {**encode_settings(cfg), "model_dir": _abs(layout.baseline_model), "output": _abs(layout.baseline_index)}


def _corpus_size(layout: RunLayout) -> int | None:
    try:
        return int(json.loads((layout.data / "summary.json").read_text())["counts"]["corpus"])
    except (OSError, ValueError, KeyError):
        return None


def _search(cfg: ExperimentConfig) -> dict[str, Any]:
    """A run (`madr.search.spec.SearchSpec`) over the experiment's index with its `search:` settings."""
    return {"name": cfg.model.name, "index": _abs(RunLayout.of(cfg).manifest), "search": _search_settings(cfg)}


REFERENCE_LAMBDA = {"bm25": 0.0, "dense": 1.0}  # eval.references: one half of the dense + BM25 fusion
ASPECT_REFERENCES = {"aspect_filter": "filter", "aspect_boost": "boost"}  # eval.references: aspect-aware retrieval


def _references(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """`eval.references`: for an index with a BM25 part, the same index searched by one half of its fusion
    (bm25, dense; without the aspect-match score); the baseline stage's index of the untrained backbone
    (untrained), searched as it was tuned; for an index with aspect data, the same index without the aspect-match
    score (no_aspects: what the aspects add), and that index filtered / boosted by the queries' predicted values
    (aspect_filter, aspect_boost)."""
    run, runs = _search(cfg), []
    for ref in cfg.eval.references:
        if ref == "untrained":
            if has_baseline(cfg):
                runs.append({**run, "name": untrained_name(cfg), "index": _abs(RunLayout.of(cfg).baseline_manifest)})
        elif ref == "no_aspects":
            if has_aspect_data(cfg):
                runs.append({**run, "name": f"{cfg.model.name}-no-aspects",
                             "search": {**run["search"], "aspect_weight": 0.0}})
        elif ref in ASPECT_REFERENCES:
            if has_aspect_data(cfg):
                runs.append({**run, "name": f"{cfg.model.name}-{ref.replace('_', '-')}",
                             "aspect_filter": ASPECT_REFERENCES[ref], "aspect_confidence": cfg.eval.aspect_confidence})
        elif cfg.index.lexical is not None:
            runs.append({**run, "name": ref if ref == "bm25" else f"{cfg.model.name}-{ref}",
                         "search": {**run["search"], "lam": REFERENCE_LAMBDA[ref], "aspect_weight": 0.0}})
    return runs


def has_aspect_data(cfg: ExperimentConfig) -> bool:
    """Whether the encode stage stores the products' aspect values: the indexed model predicts aspects (an aspect
    model, or the aspects stage's heads) and `index.aspect_top_k` keeps some."""
    heads = cfg.model.learns_aspects or cfg.index.model_stage == "aspects"
    return heads and bool(cfg.model.aspects) and cfg.index.aspect_top_k > 0


def has_baseline(cfg: ExperimentConfig) -> bool:
    """Whether the baseline stage indexes the untrained backbone: asked for by `eval.references` and some
    training stage runs (otherwise the model is the untrained backbone)."""
    trains = any(getattr(cfg.train, kind).steps > 0 for kind in ("pretrain", "finetune"))
    return "untrained" in cfg.eval.references and trains


def untrained_name(cfg: ExperimentConfig) -> str:
    return "untrained+bm25" if cfg.index.lexical is not None else "untrained"


def _search_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings the experiment's `search:` section sets (those that differ from `SearchParams`' defaults;
    k excepted: each stage sets its own depth), so that a stage's own file keeps the others."""
    default = SearchParams()
    return {f.name: getattr(cfg.search, f.name) for f in dataclasses.fields(SearchParams)
            if f.name != "k" and getattr(cfg.search, f.name) != getattr(default, f.name)}


def evaluate_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The evaluation split's queries and qrels against the index: the metrics of `eval:` (retrieval ones;
    judged graded relevance, `eval.relevance_threshold` for the binary ones) into `<output_dir>/evaluation`."""
    layout = RunLayout.of(cfg)
    metrics = list(dict.fromkeys([*cfg.eval.retrieval_metrics, "ndcg@10"]))
    derived = {"queries": _abs(layout.queries("eval")), "qrels": _abs(layout.qrels("eval")),
               "runs": [_search(cfg), *_references(cfg)], "output": _abs(layout.evaluation), "doc_key": "product_id",
               "qrels_doc_column": "product_id", "metrics": metrics, "k": cfg.eval.top_k,
               "relevance_threshold": cfg.eval.relevance_threshold, "gains": cfg.eval.gains}
    return _merge(derived, cfg.evaluate)


def mine_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """Hard negatives for the training queries: ranks 10-100 of the index minus the judged positives."""
    layout = RunLayout.of(cfg)
    return {"queries": _abs(layout.queries("train")), "positives": _abs(layout.qrels("train")),
            "run": _search(cfg), "output": _abs(layout.negatives), "doc_key": "product_id",
            "positives_doc_column": "product_id", "min_relevance": cfg.eval.relevance_threshold,
            "seed": cfg.train.seed, "text_column": "title"}


def serve_args(cfg: ExperimentConfig) -> dict[str, Any]:
    """The Serve application's args (`madr.serve_config.ServeSettings`) for this experiment's index."""
    manifest = (cfg.output_dir.rstrip("/") + "/index/manifest.json" if is_uri(cfg.output_dir)
                else _abs(RunLayout.of(cfg).manifest))  # a URI: each Serve host downloads it (madr.storage)
    derived: dict[str, Any] = {"manifest_path": manifest, "doc_text_field": "title"}
    if _search_settings(cfg):
        derived["search"] = _search_settings(cfg)
    return _merge(derived, cfg.serve)


def section_classes() -> dict[str, type]:
    """The class that defines the keys of each of the experiment's job sections."""
    from madr.distributed_config import DistributedConfig
    from madr.encode_config import EncodeConfig
    from madr.evaluate_config import EvaluateConfig
    from madr.serve_config import ServeSettings

    return {"distributed": DistributedConfig, "encode": EncodeConfig, "evaluate": EvaluateConfig,
            "serve": ServeSettings}


SERVE_FILE_KEY = "config"  # serve: {config: FILE}: a Serve settings YAML under the section's keys (serve.config)


def check_sections(cfg: ExperimentConfig) -> None:
    """Every key and value of the experiment's `distributed:`, `encode:`, `evaluate:` and `serve:` sections, checked
    against the class that defines them (`section_classes`), then the whole settings each job would run with
    (`encode_settings`, `evaluate_settings`, `serve_args`: the section over what the experiment implies), so a
    combination the job would refuse fails here too. Errors name the dotted key (`serve.max_k`). A `serve:` section
    that names a Serve settings file (`config`) has its own keys checked; the file is read where it is deployed."""
    classes = section_classes()
    for name, cls in classes.items():
        section = getattr(cfg, name)
        if not isinstance(section, dict):
            raise ValueError(f"{name}: expected a mapping of {cls.__name__} keys, got {type(section).__name__}")
        own = {k: v for k, v in section.items() if not (name == "serve" and k == SERVE_FILE_KEY)}
        check_types(cls, own, f"{name}.")
    if not isinstance(cfg.serve.get(SERVE_FILE_KEY, ""), str):
        raise ValueError(f"serve.{SERVE_FILE_KEY}: expected the path of a Serve settings YAML")
    from_dict(classes["distributed"], cfg.distributed, "distributed.")
    from_dict(classes["encode"], encode_settings(cfg), "encode.")
    from_dict(classes["evaluate"], evaluate_settings(cfg), "evaluate.")
    if SERVE_FILE_KEY not in cfg.serve:
        from_dict(classes["serve"], serve_args(cfg), "serve.")
