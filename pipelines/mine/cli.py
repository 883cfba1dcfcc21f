"""`python -m pipelines.mine`: hard negatives for fine-tuning from a sharded index (see pipelines.mine.job
for the output columns).

    python -m pipelines.mine --config configs/encode.yaml
    python -m pipelines.mine --queries train_q.parquet --positives train_qrels.parquet --index index/ \\
        --rank-min 10 --rank-max 100 --num-negatives 8 --output negatives.parquet

Ray starts locally (loopback only) unless RAY_ADDRESS names a cluster.
"""

from __future__ import annotations

import argparse
import sys

from pipelines.mine.job import MineConfig, run_mine
from pipelines.runtime import job_parser, load_stage_config, run_ray_job


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("python -m pipelines.mine", __doc__, "MineConfig", "mine")
    p.add_argument("--queries", default=None)
    p.add_argument("--positives", default=None)
    p.add_argument("--index", default=None, help="index manifest (or its directory)")
    p.add_argument("--model-dir", dest="model_dir", default=None)
    p.add_argument("--doc-key", dest="doc_key", default=None)
    p.add_argument("--rank-min", dest="rank_min", type=int, default=None)
    p.add_argument("--rank-max", dest="rank_max", type=int, default=None)
    p.add_argument("--num-negatives", dest="num_negatives", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--output", default=None)
    return p


def load_config(args: argparse.Namespace) -> MineConfig:
    """The YAML (its ``mine:`` section when it has one) with the command-line flags on top; ``--index`` and
    ``--model-dir`` replace those of the ``run`` section and keep its search settings (nprobe, ...)."""
    overrides = {k: getattr(args, k) for k in ("queries", "positives", "doc_key", "rank_min", "rank_max",
                                               "num_negatives", "seed", "output")}
    if args.index or args.model_dir:
        overrides["run"] = {"index": args.index, "model_dir": args.model_dir}
    cfg = load_stage_config(MineConfig, args.config, overrides, section="mine")
    missing = [name for name, value in (("queries", cfg.queries), ("positives", cfg.positives),
                                        ("index", cfg.run.index)) if not value]
    if missing:
        raise ValueError(f"mine: missing {', '.join(missing)} (set in the YAML or on the command line)")
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return 1 if run_ray_job(lambda: load_config(args), run_mine, args.num_cpus) is None else 0


if __name__ == "__main__":
    sys.exit(main())
