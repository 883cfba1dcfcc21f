"""Run the index-side stages from the experiment YAML: `python -m pipelines.jobs.experiment STAGE --config X`.

The encode, evaluate and mine jobs each have their own config (`pipelines.encode.config.EncodeConfig`,
`pipelines.evaluate.job.EvaluateConfig`, `pipelines.mine.job.MineConfig`); inside the pipeline their
settings follow from the experiment (the paths of `madr.layout`, `index:`, `eval:`), and the experiment's
`encode:` / `evaluate:` sections override single keys. The derived config is written to
`<output_dir>/_stages/configs/<stage>.yaml` (what ran is on disk) and handed to the job's own CLI, so the
job behaves exactly as when run by hand with that file. `serve_args` does the same for the deploy stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from madr.config import ExperimentConfig, load_config
from madr.layout import RunLayout
from madr.search.params import SearchParams
from madr.storage import is_uri

DISPLAY = ["title"]


def _merge(derived: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
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
    """A run (`pipelines.evaluate.searcher.SearchSpec`) over the experiment's index with its `search:` settings."""
    return {"name": cfg.model.name, "index": _abs(RunLayout.of(cfg).manifest), "search": _search_settings(cfg)}


REFERENCE_LAMBDA = {"bm25": 0.0, "dense": 1.0}  # eval.references: one half of the dense + BM25 fusion


def _references(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """`eval.references`: for an index with a BM25 part, the same index searched by one half of its fusion
    (bm25, dense); the baseline stage's index of the untrained backbone (untrained), searched as it was tuned."""
    run, runs = _search(cfg), []
    for ref in cfg.eval.references:
        if ref == "untrained":
            if has_baseline(cfg):
                runs.append({**run, "name": untrained_name(cfg), "index": _abs(RunLayout.of(cfg).baseline_manifest)})
        elif cfg.index.lexical is not None:
            runs.append({**run, "name": ref if ref == "bm25" else f"{cfg.model.name}-{ref}",
                         "search": {**run["search"], "lam": REFERENCE_LAMBDA[ref]}})
    return runs


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


def split_dir(cfg: ExperimentConfig, split: str) -> str:
    """The data stage's folder of a query split: `eval` for `eval.split`, else the split's own name."""
    return "eval" if split == cfg.eval.split else split


def split_inputs(cfg: ExperimentConfig, split: str) -> tuple[Any, Any]:
    """(queries table, qrels by product id) of a split the data stage wrote; a clear error when it has none."""
    from pipelines.evaluate.io import read_qrels, read_queries

    layout = RunLayout.of(cfg)
    path = layout.queries(split_dir(cfg, split))
    if not path.is_file():
        raise ValueError(f"{path}: no {split!r} queries (run the data stage; the catalog's queries need a "
                         f"{split!r} split)")
    queries = read_queries(path)
    if queries.num_rows == 0:
        raise ValueError(f"{path}: the catalog has no {split!r} queries to tune on (tune.split)")
    return queries, read_qrels(layout.qrels(split_dir(cfg, split)), "product_id")


def mine_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """Hard negatives for the training queries: ranks 10-100 of the index minus the judged positives."""
    layout = RunLayout.of(cfg)
    return {"queries": _abs(layout.queries("train")), "positives": _abs(layout.qrels("train")),
            "run": _search(cfg), "output": _abs(layout.negatives), "doc_key": "product_id",
            "positives_doc_column": "product_id", "min_relevance": cfg.eval.relevance_threshold,
            "seed": cfg.train.seed, "text_column": "title"}


def serve_args(cfg: ExperimentConfig) -> dict[str, Any]:
    """The Serve application's args (`serve.config.ServeSettings`) for this experiment's index."""
    manifest = (cfg.output_dir.rstrip("/") + "/index/manifest.json" if is_uri(cfg.output_dir)
                else _abs(RunLayout.of(cfg).manifest))  # a URI: each Serve host downloads it (madr.storage)
    derived: dict[str, Any] = {"manifest_path": manifest, "doc_text_field": "title"}
    if _search_settings(cfg):
        derived["search"] = _search_settings(cfg)
    return _merge(derived, cfg.serve)


def _main_of(stage: str) -> Callable[[list[str]], int]:
    if stage in ("encode", "baseline-encode"):
        from pipelines.encode.cli import main
    elif stage == "evaluate":
        from pipelines.evaluate.cli import main
    else:
        from pipelines.mine.cli import main
    return main


SETTINGS = {"encode": encode_settings, "evaluate": evaluate_settings, "mine": mine_settings,
            "baseline-encode": baseline_encode_settings}
SECTION = {"baseline-encode": "encode"}  # the section of the job's own config file, where it is not the stage's name


def write_stage_config(cfg: ExperimentConfig, stage: str) -> Path:
    path = RunLayout.of(cfg).stage_configs / f"{stage}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# derived from the experiment {cfg.name!r} by pipelines/jobs/experiment.py\n"
                    + yaml.safe_dump({SECTION.get(stage, stage): SETTINGS[stage](cfg)}, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.jobs.experiment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(SETTINGS))
    parser.add_argument("--config", required=True, help="experiment YAML")
    parser.add_argument("--print", action="store_true", help="print the derived config and exit")
    args, rest = parser.parse_known_args(argv)
    try:
        cfg = load_config(args.config)
        path = write_stage_config(cfg, args.stage)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.print:
        print(path.read_text(), end="")
        return 0
    print(f"[madr.jobs] {args.stage}: config {path}", flush=True)
    return _main_of(args.stage)(["--config", str(path), *rest])


if __name__ == "__main__":
    sys.exit(main())
