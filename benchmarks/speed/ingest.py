"""Read + validate + tokenise of SNLI-layout rows (3% bad): the Ray Data pipeline (`read_tokenized`, cold, warm
and with `ray.init`) vs a single-process loop of the same functions; rows/s, CPU, peak PSS of the process tree.
Several `--rows` make a sweep, with the size where Ray crosses the loop.

    python -m benchmarks.speed.ingest                   # 200k rows, every mode: the reported run
    python -m benchmarks.speed.ingest --rows 50000 200000 1000000 --modes loop ray_tasks --repeat 1 \\
        --out benchmarks/results/ingest_sweep.json --plot benchmarks/plots/ingest_sweep.png
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common.machine import load_average, machine_line, versions_line
from benchmarks.common.process import (
    Interval,
    ProcessTree,
    add_ray_niceness_arg,
    child_env,
    module_command,
    set_ray_worker_niceness,
    wait_quiet,
)
from benchmarks.speed.ingest_report import crossings, plot, ratios, report

WORDS = ("a man woman child dog cat group people two three young old red blue green small large is are "
         "playing running sitting standing eating walking looking holding wearing riding near on in at the "
         "street park beach field table water ball bike car shirt hat hand front outside inside together "
         "while with under over sleeping talking laughing reading music guitar camera phone picture").split()
LABELS = ("entailment", "neutral", "contradiction")
MODES = ("loop", "loop_threads", "ray_tasks", "ray_actors", "ray_tasks_w1")


def machine_info() -> str:
    return (f"machine: {machine_line()}\n"
            f"versions: {versions_line('ray', 'pyarrow', 'transformers', 'tokenizers')}")


def load() -> str:
    return "load average (1/5/15 min): " + load_average().replace(" / ", " ")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 22))).capitalize() + "."


def make_data(path: Path, rows: int, seed: int = 0) -> int:
    """SNLI-layout JSONL; returns the number of good rows (3% bad: 1% each of broken JSON, empty text, bad label)."""
    rng, good = random.Random(seed), 0
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            row = {"sentence1": sentence(rng), "sentence2": sentence(rng), "gold_label": rng.choice(LABELS),
                   "pairID": str(i)}
            kind = i % 100
            if kind == 17:
                f.write('{"sentence1": "broken\n')
                continue
            if kind == 41:
                row["sentence2"] = " "
            elif kind == 73:
                row["gold_label"] = "maybe"
            else:
                good += 1
            f.write(json.dumps(row) + "\n")
    return good


def count_tokens(table) -> int:
    return sum(len(table.column(c).combine_chunks().values) for c in ("premise_input_ids", "hypothesis_input_ids"))


def run_loop(data: Path, tokenizer: str, window: int, max_length: int) -> dict:
    """Single process: raw line blocks -> validate_block (+ quarantine) -> tokenize_table, one at a time."""
    from madr.data.quarantine import read_summary
    from pipelines.data.file_parts import plan_parts
    from pipelines.data.raw_files import read_part
    from pipelines.data.readers import validate_block
    from pipelines.data.sources import SourceOptions
    from pipelines.data.tokenize import SharedEncoder, tokenize_table

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    stages = {"read": 0.0, "validate": 0.0, "tokenize": 0.0}
    with ProcessTree() as tree:
        span = Interval(tree)
        start = time.perf_counter()
        encoder = SharedEncoder(tokenizer, max_length).get()
        stages["load_tokenizer"] = time.perf_counter() - start
        (part,) = plan_parts("snli", str(data))
        layouts = {part.display: (part.fmt, part.header)}
        rows = tokens = 0
        first = None
        t = time.perf_counter()
        for raw in read_part(part, window):
            t1 = time.perf_counter()
            good = validate_block(raw, source="snli", options=SourceOptions(), layouts=layouts, quarantine_dir=qdir,
                                  strict=False, with_origin=False)
            t2 = time.perf_counter()
            out = tokenize_table(good, None, "nli", encoder=encoder)
            t3 = time.perf_counter()
            first = t3 - start if first is None else first
            rows += out.num_rows
            tokens += count_tokens(out)
            stages["read"] += t1 - t
            stages["validate"] += t2 - t1
            stages["tokenize"] += t3 - t2
            t = time.perf_counter()
        measured = span.result()
    summary = read_summary(qdir)
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, **measured, "first_batch": first,
            "peak_bytes": tree.peak, "balanced": summary.balanced, "stages": stages}


def _ray_pass(data: Path, tokenizer: str, args: argparse.Namespace, compute: str, workers: int,
              tree: ProcessTree) -> dict:
    from madr.data.quarantine import read_summary
    from pipelines.data.readers import read_tokenized

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    span = Interval(tree)
    split = -(-data.stat().st_size // args.ranges) if args.ranges > 1 else ("auto" if args.ranges == 0 else None)
    ds = read_tokenized("snli", str(data), tokenizer, quarantine_dir=qdir, max_length=args.max_length,
                        compute=compute, workers=workers, rows_per_block=args.window, split_bytes=split)
    rows = tokens = 0
    first = None
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        first = time.perf_counter() - span.start if first is None else first
        rows += batch.num_rows
        tokens += count_tokens(batch)
    measured = span.result()
    summary = read_summary(qdir)
    stats = ds.stats()
    tasks = [ln.strip() for ln in stats.splitlines() if "tasks executed" in ln]
    detail = [ln.strip() for ln in stats.splitlines() if "tasks executed" in ln or "Remote wall" in ln
              or "Remote cpu" in ln]
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, **measured, "first_batch": first,
            "balanced": summary.balanced, "stats": detail, "tasks": tasks}


def run_ray(data: Path, tokenizer: str, args: argparse.Namespace, compute: str, workers: int) -> dict:
    from pipelines.runtime import apply_ray_env

    apply_ray_env()  # loopback defaults and the local-provider bootstrap file
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded 2-core machine starts slowly
    set_ray_worker_niceness(args.ray_worker_niceness)
    import ray

    with ProcessTree() as tree:
        span = Interval(tree)
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        init = span.result()
        cold = _ray_pass(data, tokenizer, args, compute, workers, tree)
        warm = _ray_pass(data, tokenizer, args, compute, workers, tree)
        ray.shutdown()
    return {**cold, "warm": warm, "init": init["seconds"], "init_cpu": init["cpu"], "peak_bytes": tree.peak}


def child(args: argparse.Namespace) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.mode == "loop_threads" else "false"
    import madr.modeling.tokenization  # noqa: F401 - imports (transformers, torch: seconds) are not timed, for every mode
    import pipelines.data.readers  # noqa: F401
    if args.mode.startswith("loop"):
        out = run_loop(Path(args.data), args.tokenizer, args.window, args.max_length)
    else:
        compute = "actors" if args.mode == "ray_actors" else "tasks"
        workers = 1 if args.mode.endswith("_w1") else args.workers
        out = run_ray(Path(args.data), args.tokenizer, args, compute, workers)
    print("RESULT " + json.dumps(out), flush=True)


def spawn(mode: str, args: argparse.Namespace, data: Path, tok: str) -> dict:
    quiet = wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait > 0 else None
    cmd = [*module_command(__spec__.name), "--child", mode, "--data", str(data), "--tokenizer", tok,
           "--window", str(args.window), "--max-length", str(args.max_length), "--ranges", str(args.ranges),
           "--workers", str(args.workers), "--ray-worker-niceness", str(args.ray_worker_niceness)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=child_env())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1][len("RESULT "):]), "others_before": quiet}


def prefix_file(big: Path, rows: int, path: Path) -> None:
    """The first `rows` lines of `big` (make_data is row-by-row deterministic: the same rows as make_data(rows))."""
    with big.open("rb") as src, path.open("wb") as dst:
        for _ in range(rows):
            dst.write(src.readline())


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000], help="one size, or several (a sweep)")
    parser.add_argument("--window", type=int, default=2048, help="rows per validate/tokenise call")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--ranges", type=int, default=0,
                        help="0: the reader's split_bytes='auto' (default); N > 1: N byte ranges; 1: the file whole")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="Ray tasks/actors")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender (best is reported)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    add_ray_niceness_arg(parser)
    parser.add_argument("--quiet-below", type=float, default=0.3,
                        help="before each run, wait until the other jobs use fewer cores than this ...")
    parser.add_argument("--quiet-wait", type=float, default=0.0, help="... for at most this many seconds (0: no wait)")
    parser.add_argument("--out", default=None, help="write every run's numbers here (JSON)")
    parser.add_argument("--plot", default=None, help="rows/s against input size (PNG; with several --rows)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    info = machine_info()
    print(info, flush=True)
    load_before = load()
    print(f"before: {load_before}", flush=True)
    sizes = sorted(set(args.rows))
    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    t = time.perf_counter()
    big = work / f"snli_{sizes[-1]}.jsonl"
    make_data(big, sizes[-1])
    from madr.modeling.tokenization import train_wordpiece_tokenizer

    rng = random.Random(1)
    train_wordpiece_tokenizer([sentence(rng) for _ in range(5000)], vocab_size=2000, out_dir=str(work / "tok"))
    print(f"data: {', '.join(f'{n:,}' for n in sizes)} rows, SNLI-layout JSONL, one file each; window {args.window}, "
          f"max_length {args.max_length}, {'auto split' if args.ranges == 0 else f'{args.ranges} byte ranges'}, "
          f"{args.workers} workers, Ray worker niceness {args.ray_worker_niceness}; setup "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    per_size: dict[int, dict[str, dict]] = {}
    all_ratios: dict[int, dict[str, float]] = {}
    for n in sizes:
        data = big if n == sizes[-1] else work / f"snli_{n}.jsonl"
        if data != big:
            prefix_file(big, n, data)
        good = sum(1 for i in range(n) if i % 100 not in (17, 41, 73))
        print(f"\n== {n:,} rows ({good:,} good), {data.stat().st_size / 2**20:.1f} MiB; {load()}", flush=True)
        runs: dict[str, list[dict]] = {m: [] for m in args.modes}
        for _ in range(args.repeat):
            for mode in args.modes:
                runs[mode].append(spawn(mode, args, data, str(work / "tok")))
        results = {mode: report(mode, r, good) for mode, r in runs.items()}
        assert len({r["tokens"] for r in results.values()}) == 1, "every contender must produce the same tokens"
        per_size[n] = results
        all_ratios[n] = ratios(results, args)
        for key, value in all_ratios[n].items():
            print(f"{key}: {value:.2f}x")
    load_after = load()
    print(f"\nafter: {load_after}", flush=True)
    cross = None
    if len(sizes) > 1 and "loop" in args.modes and "ray_tasks" in args.modes:
        cross = crossings(sizes, per_size)
        print("ray_tasks reaches the loop's rows/s at: " + ", ".join(
            f"{k} {'never (in this range)' if v is None else f'~{v:,.0f} rows'}" for k, v in cross.items()))
        if args.plot:
            plot(args.plot, sizes, per_size, f"benchmarks.speed.ingest on dev-cpu ({args.workers} cores), "
                                               f"best of {args.repeat}; {load_before}")
            print(f"plot: {args.plot}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "command": " ".join(sys.argv), "machine": info, "load_before": load_before, "load_after": load_after,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "data", "tokenizer")},
            "results": {str(n): per_size[n] for n in sizes}, "ratios": {str(n): all_ratios[n] for n in sizes},
            "crossing_rows": cross}, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
