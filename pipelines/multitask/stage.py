"""`python -m pipelines.multitask.stage NAME --config <yaml>`: one stage of the multilingual recipe as its own
process, reading what the stages before it wrote under `output_dir` (`pipelines.multitask.run`).

This is the module of every stage in the `recipe: multilingual` table of `python -m pipelines.jobs`
(`pipelines.jobs.recipes`), which runs them in order, skips the complete ones and submits them to a cluster.
The stages that need Ray start a local one on loopback (the settings of scripts/ray_env.sh) unless RAY_ADDRESS
names a cluster; the data stage needs none.
"""

from __future__ import annotations

import argparse
import sys

from madr.config_overrides import parse_overrides
from pipelines.runtime import run_ray_job


def build_parser() -> argparse.ArgumentParser:
    from pipelines.multitask.run import STAGES

    p = argparse.ArgumentParser(prog="python -m pipelines.multitask.stage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=list(STAGES))
    p.add_argument("--config", required=True, help="recipe YAML (configs/multilingual.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted key")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pipelines.multitask.config import load_pipeline_config
    from pipelines.multitask.run import NEEDS_RAY, STAGES

    done = run_ray_job(lambda: load_pipeline_config(args.config, parse_overrides(args.set)),
                       lambda cfg: STAGES[args.stage](cfg, print), args.num_cpus,
                       start_ray=args.stage in NEEDS_RAY)
    return 0 if done is not None else 1


if __name__ == "__main__":
    sys.exit(main())
