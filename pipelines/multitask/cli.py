"""`python -m pipelines.multitask`: paper 004's multilingual multi-task recipe through Ray, one command.

    python -m pipelines.multitask --config configs/multitask_pipeline.yaml
    python -m pipelines.multitask --config configs/multitask_pipeline.yaml --set scaling.num_workers=1
    python -m pipelines.multitask --config configs/real/multitask_e5.yaml --set scaling.num_workers=2

Stages: data (sources -> usable rows per task -> Ray Data -> proportional `TaskMixer`) -> train (Ray Train,
DDP over `scaling.num_workers` workers) -> distil (with `student.enabled`) -> encode (held-out English
candidates -> FAISS shards) -> evaluate (`metrics.json`). Ray starts locally on loopback (the settings of
scripts/ray_env.sh) unless RAY_ADDRESS names a cluster.

All stages run in this process on one Ray, without completion markers; `python -m pipelines.jobs pipeline
--config configs/multilingual.yaml` runs the same stages through the pipeline runner (resumable, submittable).
"""

from __future__ import annotations

import argparse
import sys

from madr.config_overrides import parse_overrides
from pipelines.runtime import run_ray_job


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.multitask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="recipe YAML (configs/multitask_pipeline.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a dotted key")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def load():
        from pipelines.multitask.config import load_pipeline_config

        return load_pipeline_config(args.config, parse_overrides(args.set))

    def run(cfg):
        from pipelines.multitask.run import run_pipeline

        return run_pipeline(cfg)

    done = run_ray_job(load, run, args.num_cpus)
    if done is None:
        return 1
    print(f"metrics: {done[1]['metrics']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
