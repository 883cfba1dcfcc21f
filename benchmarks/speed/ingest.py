"""Benchmark: read + validate + tokenise of NLI rows, the Ray Data pipeline vs a plain single-process loop.

Input: `--rows` synthetic SNLI-layout JSONL rows (sentence1 / sentence2 / gold_label; 3% of them are bad,
1% of each kind: broken JSON, an empty sentence, an unknown label), one file. Tokenizer: a BERT WordPiece trained here on a
sample of the text (`madr.modeling.tokenization.train_wordpiece_tokenizer`), saved to disk and loaded from the path
by every contender (`SharedEncoder`: `load_tokenizer` once, then the Rust backend).

Contenders (the same reader, validation, quarantine and tokenisation functions, same tokenizer, same rows):
- `loop`: one process, no Ray: the file's raw line blocks (`--window` lines, `raw_files.read_part`) go
  through `validate_block` (quarantine written) and `tokenize_table`, one block after the other.
  TOKENIZERS_PARALLELISM=false: one core. The time of each stage is reported.
- `loop_threads`: the same loop with TOKENIZERS_PARALLELISM=true (the Rust tokenizer's own threads use
  every core inside each `encode_batch_fast` call; reading and validation stay on one core).
- `ray_tasks`: `read_tokenized(compute="tasks")` with its defaults: the file split into parts by
  `split_bytes="auto"` (about 4 parts per CPU; `--ranges N` forces N), validation and tokenisation inside
  the read tasks, at most `--workers` at a time; the driver iterates the int batches.
- `ray_actors`: `read_tokenized(compute="actors")`: read tasks validate, `map_batches` on an actor pool
  (1..`--workers` actors) tokenises.
- `ray_tasks_w1`: `ray_tasks` with one worker (the scaling check: 1 vs 2 workers).
Each Ray contender starts Ray in its own process (`ray.init(num_cpus=cores)`, timed and reported apart)
and runs the pipeline twice in that Ray session: `cold` (the first run: worker processes import the modules
and build the tokenizer) and `warm` (a second run over the same file: what a long-running job sees).
Three Ray figures are compared with the loop: warm, cold, and cold + `ray.init` (a one-off job's whole cost).
Ray starts its worker processes at niceness 15 unless told otherwise: on this 2-core machine, shared with
other jobs, that alone made the Ray contenders 2-3x slower than the nice-0 loop. The benchmark runs Ray's
workers at `--ray-worker-niceness` (default 0, the loop's priority) so the comparison is of the code.
Each contender runs `--repeat` times, interleaved with the others (loop, ray, loop, ray, ...) so a change
in the machine's load hits them alike; the best run of each is compared. `--quiet-wait S` waits (at most S
seconds) before each run until the other jobs on the machine use fewer than `--quiet-below` cores.

`--rows` takes several sizes (a sweep): every size runs every mode; the sizes where Ray's warm, cold and
cold + init throughput cross the loop's are reported (interpolated between neighbouring sizes).

Measured per run: wall seconds from the first read to the last batch (loading the tokenizer included;
importing `transformers` / `ray` in the benchmark's own process is not), rows/s, the seconds to the first
batch (Ray), CPU seconds used by the process and all its descendants over that interval (Ray's raylet, GCS,
agents and workers included: a load-independent cost), the CPU the rest of the machine used meanwhile
(`others`, in cores: /proc/stat busy time less ours; this machine is shared), and peak memory: the peak of
the summed PSS (proportional set size, so shared object-store pages are not counted twice) over the
process and its descendants, sampled every second (`ProcessTree`).

    python -m benchmarks.speed.ingest                   # 200k rows, every mode: the reported run
    python -m benchmarks.speed.ingest --rows 20000 50000 100000 200000 500000 --modes loop ray_tasks \\
        --repeat 1 --out benchmarks/results/ingest_sweep.json --plot benchmarks/plots/ingest_sweep.png
    python -m benchmarks.speed.ingest --rows 20000 --repeat 1      # smoke check
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
