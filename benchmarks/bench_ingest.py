"""Benchmark: read + validate + tokenise of NLI rows, the Ray Data pipeline vs a plain single-process loop.

Input: `--rows` synthetic SNLI-layout JSONL rows (sentence1 / sentence2 / gold_label; 1% of them are bad:
broken JSON, an empty sentence, an unknown label), one file. Tokenizer: a BERT WordPiece trained here on a
sample of the text (`madr.tokenization.train_wordpiece_tokenizer`), saved to disk and loaded from the path
by every contender (`SharedEncoder`: `load_tokenizer` once, then the Rust backend).

Contenders (the same reader, validation, quarantine and tokenisation functions, same tokenizer, same rows):
- `loop`: one process, no Ray: the file's raw line blocks (`--window` lines, `readers._read_part`) go
  through `validate_block` (quarantine written) and `tokenize_table`, one block after the other.
  TOKENIZERS_PARALLELISM=false: one core. The time of each stage is reported.
- `loop_threads`: the same loop with TOKENIZERS_PARALLELISM=true (the Rust tokenizer's own threads use
  every core inside each `encode_batch_fast` call; reading and validation stay on one core).
- `ray_tasks`: `read_tokenized(compute="tasks")`: the file read as `--ranges` byte ranges, validation and
  tokenisation inside the read tasks, at most `--workers` at a time; the driver iterates the int batches.
- `ray_actors`: `read_tokenized(compute="actors")`: read tasks validate, `map_batches` on an actor pool
  (1..`--workers` actors) tokenises.
- `ray_tasks_w1`: `ray_tasks` with one worker (the scaling check: 1 vs 2 workers).
Each Ray contender starts Ray in its own process (`ray.init(num_cpus=cores)`, not timed, reported) and
runs the pipeline twice in that Ray session: `cold` (the first run: worker processes import the modules
and build the tokenizer) and `warm` (a second run over the same file: what a long-running job sees).
Ray starts its worker processes at niceness 15 unless told otherwise: on this 2-core machine, shared with
other jobs, that alone made the Ray contenders 2-3x slower than the nice-0 loop. The benchmark runs Ray's
workers at `--ray-worker-niceness` (default 0, the loop's priority) so the comparison is of the code.
Each contender runs `--repeat` times, interleaved with the others (loop, ray, loop, ray, ...) so a change
in the machine's load hits them alike; the best run of each is compared.

Measured per run: wall seconds from the first read to the last batch (loading the tokenizer included;
importing `transformers` / `ray` in the benchmark's own process is not),
rows/s, CPU seconds used by the process and all its descendants over that interval (Ray's raylet, GCS
and workers included: a load-independent cost), and peak memory: the peak of the summed PSS (proportional
set size, so shared object-store pages are not counted twice) over the process and its descendants,
sampled every 0.5 s (`ProcessTree`).

    python benchmarks/bench_ingest.py                   # 200k rows, the reported run
    python benchmarks/bench_ingest.py --rows 20000 --repeat 1      # smoke check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

WORDS = ("a man woman child dog cat group people two three young old red blue green small large is are "
         "playing running sitting standing eating walking looking holding wearing riding near on in at the "
         "street park beach field table water ball bike car shirt hat hand front outside inside together "
         "while with under over sleeping talking laughing reading music guitar camera phone picture").split()
LABELS = ("entailment", "neutral", "contradiction")
MODES = ("loop", "loop_threads", "ray_tasks", "ray_actors", "ray_tasks_w1")


def machine_info() -> str:
    cpu = "unknown cpu"
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    with open("/proc/meminfo") as f:
        mem_kb = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal")))
    import pyarrow
    import ray
    import tokenizers
    import transformers

    return (f"machine: {cpu}; {len(os.sched_getaffinity(0))} usable cores; RAM {mem_kb / 2**20:.1f} GiB; "
            f"{platform.system()} {platform.release()}\nversions: python {platform.python_version()}, ray "
            f"{ray.__version__}, pyarrow {pyarrow.__version__}, transformers {transformers.__version__}, "
            f"tokenizers {tokenizers.__version__}")


def load() -> str:
    return "load average (1/5/15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 22))).capitalize() + "."


def make_data(path: Path, rows: int, seed: int = 0) -> int:
    """SNLI-layout JSONL; returns the number of good rows (1% bad: broken JSON, empty text, bad label)."""
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


class ProcessTree:
    """Peak summed PSS (sampled in a thread) and CPU seconds of this process and its descendants.

    Reading smaps_rollup is not free: with Ray's ten processes one sample costs about 40 ms of CPU here, so
    a 50 ms interval took a quarter of a core from the Ray contenders. Samples are 0.5 s apart and the
    sampler's own CPU time is left out of `cpu_seconds`."""

    def __init__(self, interval: float = 0.5) -> None:
        import psutil

        self.proc, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sampler_cpu = 0.0
        self._cpu: dict[int, float] = {}

    def members(self) -> list:
        return [self.proc, *self.proc.children(recursive=True)]

    def cpu_seconds(self) -> float:
        """CPU seconds of the tree so far (every process ever seen: its last reading), less the sampler's."""
        for p in self.members():
            try:
                t = p.cpu_times()
                self._cpu[p.pid] = max(self._cpu.get(p.pid, 0.0), t.user + t.system)
            except Exception:  # noqa: BLE001 - a process that just exited
                pass
        return sum(self._cpu.values()) - self.sampler_cpu

    def _sample(self) -> int:
        total = 0
        for p in self.members():
            try:
                with open(f"/proc/{p.pid}/smaps_rollup") as f:
                    total += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:")) * 1024
            except (OSError, StopIteration):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.thread_time()
            self.peak = max(self.peak, self._sample())
            self.cpu_seconds()  # keeps the CPU of processes that exit before the end
            self.sampler_cpu += time.thread_time() - t
            self._stop.wait(self.interval)

    def __enter__(self) -> ProcessTree:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self._sample())


def count_tokens(table) -> int:
    return sum(len(table.column(c).combine_chunks().values) for c in ("premise_input_ids", "hypothesis_input_ids"))


def run_loop(data: Path, tokenizer: str, window: int, max_length: int) -> dict:
    """Single process: raw line blocks -> validate_block (+ quarantine) -> tokenize_table, one at a time."""
    from pipelines.data.quarantine import read_summary
    from pipelines.data.readers import _read_part, plan_parts, validate_block
    from pipelines.data.sources import SourceOptions
    from pipelines.data.tokenize import SharedEncoder, tokenize_table

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    stages = {"read": 0.0, "validate": 0.0, "tokenize": 0.0}
    with ProcessTree() as tree:
        cpu0, start = tree.cpu_seconds(), time.perf_counter()
        encoder = SharedEncoder(tokenizer, max_length).get()
        stages["load_tokenizer"] = time.perf_counter() - start
        (part,) = plan_parts("snli", str(data))
        layouts = {part.display: (part.fmt, part.header)}
        rows = tokens = 0
        t = time.perf_counter()
        for raw in _read_part(part, window):
            t1 = time.perf_counter()
            good = validate_block(raw, source="snli", options=SourceOptions(), layouts=layouts, quarantine_dir=qdir,
                                  strict=False, with_origin=False)
            t2 = time.perf_counter()
            out = tokenize_table(good, None, "nli", encoder=encoder)
            t3 = time.perf_counter()
            rows += out.num_rows
            tokens += count_tokens(out)
            stages["read"] += t1 - t
            stages["validate"] += t2 - t1
            stages["tokenize"] += t3 - t2
            t = time.perf_counter()
        seconds, cpu = time.perf_counter() - start, tree.cpu_seconds() - cpu0
    summary = read_summary(qdir)
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, "seconds": seconds, "cpu": cpu,
            "peak_bytes": tree.peak, "balanced": summary.balanced, "stages": stages}


def _ray_pass(data: Path, tokenizer: str, args: argparse.Namespace, compute: str, workers: int,
              tree: ProcessTree) -> dict:
    from pipelines.data.quarantine import read_summary
    from pipelines.data.readers import read_tokenized

    qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
    cpu0, start = tree.cpu_seconds(), time.perf_counter()
    split = -(-data.stat().st_size // args.ranges) if args.ranges > 1 else None
    ds = read_tokenized("snli", str(data), tokenizer, quarantine_dir=qdir, max_length=args.max_length,
                        compute=compute, workers=workers, rows_per_block=args.window, split_bytes=split)
    rows = tokens = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        rows += batch.num_rows
        tokens += count_tokens(batch)
    seconds, cpu = time.perf_counter() - start, tree.cpu_seconds() - cpu0
    summary = read_summary(qdir)
    stats = [ln.strip() for ln in ds.stats().splitlines() if "tasks executed" in ln or "Remote wall" in ln
             or "Remote cpu" in ln]
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, "seconds": seconds, "cpu": cpu,
            "balanced": summary.balanced, "stats": stats}


def run_ray(data: Path, tokenizer: str, args: argparse.Namespace, compute: str, workers: int) -> dict:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded 2-core machine starts slowly
    os.environ["RAY_worker_niceness"] = str(args.ray_worker_niceness)
    bootstrap = Path.home() / "ray_bootstrap_config.yaml"
    if not bootstrap.exists():
        bootstrap.write_text("provider:\n  type: local\n")
    import ray

    with ProcessTree() as tree:
        t0 = time.perf_counter()
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        init = time.perf_counter() - t0
        cold = _ray_pass(data, tokenizer, args, compute, workers, tree)
        warm = _ray_pass(data, tokenizer, args, compute, workers, tree)
        ray.shutdown()
    return {**cold, "warm": warm, "init": init, "peak_bytes": tree.peak}


def child(args: argparse.Namespace) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.mode == "loop_threads" else "false"
    import madr.tokenization  # noqa: F401 - imports (transformers, torch: seconds) are not timed, for every mode
    import pipelines.data.readers  # noqa: F401
    if args.mode.startswith("loop"):
        out = run_loop(Path(args.data), args.tokenizer, args.window, args.max_length)
    else:
        compute = "actors" if args.mode == "ray_actors" else "tasks"
        workers = 1 if args.mode.endswith("_w1") else args.workers
        out = run_ray(Path(args.data), args.tokenizer, args, compute, workers)
    print("RESULT " + json.dumps(out), flush=True)


def spawn(mode: str, args: argparse.Namespace, data: Path, tok: str) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--data", str(data), "--tokenizer", tok,
           "--window", str(args.window), "--max-length", str(args.max_length), "--ranges", str(args.ranges),
           "--workers", str(args.workers), "--ray-worker-niceness", str(args.ray_worker_niceness)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def report(mode: str, runs: list[dict], good: int) -> dict:
    best = min(runs, key=lambda r: r["seconds"])
    for r in runs:
        assert r["rows"] == good and r["balanced"], f"{mode}: {r['rows']} good rows, expected {good}"
    times = ", ".join(f"{r['seconds']:.1f}" for r in runs)
    line = (f"{mode:<13} {best['rows'] / best['seconds']:>8,.0f} rows/s  {best['seconds']:6.2f} s (runs: {times})  "
            f"CPU {best['cpu']:6.1f} s  peak PSS {best['peak_bytes'] / 2**20:,.0f} MiB  quarantined {best['bad']}")
    if "warm" in best:
        warm = min((r["warm"] for r in runs), key=lambda r: r["seconds"])
        assert warm["rows"] == good and warm["tokens"] == best["tokens"]
        best["warm_best"] = warm
        line += (f"\n{'':<13} warm: {warm['rows'] / warm['seconds']:>8,.0f} rows/s  {warm['seconds']:6.2f} s  "
                 f"CPU {warm['cpu']:6.1f} s; ray.init {best['init']:.1f} s (not included)")
        line += "".join(f"\n{'':<15}{s}" for s in warm["stats"])
    if "stages" in best:
        line += f"\n{'':<13} stages (s): " + ", ".join(f"{k} {v:.2f}" for k, v in best["stages"].items())
    print(line, flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=2048, help="rows per validate/tokenise call")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--ranges", type=int, default=8, help="byte ranges the Ray reader splits the file into")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="Ray tasks/actors")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender (best is reported)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--ray-worker-niceness", type=int, default=0,
                        help="Ray's default is 15: on a machine shared with other jobs its workers then get a "
                             "fraction of the CPU the nice-0 loop gets; 0 runs both contenders at one priority")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    print(machine_info(), flush=True)
    print(f"before: {load()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    data = work / "snli_synthetic.jsonl"
    t = time.perf_counter()
    good = make_data(data, args.rows)
    from madr.tokenization import train_wordpiece_tokenizer

    rng = random.Random(1)
    train_wordpiece_tokenizer([sentence(rng) for _ in range(5000)], vocab_size=2000, out_dir=str(work / "tok"))
    print(f"data: {args.rows} rows ({good} good), {data.stat().st_size / 2**20:.1f} MiB JSONL, one file; "
          f"window {args.window}, max_length {args.max_length}, {args.ranges} byte ranges, {args.workers} "
          f"workers, Ray worker niceness {args.ray_worker_niceness}; setup {time.perf_counter() - t:.1f} s",
          flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for _ in range(args.repeat):
        for mode in args.modes:
            runs[mode].append(spawn(mode, args, data, str(work / "tok")))
    results = {mode: report(mode, r, good) for mode, r in runs.items()}
    assert len({r["tokens"] for r in results.values()}) == 1, "every contender must produce the same tokens"
    print(f"after: {load()}", flush=True)
    for base in ("loop", "loop_threads"):
        for mode in [m for m in results if m.startswith("ray")]:
            if base not in results:
                continue
            cold = results[base]["seconds"] / results[mode]["seconds"]
            warm = results[base]["seconds"] / results[mode]["warm_best"]["seconds"]
            print(f"{mode} / {base}: {cold:.2f}x the throughput (cold), {warm:.2f}x (warm)")
    if "ray_tasks" in results and "ray_tasks_w1" in results:
        one, two = results["ray_tasks_w1"]["warm_best"]["seconds"], results["ray_tasks"]["warm_best"]["seconds"]
        print(f"ray_tasks scaling: {args.workers} workers / 1 worker = {one / two:.2f}x (warm)")


if __name__ == "__main__":
    main()
