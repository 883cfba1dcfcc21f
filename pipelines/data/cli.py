"""`python -m pipelines.data <command>`: ingest, tokenize, mix (dry run), vocab, stats, sources.

    python -m pipelines.data ingest --source snli --input snli_1.0_train.jsonl --output out/snli [--strict]
    python -m pipelines.data ingest --source snli --input s3://bucket/snli/ --output out/snli_tok \\
        --tokenizer tok/ --split-mb 64          # read + validate + tokenise in one pass
    python -m pipelines.data tokenize --task nli --input out/snli --tokenizer tok/ --output out/snli_tok
    python -m pipelines.data mix --input nli=out/snli_tok --input click=out/clicks_tok --batch-size 32
    python -m pipelines.data vocab --input catalog/products.parquet catalog/queries.parquet \\
        --tokenizer tok/ --output vocab.json
    python -m pipelines.data stats --items catalog/products.parquet --queries catalog/queries.parquet \\
        --vocab vocab.json

Ray starts locally (loopback only) unless RAY_ADDRESS names a cluster; Ray Data shows its progress bars.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from madr.data.schema import RESERVED_COLUMNS
from madr.modeling.aspect_vocabulary import GRANULARITIES, AspectVocabularies
from pipelines.runtime import init_ray


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"{what} expects NAME=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out[key] = value
    return out


def _aspect_columns(ds: Any, given: list[str] | None) -> list[str]:
    if given:
        return given
    import pyarrow as pa

    schema = ds.schema()
    names = [n for n, t in zip(schema.names, schema.types, strict=True)
             if n not in RESERVED_COLUMNS and isinstance(t, pa.DataType) and pa.types.is_list(t)]
    if not names:
        raise SystemExit("no list<string> aspect columns found; pass --aspects")
    return names


def cmd_sources(args: argparse.Namespace) -> int:
    from pipelines.data.sources import SOURCES

    for spec in SOURCES.values():
        print(f"{spec.name:<15} task={spec.task:<9} formats={'/'.join(spec.formats):<17} {spec.description}")
        for name, aliases in spec.columns.items():
            print(f"    {name:<12} <- {', '.join(aliases)}")
    return 0


def split_bytes(split_mb: str) -> int | str | None:
    """`--split-mb` -> `split_bytes` of `ingest`: "auto", None (0: whole files) or bytes."""
    if split_mb == "auto":
        return "auto"
    try:
        mb = float(split_mb)
    except ValueError:
        raise ValueError(f"--split-mb: expected 'auto' or a number of MiB, got {split_mb!r}") from None
    if mb < 0:
        raise ValueError(f"--split-mb: expected 'auto' or a number >= 0, got {split_mb!r}")
    return int(mb * (1 << 20)) or None


def cmd_ingest(args: argparse.Namespace) -> int:
    from madr.data.validation import StrictModeError
    from pipelines.data.readers import ingest
    from pipelines.data.sources import SourceOptions

    init_ray(args.num_cpus)
    options = SourceOptions(language=args.language, max_chars=args.max_chars, min_score=args.min_score,
                            languages=tuple(args.languages) if args.languages else None,
                            default_label=args.default_label, split=args.split)
    try:
        summary = ingest(args.source, args.input, args.output, quarantine_dir=args.quarantine, options=options,
                         strict=args.strict, fmt=args.format, rows_per_block=args.rows_per_block,
                         split_bytes=split_bytes(args.split_mb),
                         tokenizer=args.tokenizer, max_length=args.max_length, bucket=args.bucket,
                         compute=args.compute, workers=args.workers)
    except (StrictModeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(summary.format())
    print(f"good rows -> {args.output}; quarantine -> {args.quarantine or args.output.rstrip('/') + '.quarantine'}")
    return 0 if summary.balanced else 1


def cmd_tokenize(args: argparse.Namespace) -> int:
    from pipelines.data.tokenize import tokenize_dataset

    ray = init_ray(args.num_cpus)
    ds = ray.data.read_parquet(args.input)
    out = tokenize_dataset(ds, args.task, args.tokenizer, max_length=args.max_length, window=args.window,
                           bucket=args.bucket, max_actors=args.actors)
    out.write_parquet(args.output, mode="overwrite")
    print(f"tokenised {args.task} rows -> {args.output}")
    return 0


def cmd_mix(args: argparse.Namespace) -> int:
    from collections import Counter

    from pipelines.data.mixing import TaskMixer

    ray = init_ray(args.num_cpus)
    datasets = {task: ray.data.read_parquet(path) for task, path in _pairs(args.input, "--input").items()}
    weights = {k: float(v) for k, v in _pairs(args.weights, "--weights").items()} if args.weights else None
    mixer = TaskMixer(datasets, batch_size=args.batch_size, mode=args.mode, weights=weights, seed=args.seed)
    tasks = mixer.tasks(0)
    print(f"sizes {mixer.sizes}; {len(tasks)} steps in epoch 0; batches per task {dict(Counter(tasks))}")
    print("first steps:", " ".join(tasks[: args.steps]))
    for batch in mixer:
        if batch.step >= args.steps:
            break
        print(f"step {batch.step}: {batch.task} ({batch.num_rows} rows)")
    return 0


def cmd_vocab(args: argparse.Namespace) -> int:
    from pipelines.data.vocab_job import build_vocabularies_ray

    ray = init_ray(args.num_cpus)
    ds = ray.data.read_parquet(args.input)
    aspects = _aspect_columns(ds, args.aspects)
    vocabs = build_vocabularies_ray(ds, aspects, args.granularities, args.tokenizer, args.min_freq, args.max_size)
    vocabs.save(args.output)
    for (a, g), v in vocabs.items():
        print(f"{a:<12} {g:<7} {len(v)} values")
    print(f"vocabularies -> {args.output}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from pipelines.data.stats import aspect_stats

    ray = init_ray(args.num_cpus)
    sides = {}
    if args.items:
        sides["item"] = ray.data.read_parquet(args.items)
    if args.queries:
        sides["query"] = ray.data.read_parquet(args.queries)
    if not sides:
        raise SystemExit("give --items and/or --queries")
    aspects = _aspect_columns(next(iter(sides.values())), args.aspects)
    vocabs = AspectVocabularies.load(args.vocab) if args.vocab else None
    stats = aspect_stats(sides, aspects, vocabs, keys={"item": args.dedupe} if args.dedupe else None)
    print(json.dumps(stats.to_dict(), indent=1) if args.json else stats.format())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sources", help="list the sources and their columns").set_defaults(fn=cmd_sources)

    p = sub.add_parser("ingest", help="read + validate + normalise one source to Parquet (bad rows quarantined)")
    p.add_argument("--source", required=True)
    p.add_argument("--input", nargs="+", required=True, help="files, directories or object-store URIs")
    p.add_argument("--output", required=True)
    p.add_argument("--quarantine", default=None, help="default: <output>.quarantine")
    p.add_argument("--strict", action="store_true", help="fail on the first bad row (file, row, field)")
    p.add_argument("--format", choices=("jsonl", "tsv", "parquet"), default=None, help="default: by extension")
    p.add_argument("--language", default=None)
    p.add_argument("--languages", nargs=2, default=None, metavar=("LANG1", "LANG2"), help="WikiMatrix columns")
    p.add_argument("--min-score", type=float, default=None, help="WikiMatrix threshold (default 1.04)")
    p.add_argument("--max-chars", type=int, default=None)
    p.add_argument("--default-label", default=None, help="ESCI label of rows without one")
    p.add_argument("--split", default="train", help="split written into evidence rows")
    p.add_argument("--split-mb", default="auto",
                   help="read large files in parts of this many MiB: 'auto' (default: about 4 parts per cluster "
                        "CPU for local files), a number, or 0 (every file whole, one task each)")
    p.add_argument("--rows-per-block", type=int, default=10_000)
    p.add_argument("--tokenizer", default=None, help="also tokenise, in the same pass (writes token ids)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--bucket", action="store_true", help="sort each block by length (with --tokenizer)")
    p.add_argument("--compute", choices=("tasks", "actors"), default="tasks",
                   help="tokenise in the read tasks (default) or on an actor pool")
    p.add_argument("--workers", type=int, default=None, help="concurrent tasks / actors (default: CPUs)")
    p.set_defaults(fn=cmd_ingest)

    p = sub.add_parser("tokenize", help="tokenise normalised rows of one task on an actor pool")
    p.add_argument("--task", required=True, choices=("nli", "click", "parallel", "evidence", "aspect"))
    p.add_argument("--input", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--window", type=int, default=2048)
    p.add_argument("--bucket", action="store_true", help="sort each window by length")
    p.add_argument("--actors", type=int, default=None)
    p.set_defaults(fn=cmd_tokenize)

    p = sub.add_parser("mix", help="dry run of the task mixer over tokenised task datasets")
    p.add_argument("--input", action="append", required=True, metavar="TASK=PATH")
    p.add_argument("--mode", default="proportional", choices=("proportional", "sequential", "random", "weights"))
    p.add_argument("--weights", action="append", default=[], metavar="TASK=W")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.set_defaults(fn=cmd_mix)

    for name, helptext in (("vocab", "build aspect vocabularies with Ray aggregations"),
                           ("stats", "aspect coverage and vocabulary sizes (paper 000 T3 / 001 T2)")):
        p = sub.add_parser(name, help=helptext)
        if name == "vocab":
            p.add_argument("--input", nargs="+", required=True, help="Parquet files of annotated documents")
            p.add_argument("--output", required=True)
            p.add_argument("--tokenizer", default=None)
            p.add_argument("--granularities", nargs="+", default=list(GRANULARITIES), choices=GRANULARITIES)
            p.add_argument("--min-freq", type=int, default=1)
            p.add_argument("--max-size", type=int, default=None)
        else:
            p.add_argument("--items", nargs="+", default=None)
            p.add_argument("--queries", nargs="+", default=None)
            p.add_argument("--vocab", default=None, help="vocabularies JSON for the size columns")
            p.add_argument("--json", action="store_true")
            p.add_argument("--dedupe", default=None, metavar="KEY", help="count items once per KEY (product_id)")
        p.add_argument("--aspects", nargs="+", default=None, help="default: the list<string> columns")
        p.set_defaults(fn=cmd_vocab if name == "vocab" else cmd_stats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
