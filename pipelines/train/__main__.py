"""`python -m pipelines.train --config X --stage pretrain|finetune|distill [--address A] [--set k=v ...]`.

Runs locally (starts a Ray instance) or on a cluster (`--address auto`, or inside `ray job submit`, which
sets RAY_ADDRESS); `--print-submit` prints the `ray job submit` command for the stage instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from madr.config import load_config
from pipelines.cli import _overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiment YAML (e.g. configs/train_tiny.yaml)")
    parser.add_argument("--stage", required=True, choices=("pretrain", "finetune", "distill"))
    parser.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set distributed.num_workers=4")
    parser.add_argument("--print-submit", action="store_true", help="print the `ray job submit` command and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = load_config(args.config, _overrides(args.set))
    from pipelines.train.job import run_stage, submit_command

    if args.print_submit:
        print(submit_command(args.config, args.stage, cfg))
        return 0
    result = run_stage(cfg, args.stage, address=args.address)
    print(json.dumps({k: v for k, v in result.to_dict().items() if k != "metrics"}, indent=1))
    final = {k: v for k, v in result.metrics.items() if k.startswith("val_") or k in ("step", "loss")}
    print("final metrics:", json.dumps(final, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
