"""Read + validate + tokenise of SNLI-layout rows (3% bad): the Ray Data pipeline (`read_tokenized`, its tasks;
cold, warm and with `ray.init`) vs a single-process loop of the same functions; rows/s, CPU, peak PSS of the process
tree. Several `--rows` make a sweep, with the size where Ray crosses the loop.

    python -m benchmarks.speed.ingest --rows 50000 200000 1000000 --repeat 1 \\
        --out benchmarks/results/ingest_sweep.json --plot benchmarks/plots/ingest_sweep.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import process
from benchmarks.common.config import parser as make_parser
from benchmarks.common.config import pyplot, save_figure, write_json
from benchmarks.common.machine import load_average, machine_line, run_command, versions
from benchmarks.common.process import Interval, ProcessTree

WORDS = ("a man woman child dog cat group people two three young old red blue green small large is are "
         "playing running sitting standing eating walking looking holding wearing riding near on in at the "
         "street park beach field table water ball bike car shirt hat hand front outside inside together "
         "while with under over sleeping talking laughing reading music guitar camera phone picture").split()
LABELS = ("entailment", "neutral", "contradiction")
MODES = ("loop", "ray_tasks")
WINDOW, MAX_LENGTH = 2048, 64  # rows per validate / tokenise call; tokens per sentence
WORKERS = len(os.sched_getaffinity(0))  # Ray's read tasks: the usable cores


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


def consume(batches, span: Interval, qdir: str) -> dict:
    """Rows, tokens, the first batch's arrival and the quarantine of tokenised `batches`, timed over `span`."""
    from madr.data.quarantine import read_summary

    rows = tokens = 0
    first = None
    for batch in batches:
        first = time.perf_counter() - span.start if first is None else first
        rows += batch.num_rows
        tokens += sum(len(batch.column(c).combine_chunks().values)
                      for c in ("premise_input_ids", "hypothesis_input_ids"))
    measured = span.result()
    summary = read_summary(qdir)
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, **measured, "first_batch": first,
            "balanced": summary.balanced}


def run_loop(data: Path, tokenizer: str) -> dict:
    """Single process: raw line blocks -> validate_block (+ quarantine) -> tokenize_table, one at a time."""
    from pipelines.data.file_parts import plan_parts
    from pipelines.data.raw_files import read_part
    from pipelines.data.readers import validate_block
    from pipelines.data.sources import SourceOptions
    from pipelines.data.tokenize import SharedEncoder, tokenize_table

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    with ProcessTree() as tree:
        span = Interval(tree)
        encoder = SharedEncoder(tokenizer, MAX_LENGTH).get()
        (part,) = plan_parts("snli", str(data))
        layouts = {part.display: (part.fmt, part.header)}

        def batches():
            for raw in read_part(part, WINDOW):
                good = validate_block(raw, source="snli", options=SourceOptions(), layouts=layouts,
                                      quarantine_dir=qdir, strict=False, with_origin=False)
                yield tokenize_table(good, None, "nli", encoder=encoder)

        out = consume(batches(), span, qdir)
    return {**out, "peak_bytes": tree.peak}


def _ray_pass(data: Path, tokenizer: str, tree: ProcessTree) -> dict:
    from pipelines.data.readers import read_tokenized

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    span = Interval(tree)
    ds = read_tokenized("snli", str(data), tokenizer, quarantine_dir=qdir, max_length=MAX_LENGTH, workers=WORKERS,
                        rows_per_block=WINDOW)  # the file split in byte ranges ("auto")
    out = consume(ds.iter_batches(batch_size=None, batch_format="pyarrow"), span, qdir)
    return {**out, "tasks": [ln.strip() for ln in ds.stats().splitlines() if "tasks executed" in ln]}


def run_ray(data: Path, tokenizer: str) -> dict:
    from pipelines.runtime import apply_ray_env

    apply_ray_env()  # loopback defaults (Ray's workers at niceness 0) and the local-provider bootstrap file
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded 2-core machine starts slowly
    import ray

    with ProcessTree() as tree:
        span = Interval(tree)
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        init = span.result()
        cold = _ray_pass(data, tokenizer, tree)
        warm = _ray_pass(data, tokenizer, tree)
        ray.shutdown()
    return {**cold, "warm": warm, "init": init["seconds"], "init_cpu": init["cpu"], "peak_bytes": tree.peak}


def child(mode: str, data: str, tokenizer: str) -> dict:
    """One contender's run (in a fresh interpreter: `call_in_child`)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import madr.modeling.tokenization  # noqa: F401 - imports (transformers, torch: seconds) are not timed, for every mode
    import pipelines.data.readers  # noqa: F401
    return (run_loop if mode == "loop" else run_ray)(Path(data), tokenizer)


def spawn(mode: str, args: argparse.Namespace, data: Path, tok: str) -> dict:
    quiet = process.wait_quiet(args.quiet_below, args.quiet_wait) if args.quiet_wait > 0 else None
    return {**process.call_in_child(__spec__.name, "child", mode=mode, data=str(data), tokenizer=tok),
            "others_before": quiet}


def prefix_file(big: Path, rows: int, path: Path) -> None:
    """The first `rows` lines of `big` (make_data is row-by-row deterministic: the same rows as make_data(rows))."""
    with big.open("rb") as src, path.open("wb") as dst:
        for _ in range(rows):
            dst.write(src.readline())


def load() -> str:
    return "load average (1/5/15 min): " + load_average().replace(" / ", " ")


def _rate(r: dict) -> float:
    return r["rows"] / r["seconds"]


def report(mode: str, runs: list[dict], good: int) -> dict:
    """Print and return the best run of `mode` (Ray: its best cold, best warm and best cold + init)."""
    for r in runs:
        assert r["rows"] == good and r["balanced"], f"{mode}: {r['rows']} good rows, expected {good}"
    best = dict(min(runs, key=lambda r: r["seconds"]))
    times = ", ".join(f"{r['seconds']:.1f}" for r in runs)
    others = ", ".join(f"{r['others_cores']:.2f}" for r in runs)
    line = (f"{mode:<13} {_rate(best):>8,.0f} rows/s  {best['seconds']:6.2f} s (runs: {times})  CPU "
            f"{best['cpu']:6.1f} s ({1e6 * best['cpu'] / good:.0f} us/row)  peak PSS {best['peak_bytes'] / 2**20:,.0f} "
            f"MiB  first batch {best['first_batch']:.2f} s  others' load {others} cores  quarantined {best['bad']}")
    if "warm" in best:
        warm = min((r["warm"] for r in runs), key=lambda r: r["seconds"])
        assert all(r["warm"]["rows"] == good and r["warm"]["balanced"] for r in runs)
        assert warm["tokens"] == best["tokens"]
        with_init = min(runs, key=lambda r: r["seconds"] + r["init"])
        best.update(warm_best=warm, init_best=min(r["init"] for r in runs),
                    with_init_seconds=with_init["seconds"] + with_init["init"])
        line += (f"\n{'':<13} warm: {_rate(warm):>8,.0f} rows/s  {warm['seconds']:6.2f} s  CPU {warm['cpu']:6.1f} s "
                 f"({1e6 * warm['cpu'] / good:.0f} us/row)  first batch {warm['first_batch']:.2f} s  others' load "
                 f"{warm['others_cores']:.2f} cores; cold + ray.init: {good / best['with_init_seconds']:,.0f} rows/s "
                 f"(ray.init {best['init_best']:.1f} s)")
        line += "".join(f"\n{'':<15}{s}" for s in warm["tasks"])
    print(line, flush=True)
    return best


# the Ray figures of a size's best runs (`report`): their seconds
FIGURES = {"cold": lambda r: r["seconds"], "warm": lambda r: r["warm_best"]["seconds"],
           "cold+init": lambda r: r["with_init_seconds"]}


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Throughput of each Ray figure over the loop's (>1: Ray is faster)."""
    if not {"loop", "ray_tasks"} <= set(results):
        return {}
    return {f"ray_tasks/loop {k}": results["loop"]["seconds"] / f(results["ray_tasks"]) for k, f in FIGURES.items()}


def crossings(sizes: list[int], per_size: dict[int, dict[str, dict]]) -> dict[str, float | None]:
    """The row count where ray_tasks reaches the loop's rows/s per Ray figure (log-linear interpolation)."""
    out: dict[str, float | None] = {}
    for key, seconds in FIGURES.items():
        ratio = [per_size[n]["loop"]["seconds"] / seconds(per_size[n]["ray_tasks"]) for n in sizes]
        out[key] = None
        for i, r in enumerate(ratio):
            if r >= 1.0:
                if i == 0:
                    out[key] = float(sizes[0])
                else:
                    lo, hi = math.log(sizes[i - 1]), math.log(sizes[i])
                    frac = (1.0 - ratio[i - 1]) / (r - ratio[i - 1])
                    out[key] = float(math.exp(lo + frac * (hi - lo)))
                break
    return out


def plot(path: str, sizes: list[int], per_size: dict[int, dict[str, dict]], title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4.2))
    modes = list(per_size[sizes[0]])
    for mode in modes:
        for (figure, seconds), style in zip(FIGURES.items(), ("o-", "s--", "^:"), strict=True):
            if figure == "cold" or mode.startswith("ray"):
                ax.plot(sizes, [per_size[n][mode]["rows"] / seconds(per_size[n][mode]) for n in sizes], style,
                        label=mode if mode == "loop" else f"{mode} {figure.replace('+', ' + ray.')}")
    ax.set_xscale("log")
    ax.set_xlabel("input rows (SNLI-layout JSONL, 3% bad)")
    ax.set_ylabel("good rows/s (read + validate + tokenise)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def main() -> None:
    parser = make_parser(__spec__.name, __doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000], help="one size, or several (a sweep)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender (best is reported)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--quiet-below", type=float, default=0.3,
                        help="before each run, wait until the other jobs use fewer cores than this ...")
    parser.add_argument("--quiet-wait", type=float, default=0.0, help="... for at most this many seconds (0: no wait)")
    parser.add_argument("--out", default=None, help="write every run's numbers here (JSON)")
    parser.add_argument("--plot", default=None, help="rows/s against input size (PNG; with several --rows)")
    args = parser.parse_args()
    info = f"machine: {machine_line()}\nversions: {versions('ray', 'pyarrow', 'transformers', 'tokenizers')}"
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
    print(f"data: {', '.join(f'{n:,}' for n in sizes)} rows, SNLI-layout JSONL, one file each; window {WINDOW}, "
          f"max_length {MAX_LENGTH}, auto split, {WORKERS} workers, Ray worker niceness "
          f"{os.environ.get('RAY_worker_niceness', 0)}; setup {time.perf_counter() - t:.1f} s", flush=True)
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
        all_ratios[n] = ratios(results)
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
            plot(args.plot, sizes, per_size, f"benchmarks.speed.ingest on dev-cpu ({WORKERS} cores), "
                                               f"best of {args.repeat}; {load_before}")
            print(f"plot: {args.plot}")
    if args.out:
        write_json(args.out, {
            "command": run_command(__spec__.name), "machine": info, "load_before": load_before, "load_after": load_after,
            "args": {**vars(args), "window": WINDOW, "max_length": MAX_LENGTH, "workers": WORKERS},
            "results": {str(n): per_size[n] for n in sizes}, "ratios": {str(n): all_ratios[n] for n in sizes},
            "crossing_rows": cross})
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
