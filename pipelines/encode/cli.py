"""`python -m pipelines.encode`: encode a corpus into a sharded FAISS (+ sparse) index, or verify one.

    python -m pipelines.encode --config configs/encode.yaml
    python -m pipelines.encode --config configs/encode.yaml --input corpus/ --output index/ --num-shards 8
    python -m pipelines.encode --config configs/encode.yaml --verify      # checksums + exactly-once report
    python -m pipelines.encode --config configs/encode.yaml --local       # no Ray: in this process

Re-running the same command resumes: complete shards are skipped. Ray starts locally (loopback only,
the settings of scripts/ray_env.sh) unless RAY_ADDRESS names a cluster; Ray Data prints its progress bars
and the job prints one line per finished shard.
"""

from __future__ import annotations

import argparse
import json
import sys

from madr.encode_config import EncodeConfig
from pipelines.runtime import job_parser, load_stage_config


def build_parser() -> argparse.ArgumentParser:
    p = job_parser("python -m pipelines.encode", __doc__, "EncodeConfig", "encode")
    p.add_argument("--input", nargs="+", default=None, help="corpus files / directories / URIs")
    p.add_argument("--output", default=None)
    p.add_argument("--model-dir", dest="model_dir", default=None)
    p.add_argument("--num-shards", dest="num_shards", type=int, default=None)
    p.add_argument("--index-factory", dest="index_factory", default=None, help='e.g. "Flat", "IVF1024,PQ32"')
    p.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"))
    p.add_argument("--encode-actors", dest="encode_actors", type=int, default=None)
    p.add_argument("--tokenize-actors", dest="tokenize_actors", type=int, default=None)
    p.add_argument("--overwrite", action="store_true", default=None, help="start over in a non-empty output")
    p.add_argument("--local", action="store_true", help="run in this process without Ray")
    p.add_argument("--verify", action="store_true", help="verify an existing index against the input")
    return p


def load(args: argparse.Namespace) -> EncodeConfig:
    overrides = {k: getattr(args, k) for k in ("input", "output", "model_dir", "num_shards", "index_factory", "device",
                                               "encode_actors", "tokenize_actors", "overwrite")}
    if args.num_shards is not None:
        overrides["max_docs_per_shard"] = None
    cfg = load_stage_config(EncodeConfig, args.config, overrides, section="encode")
    cfg.check_paths()
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load(args)
        if args.verify:
            report = _verify(cfg)
            print(json.dumps({k: (v[:20] if isinstance(v, list) else v) for k, v in report.items()}, indent=1))
            return 0 if report["ok"] else 1
        if not args.local:
            from pipelines.runtime import init_ray

            init_ray(args.num_cpus)
        from pipelines.encode.job import run_encode

        result = run_encode(cfg, local=args.local)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{result.num_docs} docs -> {result.manifest_path} in {result.seconds:.1f} s "
          f"(shards written {result.shards_written}, skipped {result.shards_skipped}); "
          f"duplicates {len(result.report['duplicates'])}")
    return 0


def _verify(cfg: EncodeConfig) -> dict:
    from pipelines.encode.job import verify_index

    return verify_index(cfg)


if __name__ == "__main__":
    sys.exit(main())
