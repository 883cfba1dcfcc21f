"""`madr` command line: `python -m pipelines.cli <command>`.

    demo        the README's main job: the whole pipeline on a local Ray cluster, ending with queries
                answered over HTTP (pipelines/demo.py; configs/demo.yaml)
    experiment  one experiment in this process, without Ray: train, then print metrics before / after
    export      a saved model as a sentence-transformers directory and / or an ONNX tower (pipelines/export.py)
    calibrate   fit an aspect model's confidence temperatures on a catalog split, for /explain (pipelines/calibrate.py)
"""

from __future__ import annotations

import argparse
import logging
import sys

from madr.config import load_config
from madr.config_overrides import parse_overrides


def _overrides(pairs: list[str]) -> dict[str, object]:
    try:
        return parse_overrides(pairs)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def format_table(before: dict[str, float], after: dict[str, float]) -> str:
    keys = sorted(set(before) | set(after))
    width = max(len(k) for k in keys)
    lines = [f"{'metric':<{width}}  untrained   trained", "-" * (width + 22)]
    for k in keys:
        lines.append(f"{k:<{width}}  {before.get(k, float('nan')):9.4f} {after.get(k, float('nan')):9.4f}")
    return "\n".join(lines)


def run_in_process(config: str, overrides: list[str]) -> int:
    from madr.recipes.aspects.experiment import run_experiment

    cfg = load_config(config, _overrides(overrides))
    result = run_experiment(cfg)
    print(format_table(result.before, result.after))
    print(f"model saved to {result.model_dir} ({result.seconds:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="madr", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the whole pipeline on a local Ray cluster, ending with a served index")
    demo.add_argument("--config", default=None, help="experiment YAML (default: configs/demo.yaml)")
    demo.add_argument("--port", type=int, default=8000, help="HTTP port of the search API")
    demo.add_argument("--serve", action="store_true", help="keep serving after the sample queries (Ctrl-C stops)")
    demo.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local cluster (default: all)")
    exp = sub.add_parser("experiment", help="one experiment in this process (no Ray): metrics before / after")
    exp.add_argument("--config", default="configs/experiment.yaml")
    export = sub.add_parser("export", add_help=False,
                            help="a model as a sentence-transformers directory / ONNX (python -m pipelines.export -h)")
    export.add_argument("args", nargs=argparse.REMAINDER)
    calibration = sub.add_parser("calibrate", add_help=False, help="an aspect model's confidence temperatures "
                                 "(python -m pipelines.calibrate -h)")
    calibration.add_argument("args", nargs=argparse.REMAINDER)
    for p in (demo, exp):
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set model.name=mural")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.command == "export":
        from pipelines.export import main as export_main

        return export_main(args.args)
    if args.command == "calibrate":
        from pipelines.calibrate import main as calibrate_main

        return calibrate_main(args.args)
    if args.command == "demo":
        from pipelines.demo import run_demo

        return run_demo(args.config, args.set, port=args.port, keep_serving=args.serve, num_cpus=args.num_cpus)
    return run_in_process(args.config, args.set)


if __name__ == "__main__":
    sys.exit(main())
