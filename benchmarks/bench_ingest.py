"""Benchmark: read + validate + tokenise of NLI rows, the Ray Data pipeline vs a plain single-process loop.

Input: `--rows` synthetic SNLI-layout JSONL rows (sentence1 / sentence2 / gold_label; 1% of them are bad:
broken JSON, an empty sentence, an unknown label), one file. Tokenizer: a BERT WordPiece trained here on a
sample of the text (`madr.tokenization.train_wordpiece_tokenizer`), saved to disk and loaded from the path
by both contenders.

Contenders (same validation and tokenisation functions, same tokenizer, same rows):
- `loop`: one process reads the file line by line, validates batches of `--window` lines with
  `pipelines.data.validation.validate_rows` and tokenises them with `pipelines.data.tokenize.tokenize_table`.
  Run twice: TOKENIZERS_PARALLELISM=false (one core) and =true (the Rust tokenizer's own threads).
- `ray`: `pipelines.data.readers.read_source` (the file read as `--ranges` byte ranges, validation fused
  with the reads, quarantine written) -> `tokenize_dataset` (ActorPoolStrategy 1..N CPU actors) -> the
  driver iterates the int batches. Timed from the first read to the last batch; Ray's start (`ray.init`)
  is reported separately and not included.

Each contender runs in its own subprocess; peak memory is the peak of the summed PSS (proportional set
size, so shared object-store pages are not counted twice) over the process and all its descendants
(raylet, GCS, Ray workers), sampled every 50 ms.

    python benchmarks/bench_ingest.py                   # 200k rows, the reported run
    python benchmarks/bench_ingest.py --rows 20000      # smoke check
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


class PeakPss:
    """Peak of the summed PSS of this process and its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self.proc, self.interval, self.peak, self._stop = psutil.Process(), interval, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                with open(f"/proc/{p.pid}/smaps_rollup") as f:
                    total += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:")) * 1024
            except (OSError, StopIteration):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> PeakPss:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()
        self.peak = max(self.peak, self._sample())


def run_loop(data: Path, tokenizer: str, window: int, max_length: int) -> dict:
    """Single process: lines -> validate_rows -> tokenize_table, `window` lines at a time."""
    import pyarrow as pa

    from madr.tokenization import load_tokenizer
    from pipelines.data.sources import SourceOptions, get_source
    from pipelines.data.tokenize import make_encoder, tokenize_table
    from pipelines.data.validation import validate_rows

    spec = get_source("snli")
    with PeakPss() as mem:
        start = time.perf_counter()
        tok = load_tokenizer(tokenizer)
        encoder = make_encoder(tok, max_length)
        rows = tokens = bad = 0

        def flush(lines: list[bytes], first: int) -> None:
            nonlocal rows, tokens, bad
            result = validate_rows(spec.normalize, SourceOptions(), str(data), lines,
                                   range(first, first + len(lines)), "jsonl", (), spec.max_chars, "snli", False)
            out = tokenize_table(pa.Table.from_pylist(result.good, schema=spec.schema), tok, "nli", max_length,
                                 encoder=encoder)
            rows += out.num_rows
            bad += len(result.bad)
            tokens += sum(len(out.column(c).combine_chunks().values) for c in ("premise_input_ids", "hypothesis_input_ids"))

        with data.open("rb") as f:
            pending, first = [], 1
            for line in f:
                pending.append(line.rstrip(b"\n"))
                if len(pending) == window:
                    flush(pending, first)
                    first, pending = first + window, []
            if pending:
                flush(pending, first)
        seconds = time.perf_counter() - start
    return {"rows": rows, "bad": bad, "tokens": tokens, "seconds": seconds, "peak_bytes": mem.peak}


def run_ray(data: Path, tokenizer: str, window: int, max_length: int, ranges: int, actors: int) -> dict:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    bootstrap = Path.home() / "ray_bootstrap_config.yaml"
    if not bootstrap.exists():
        bootstrap.write_text("provider:\n  type: local\n")
    import ray

    from pipelines.data.quarantine import read_summary
    from pipelines.data.readers import read_source
    from pipelines.data.tokenize import tokenize_dataset

    with PeakPss() as mem:
        t0 = time.perf_counter()
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        init = time.perf_counter() - t0
        qdir = tempfile.mkdtemp(prefix="bench_quarantine_")
        start = time.perf_counter()
        split = -(-data.stat().st_size // ranges) if ranges > 1 else None
        ds = read_source("snli", str(data), quarantine_dir=qdir, split_bytes=split, rows_per_block=window)
        ds = tokenize_dataset(ds, "nli", tokenizer, max_length=max_length, window=window, max_actors=actors)
        rows = tokens = 0
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            rows += batch.num_rows
            tokens += len(batch.column("premise_input_ids").combine_chunks().values)
            tokens += len(batch.column("hypothesis_input_ids").combine_chunks().values)
        seconds = time.perf_counter() - start
        summary = read_summary(qdir)
        ray.shutdown()
    return {"rows": rows, "bad": summary.num_quarantined, "tokens": tokens, "seconds": seconds, "init": init,
            "peak_bytes": mem.peak, "balanced": summary.balanced}


def child(args: argparse.Namespace) -> None:
    if args.mode.startswith("loop"):
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.mode == "loop_threads" else "false"
        out = run_loop(Path(args.data), args.tokenizer, args.window, args.max_length)
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        out = run_ray(Path(args.data), args.tokenizer, args.window, args.max_length, args.ranges, args.actors)
    print("RESULT " + json.dumps(out), flush=True)


def spawn(mode: str, args: argparse.Namespace, data: Path, tok: str) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--data", str(data), "--tokenizer", tok,
           "--window", str(args.window), "--max-length", str(args.max_length), "--ranges", str(args.ranges),
           "--actors", str(args.actors)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=2048, help="rows per validate/tokenise call")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--ranges", type=int, default=4, help="byte ranges the Ray reader splits the file into")
    parser.add_argument("--actors", type=int, default=len(os.sched_getaffinity(0)), help="max tokeniser actors")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender (best is reported)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    print(machine_info(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench_ingest_"))
    data = work / "snli_synthetic.jsonl"
    t = time.perf_counter()
    good = make_data(data, args.rows)
    from madr.tokenization import train_wordpiece_tokenizer

    rng = random.Random(1)
    train_wordpiece_tokenizer([sentence(rng) for _ in range(5000)], vocab_size=2000, out_dir=str(work / "tok"))
    print(f"data: {args.rows} rows ({good} good), {data.stat().st_size / 2**20:.1f} MiB JSONL, one file; "
          f"window {args.window}, max_length {args.max_length}; setup {time.perf_counter() - t:.1f} s", flush=True)
    results = {}
    for mode in ("loop", "loop_threads", "ray"):
        runs = [spawn(mode, args, data, str(work / "tok")) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["seconds"])
        assert best["rows"] == good, f"{mode}: {best['rows']} good rows, expected {good}"
        results[mode] = best
        extra = f"; ray.init {best['init']:.1f} s (not included)" if "init" in best else ""
        times = ", ".join(f"{r['seconds']:.2f}" for r in runs)
        print(f"{mode:<13} {best['rows'] / best['seconds']:>9,.0f} rows/s  {best['seconds']:6.2f} s "
              f"(runs: {times})  peak PSS "
              f"{best['peak_bytes'] / 2**20:,.0f} MiB  tokens {best['tokens']:,}  quarantined {best['bad']}{extra}",
              flush=True)
    assert len({r["tokens"] for r in results.values()}) == 1, "every contender must produce the same tokens"
    for base in ("loop", "loop_threads"):
        ratio = results[base]["seconds"] / results["ray"]["seconds"]
        print(f"ray / {base}: {ratio:.2f}x the throughput")


if __name__ == "__main__":
    main()
