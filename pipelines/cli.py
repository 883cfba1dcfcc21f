"""`madr` command line: `python -m pipelines.cli <command> [--config FILE] [--set key=value ...]`."""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from madr.config import load_config


def _overrides(pairs: list[str]) -> dict[str, object]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="madr", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job end to end on embedded defaults")
    demo.add_argument("--config", default=None, help="experiment YAML (default: configs/demo.yaml)")
    demo.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config value, e.g. --set model.name=mural")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "demo":
        from pipelines.demo import run_demo

        cfg = load_config(args.config or "configs/demo.yaml", _overrides(args.set))
        return run_demo(cfg)
    return 2


if __name__ == "__main__":
    sys.exit(main())
