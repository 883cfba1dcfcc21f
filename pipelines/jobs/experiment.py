"""Run the index-side stages from the experiment YAML: `python -m pipelines.jobs.experiment STAGE --config X`.

The encode, evaluate and mine jobs each have their own config (`madr.encode_config.EncodeConfig`,
`madr.evaluate_config.EvaluateConfig`, `pipelines.mine.job.MineConfig`); inside the pipeline their
settings follow from the experiment, and the experiment's `encode:` / `evaluate:` sections override single keys
(`madr.job_settings`, which also derives the deploy stage's Serve args, `serve_args`). The derived config is
written to `<output_dir>/_stages/configs/<stage>.yaml` (what ran is on disk) and handed to the job's own CLI, so
the job behaves exactly as when run by hand with that file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from madr.config import ExperimentConfig, load_config
from madr.job_settings import (  # noqa: F401  (the derived settings, also read from here by the pipeline's modules)
    baseline_encode_settings,
    encode_settings,
    evaluate_settings,
    has_baseline,
    mine_settings,
    serve_args,
    untrained_name,
)
from madr.layout import RunLayout


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
