"""`python -m pipelines.evaluate`: metrics of one or more indexed models on queries + qrels, and a
recall-vs-latency plot (nprobe / efSearch sweep).

    python -m pipelines.evaluate --config configs/encode.yaml
    python -m pipelines.evaluate --queries q.parquet --qrels qrels.parquet --run base=index_a/ \\
        --run hybrid=index_b/ --doc-key product_id --output eval_out

A run is NAME=MANIFEST (the model is the manifest's model_dir unless the YAML sets one). Ray starts
locally (loopback only) unless RAY_ADDRESS names a cluster.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.evaluate.job import EvaluateConfig, run_evaluate
from pipelines.runtime import job_parser, load_stage_config, run_ray_job


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("python -m pipelines.evaluate", __doc__, "EvaluateConfig", "evaluate")
    p.add_argument("--queries", default=None)
    p.add_argument("--qrels", default=None)
    p.add_argument("--run", action="append", default=None, metavar="NAME=MANIFEST")
    p.add_argument("--doc-key", dest="doc_key", default=None)
    p.add_argument("--output", default=None)
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--metrics", nargs="+", default=None)
    return p


def load_config(args: argparse.Namespace) -> EvaluateConfig:
    """The YAML (its ``evaluate:`` section when it has one) with the command-line flags on top."""
    overrides = {k: getattr(args, k) for k in ("queries", "qrels", "doc_key", "output", "k", "metrics")}
    if args.run:
        runs = []
        for item in args.run:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--run expects NAME=MANIFEST, got {item!r}")
            runs.append({"name": name, "index": path})
        overrides["runs"] = runs
    cfg = load_stage_config(EvaluateConfig, args.config, overrides, section="evaluate")
    if not cfg.runs or not cfg.queries or not cfg.qrels:
        raise ValueError("evaluate: need queries, qrels and at least one run (--run NAME=MANIFEST or the YAML)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    done = run_ray_job(lambda: load_config(args), run_evaluate, args.num_cpus)
    if done is None:
        return 1
    cfg, result = done
    print(Path(cfg.output, "results.md").read_text(), end="")
    return 0 if result["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
