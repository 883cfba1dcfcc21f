"""Training throughput of the Ray Train job vs the plain in-process loop, and GradCache memory at batch 1024.

A. Throughput (same model, batch and objective, same run): fine-tuning the tiny MADRAL of
   configs/train_tiny.yaml (L_SCE + pointwise L_CE + aspect losses, Eq. 8) for `--steps` steps at global
   batch `--batch`:
   - peer: `madr.training.train_stage` in this process (CatalogSampler batches), torch threads 2 and 1;
   - the Ray Train job (`pipelines.train.job.run_stage`): 2 DDP/gloo workers x 1 torch thread, rows streamed
     from Ray Data, negatives gathered across workers; pairs/s in steady state (what the workers report,
     first window excluded) and end to end (steps x batch / whole `fit`, start-up included).
B. Memory: one fine-tuning step at `--big-batch` pairs (the papers' 1024) of a larger encoder, plain
   backprop vs GradCache chunks (4-layer, hidden-128 BERT, no dropout so the losses must agree), each in a
   fresh subprocess (peak RSS = ru_maxrss), through the job's engine (`DDPEngine.train_step`, one process).

`python benchmarks/bench_train.py [--steps 60] [--batch 32] [--big-batch 1024] [--out results.json]`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def machine() -> dict:
    import deepspeed
    import ray
    import torch
    import transformers

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 2**20
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem, 1), "python": platform.python_version(),
            "torch": torch.__version__, "ray": ray.__version__, "deepspeed": deepspeed.__version__,
            "transformers": transformers.__version__, "load_avg_start": os.getloadavg()}


# -- A. throughput ------------------------------------------------------------------------------------

def _config(out: str, steps: int, batch: int):
    from madr.config import load_config

    return load_config(ROOT / "configs" / "train_tiny.yaml", {
        "name": "bench", "output_dir": out, "train.finetune.steps": steps, "train.finetune.batch_size": batch,
        "train.finetune.log_every": 10, "train.finetune.validate_every": 0, "train.finetune.checkpoint_every": 0,
        "distributed.cpus_per_worker": 0.5, "distributed.torch_threads": 1})


def in_process(out: str, steps: int, batch: int, threads: int) -> dict:
    import torch

    from madr.experiment import load_catalog, prepare_tokenizer, prepare_vocabularies
    from madr.model import build_model
    from madr.training import CatalogSampler, train_stage

    torch.set_num_threads(threads)
    cfg = _config(out, steps, batch)
    catalog = load_catalog(cfg)
    tok = prepare_tokenizer(cfg, catalog)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, prepare_vocabularies(cfg, catalog, tok))
    start = time.perf_counter()
    history = train_stage(model, CatalogSampler(catalog, seed=0), cfg.train.finetune, "finetune", progress=False)
    seconds = time.perf_counter() - start
    return {"threads": threads, "seconds": seconds, "pairs_per_s": steps * batch / seconds,
            "final_loss": history[-1]["loss"]}


def ray_job(out: str, steps: int, batch: int) -> dict:
    import ray

    from pipelines.train.job import run_stage
    from pipelines.train.metrics import read_history

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    start = time.perf_counter()
    result = run_stage(_config(out, steps, batch), "finetune")
    seconds = time.perf_counter() - start
    ray.shutdown()
    rows = [r for r in read_history(result.log_dir) if r["step"] > 0 and "pairs_per_s" in r]
    steady = rows[1:] or rows
    return {"workers": 2, "fit_seconds": seconds, "pairs_per_s_steady": sum(r["pairs_per_s"] for r in steady) / len(steady),
            "pairs_per_s_end_to_end": steps * batch / seconds, "final_loss": rows[-1]["loss"]}


# -- B. GradCache memory ------------------------------------------------------------------------------

MEM_CHILD = """
import json, resource, sys, time, psutil, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)  # timings compared: one thread (2 threads stall on a busy machine)
from madr.config import StageConfig
from madr.model import BiEncoder
from pipelines.train.engine import DDPEngine
from pipelines.train.objectives import StageModule
model = BiEncoder.load({model!r})
batch = torch.load({batch_file!r}, weights_only=False)
stage = StageConfig(batch_size={batch}, aspect_weight=0.1, gradcache_chunk={chunk})
engine = DDPEngine(StageModule("finetune", stage, model), stage, torch.device("cpu"))
base = psutil.Process().memory_info().rss
start = time.perf_counter()
parts = engine.train_step([batch], step=0)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"chunk": {chunk}, "batch": {batch}, "seconds": seconds, "rss_before_step": base, "peak_rss": peak,
                  "loss": parts["loss"], "sce": parts["sce"], "params": sum(p.numel() for p in model.parameters())}}))
"""


def memory_inputs(out: str, batch: int) -> tuple[str, str]:
    """One model (4-layer, hidden-128 BERT towers, no dropout) and one tokenised batch of `batch` pairs, saved
    for the measuring subprocesses, so plain and GradCache see identical inputs."""
    import torch

    from madr.config import load_config
    from madr.experiment import load_catalog, prepare_tokenizer, prepare_vocabularies
    from madr.model import build_model
    from madr.training import CatalogSampler, finetune_batches
    from pipelines.train.objectives import FinetuneBatch

    cfg = load_config(ROOT / "configs" / "train_tiny.yaml", {
        "output_dir": out, "data.synthetic_products": 4000, "data.synthetic_queries": 3000,
        "model.backbone.tiny": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
                                "intermediate_size": 512, "max_position_embeddings": 128,
                                "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0},
        "model.max_query_length": 16, "model.max_doc_length": 48})
    catalog = load_catalog(cfg)
    tok = prepare_tokenizer(cfg, catalog)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, prepare_vocabularies(cfg, catalog, tok))
    sampler = CatalogSampler(catalog, seed=0)
    examples: list = []
    while len(examples) < batch:
        examples += sampler.finetune_batch(min(batch - len(examples), len(sampler.train_queries)))
    model_dir = str(model.save(Path(out) / "model"))
    batch_file = str(Path(out) / "batch.pt")
    torch.save(FinetuneBatch(*finetune_batches(model, examples)), batch_file)
    return model_dir, batch_file


def memory(model_dir: str, batch_file: str, batch: int, chunk: int) -> dict:
    code = MEM_CHILD.format(root=str(ROOT), model=model_dir, batch_file=batch_file, batch=batch, chunk=chunk)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"chunk": chunk, "batch": batch, "error": proc.stderr[-2000:],
                "peak_rss_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--big-batch", type=int, default=1024)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 64])
    parser.add_argument("--work", default="/tmp/madr_bench_train")
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip", choices=("throughput", "memory"), default=None)
    args = parser.parse_args()
    report: dict = {"machine": machine(), "throughput": {}, "memory": []}
    if args.skip != "throughput":
        report["throughput"]["in_process_2_threads"] = in_process(f"{args.work}/a", args.steps, args.batch, 2)
        report["throughput"]["in_process_1_thread"] = in_process(f"{args.work}/a", args.steps, args.batch, 1)
        report["throughput"]["ray_ddp_2_workers"] = ray_job(f"{args.work}/a", args.steps, args.batch)
        t = report["throughput"]
        ray_steady = t["ray_ddp_2_workers"]["pairs_per_s_steady"]
        t["ratio_ray_steady_vs_in_process_2_threads"] = ray_steady / t["in_process_2_threads"]["pairs_per_s"]
        t["ratio_ray_steady_vs_in_process_1_thread"] = ray_steady / t["in_process_1_thread"]["pairs_per_s"]
        t["ratio_ray_end_to_end_vs_in_process_2_threads"] = (t["ray_ddp_2_workers"]["pairs_per_s_end_to_end"]
                                                             / t["in_process_2_threads"]["pairs_per_s"])
    if args.skip != "memory":
        model_dir, batch_file = memory_inputs(f"{args.work}/b", args.big_batch)
        for chunk in args.chunks:
            report["memory"].append(memory(model_dir, batch_file, args.big_batch, chunk))
            print(json.dumps(report["memory"][-1]), flush=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
