"""`python -m pipelines.evaluate`: metrics of one or more indexed models on queries + qrels, and a
recall-vs-latency plot (nprobe / efSearch sweep).

    python -m pipelines.evaluate --config configs/encode.yaml
    python -m pipelines.evaluate --queries q.parquet --qrels qrels.parquet --run base=index_a/ \\
        --run hybrid=index_b/ --doc-key product_id --output eval_out
    python -m pipelines.evaluate --beir data/scifact --split test --run base=index_a/ --doc-key product_id
    python -m pipelines.evaluate --queries q.parquet --qrels qrels.trec --run base=index_a/ --doc-key product_id

--beir takes a BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv; a local path or a pyarrow
filesystem URI such as file:///data/scifact); --qrels may be a BEIR TSV or TREC qrels file. Each run's
ranking is also written as a TREC run file <output>/<NAME>.trec beside <output>/qrels.trec.

A run is NAME=MANIFEST (the model is the manifest's model_dir unless the YAML sets one). Ray starts
locally (loopback only) unless RAY_ADDRESS names a cluster; --local searches in this process without Ray.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from madr.evaluate_config import EvaluateConfig
from pipelines.evaluate.job import run_evaluate
from pipelines.runtime import job_parser, load_stage_config, run_ray_job


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("python -m pipelines.evaluate", __doc__, "EvaluateConfig", "evaluate")
    p.add_argument("--queries", default=None)
    p.add_argument("--qrels", default=None, help="Parquet / JSONL table, BEIR TSV or TREC qrels file")
    p.add_argument("--beir", default=None, help="a BEIR directory (instead of --queries / --qrels)")
    p.add_argument("--split", default=None, help="the BEIR split to evaluate (default: test)")
    p.add_argument("--run", action="append", default=None, metavar="NAME=MANIFEST")
    p.add_argument("--doc-key", dest="doc_key", default=None)
    p.add_argument("--output", default=None)
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--metrics", nargs="+", default=None)
    p.add_argument("--local", action="store_true", help="search in this process without Ray")
    return p


def load_config(args: argparse.Namespace) -> EvaluateConfig:
    """The YAML (its ``evaluate:`` section when it has one) with the command-line flags on top."""
    overrides = {k: getattr(args, k) for k in ("queries", "qrels", "beir", "split", "doc_key", "output", "k",
                                               "metrics")}
    if args.run:
        runs = []
        for item in args.run:
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--run expects NAME=MANIFEST, got {item!r}")
            runs.append({"name": name, "index": path})
        overrides["runs"] = runs
    cfg = load_stage_config(EvaluateConfig, args.config, overrides, section="evaluate")
    if not cfg.runs or not (cfg.beir or (cfg.queries and cfg.qrels)):
        raise ValueError("evaluate: need queries, qrels and at least one run (--run NAME=MANIFEST or the YAML); "
                         "--beir DIR stands for queries and qrels")
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    done = run_ray_job(lambda: load_config(args), lambda cfg: run_evaluate(cfg, local=args.local), args.num_cpus,
                       start_ray=not args.local)
    if done is None:
        return 1
    cfg, result = done
    print(Path(cfg.output, "results.md").read_text(), end="")
    return 0 if result["results"] else 1


if __name__ == "__main__":
    sys.exit(main())
