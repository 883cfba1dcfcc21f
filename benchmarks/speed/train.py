"""A. Training throughput of the Ray Train job (DDP, DeepSpeed ZeRO-2 on CPU) vs a plain PyTorch loop on the same
model, rows, batch (`BATCH`) and steps (steady and end-to-end pairs/s); B. GradCache's peak memory vs plain
backprop at batch `BIG_BATCH`.

    python -m benchmarks.speed.train --out benchmarks/results/train_cpu.json --plot benchmarks/plots/train_cpu.png
    python -m benchmarks.speed.train --steps 20 --repeat 1 --skip memory       # smoke check
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.common.config import ROOT, pyplot, save_figure, write_json
from benchmarks.common.config import parser as make_parser
from benchmarks.common.machine import machine_line, run_command, versions
from benchmarks.common.process import Interval, ProcessTree, call_in_child, wait_quiet
from madr.config import StageConfig, load_config
from madr.modeling.model import BiEncoder, build_model
from madr.training.stage_module import FinetuneBatch, StageModule

MODES = ("plain_1t", "plain_2t", "ray_ddp", "ray_deepspeed")
BATCH, BIG_BATCH, CHUNKS = 32, 1024, (0, 64)  # A's global batch; B's batch and GradCache chunks (0: plain backprop)
QUIET_BELOW = 0.3  # --quiet-wait: until the other jobs use fewer cores than this
SIZES = {
    "tiny": None,  # configs/train_tiny.yaml's backbone (hidden 64, 2 layers)
    "small": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024,
              "max_position_embeddings": 128},
}


def config(work: str, size: str, steps: int, backend: str = "ddp"):
    overrides = {
        "name": "bench", "output_dir": work, "train.finetune.steps": steps, "train.finetune.batch_size": BATCH,
        "train.finetune.log_every": 10, "train.finetune.validate_every": 0, "train.finetune.checkpoint_every": 0,
        "distributed.cpus_per_worker": 0.5, "distributed.torch_threads": 1, "distributed.backend": backend,
        "distributed.zero_stage": 2, "distributed.run_name": f"bench-{backend}-{time.time_ns()}"}
    if SIZES[size] is not None:
        overrides["model.backbone.tiny"] = SIZES[size]
    return load_config(ROOT / "configs" / "train_tiny.yaml", overrides)


def plain_loop(work: str, size: str, steps: int, threads: int) -> dict:
    """One process: the job's objective on the job's rows with a plain forward / backward / AdamW loop."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from madr.training.loop import Optimisation
    from pipelines.train.data import example_files
    from pipelines.train.engine import trainable
    from pipelines.train.examples import decode_batch
    from pipelines.train.job import stage_dir

    torch.set_num_threads(threads)
    cfg = config(work, size, steps)
    stage = cfg.train.finetune
    with ProcessTree() as tree:
        span = Interval(tree)
        torch.manual_seed(cfg.train.seed)
        model = BiEncoder.load(str(stage_dir(cfg, "finetune") / "init_model"))
        module = StageModule("finetune", stage, model)
        optimisation = Optimisation.for_stage(trainable(module), stage)
        files = itertools.cycle(example_files(str(stage_dir(cfg, "finetune") / "examples")))
        table = pq.read_table(next(files))
        logged, steady_start = [], None
        module.train()
        for step in range(steps):
            while table.num_rows < BATCH:  # the files in order, epoch after epoch
                table = pa.concat_tables([table, pq.read_table(next(files))])
            rows, table = table.slice(0, BATCH), table.slice(BATCH)
            numpy_rows = {c: rows.column(c).to_numpy(zero_copy_only=False) for c in rows.column_names}
            loss, _ = module("loss", decode_batch("finetune", numpy_rows, model), step)
            optimisation.step(loss)
            if (step + 1) % stage.log_every == 0 or step + 1 == steps:
                logged.append(float(loss))  # the loss the job reports at its log steps
            if step + 1 == stage.log_every:
                steady_start = time.perf_counter()
        end = span.result()
    steady_steps = steps - stage.log_every
    return {"mode": f"plain_{threads}t", "seconds": end["seconds"], "cpu": end["cpu"],
            "others_cores": end["others_cores"], "pairs_per_s_end_to_end": steps * BATCH / end["seconds"],
            "pairs_per_s_steady": steady_steps * BATCH / (span.start + end["seconds"] - steady_start),
            "final_loss": sum(logged[-3:]) / len(logged[-3:]), "peak_pss": tree.peak}


def ray_job(work: str, size: str, steps: int, backend: str) -> dict:
    import ray

    from pipelines.train.job import run_stage
    from pipelines.train.metrics import read_history

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    with ProcessTree() as tree:
        t0 = time.perf_counter()
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        init = time.perf_counter() - t0
        span = Interval(tree)
        result = run_stage(config(work, size, steps, backend), "finetune")
        end = span.result()
        ray.shutdown()
    rows = [r for r in read_history(result.log_dir) if r["step"] > 0 and "pairs_per_s" in r]
    steady = rows[1:] or rows
    window = [rows[i]["step"] - (rows[i - 1]["step"] if i else 0) for i in range(len(rows))][1:] or [1]
    # the windows' rates weighted by their steps = steady steps / steady seconds
    steady_rate = sum(window) / sum(w / r["pairs_per_s"] for w, r in zip(window, steady, strict=True))
    last = rows[-1]
    return {"mode": f"ray_{backend}", "seconds": end["seconds"], "cpu": end["cpu"], "init": init,
            "others_cores": end["others_cores"], "pairs_per_s_end_to_end": steps * BATCH / end["seconds"],
            "pairs_per_s_steady": steady_rate, "final_loss": sum(r["loss"] for r in rows[-3:]) / len(rows[-3:]),
            "backend": last.get("backend"), "zero_stage": last.get("zero_stage"),
            "world_size": last.get("world_size"), "peak_pss": tree.peak}


def child(mode: str, work: str, size: str, steps: int) -> dict:
    """One contender's run (in a fresh interpreter: `call_in_child`)."""
    if mode.startswith("plain"):
        return plain_loop(work, size, steps, int(mode[-2]))
    return ray_job(work, size, steps, mode.removeprefix("ray_"))


def spawn(mode: str, args: argparse.Namespace, work: str) -> dict:
    quiet = wait_quiet(QUIET_BELOW, args.quiet_wait) if args.quiet_wait > 0 else None
    env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2" if mode == "plain_2t" else "1"}
    try:
        result = call_in_child(__spec__.name, "child", env, mode=mode, work=work, size=args.size, steps=args.steps)
    except RuntimeError as err:
        return {"mode": mode, "error": str(err)}
    return {**result, "others_before": quiet}


def throughput(args: argparse.Namespace) -> dict:
    from pipelines.train.job import prepare_stage

    work = f"{args.work}/a_{args.size}"
    prepare_stage(config(work, args.size, args.steps), "finetune")  # the init model and rows all start from
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode in MODES:
            r = spawn(mode, args, work)
            runs[mode].append(r)
            print(json.dumps(r), flush=True)
    ok = {mode: [r for r in rs if "error" not in r] for mode, rs in runs.items()}
    best = {mode: max(ok[mode], key=lambda r: r["pairs_per_s_steady"]) if ok[mode] else runs[mode][-1]
            for mode in runs}  # the best run, else the last error
    out = {"size": args.size, "steps": args.steps, "batch": BATCH, "runs": runs, "best": best, "ratios": {}}
    for base in ("plain_1t", "plain_2t"):
        for mode in ("ray_ddp", "ray_deepspeed"):
            b, m = best.get(base, {}), best.get(mode, {})
            if "pairs_per_s_steady" in b and "pairs_per_s_steady" in m:
                out["ratios"][f"{mode}/{base} steady"] = m["pairs_per_s_steady"] / b["pairs_per_s_steady"]
                out["ratios"][f"{mode}/{base} end_to_end"] = m["pairs_per_s_end_to_end"] / b["pairs_per_s_end_to_end"]
    return out


def gradcache_step(model_dir: str, batch_file: str, chunk: int) -> dict:
    """One training step of the job's engine on the saved batch (GradCache in chunks of `chunk`; 0: plain backprop),
    in a fresh interpreter (`call_in_child`): seconds, peak RSS and the loss."""
    import resource

    import psutil

    from pipelines.train.engine import DDPEngine

    torch.set_num_threads(1)
    model = BiEncoder.load(model_dir)
    stage = StageConfig(batch_size=BIG_BATCH, aspect_weight=0.1, gradcache_chunk=chunk)
    engine = DDPEngine(StageModule("finetune", stage, model), stage, torch.device("cpu"))
    base = psutil.Process().memory_info().rss
    start = time.perf_counter()
    parts = engine.train_step([torch.load(batch_file, weights_only=False)], step=0)
    return {"chunk": chunk, "batch": BIG_BATCH, "seconds": time.perf_counter() - start, "rss_before_step": base,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "loss": float(parts["loss"]),
            "sce": float(parts["sce"]), "params": sum(p.numel() for p in model.parameters())}


def memory_inputs(out: str) -> tuple[str, str]:
    """One model (4-layer, hidden-128, no dropout) and one batch of `BIG_BATCH` pairs, saved for the subprocesses."""
    from madr.recipes.aspects.experiment import load_catalog, prepare_tokenizer, prepare_vocabularies
    from madr.training.loop import CatalogSampler, finetune_batches

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
    while len(examples) < BIG_BATCH:
        examples += sampler.finetune_batch(min(BIG_BATCH - len(examples), len(sampler.train_queries)))
    model_dir = str(model.save(Path(out) / "model"))
    batch_file = str(Path(out) / "batch.pt")
    torch.save(FinetuneBatch(*finetune_batches(model, examples)), batch_file)
    return model_dir, batch_file


def memory(model_dir: str, batch_file: str, chunk: int) -> dict:
    try:
        return call_in_child(__spec__.name, "gradcache_step", {"OMP_NUM_THREADS": "1"}, model_dir=model_dir,
                             batch_file=batch_file, chunk=chunk)
    except RuntimeError as err:
        return {"chunk": chunk, "batch": BIG_BATCH, "error": str(err)[-2000:]}


def print_table(t: dict) -> None:
    print(f"\nA. throughput, {t['size']} backbone, batch {t['batch']}, {t['steps']} steps (best of the runs)")
    print(f"{'mode':<14} {'steady pairs/s':>14} {'end-to-end':>11} {'CPU s/1k pairs':>15} {'others':>7} "
          f"{'final loss':>10}  notes")
    pairs = t["steps"] * t["batch"]
    for mode, r in t["best"].items():
        if "error" in r:
            print(f"{mode:<14} failed: {r['error'][-300:]}")
            continue
        notes = (f"backend {r['backend']}, ZeRO {r['zero_stage']}, {r['world_size']} workers, ray.init {r['init']:.1f} s"
                 if "backend" in r else "")
        print(f"{mode:<14} {r['pairs_per_s_steady']:>14.1f} {r['pairs_per_s_end_to_end']:>11.1f} "
              f"{1000 * r['cpu'] / pairs:>15.2f} {r['others_cores']:>7.2f} {r['final_loss']:>10.3f}  {notes}")
    for k, v in t["ratios"].items():
        print(f"  {k}: {v:.2f}x")


def plot(path: str, report: dict) -> None:
    plt = pyplot()
    if plt is None:
        return

    panels = report["throughput"]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 3.8))
    for ax, t in zip(axes, panels, strict=False):
        modes = [m for m, r in t["best"].items() if "error" not in r]
        steady = [t["best"][m]["pairs_per_s_steady"] for m in modes]
        e2e = [t["best"][m]["pairs_per_s_end_to_end"] for m in modes]
        xs = range(len(modes))
        ax.bar([x - 0.2 for x in xs], steady, width=0.4, label="steady state")
        ax.bar([x + 0.2 for x in xs], e2e, width=0.4, label="end to end")
        ax.set_xticks(list(xs), modes, rotation=20, fontsize=8)
        ax.set_ylabel("pairs/s")
        ax.set_title(f"{t['size']} backbone, batch {t['batch']}, {t['steps']} steps", fontsize=9)
        ax.legend(fontsize=8)
    mem = [m for m in report["memory"] if "error" not in m]
    ax = axes[-1]
    ax.bar([f"chunk {m['chunk']}" if m["chunk"] else "plain" for m in mem], [m["peak_rss"] / 2**30 for m in mem])
    ax.set_ylabel("peak RSS (GiB)")
    ax.set_title(f"one step at batch {mem[0]['batch'] if mem else '?'}: GradCache vs plain", fontsize=9)
    fig.suptitle("benchmarks.speed.train on dev-cpu (2 cores)", fontsize=9)
    save_figure(fig, path, dpi=110)


def main() -> None:
    parser = make_parser(__spec__.name, __doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender (the best is reported)")
    parser.add_argument("--quiet-wait", type=float, default=0.0, help="wait up to this many s for a quiet machine")
    parser.add_argument("--work", default="/tmp/madr_bench_train")
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--skip", choices=("throughput", "memory"), default=None)
    args = parser.parse_args()
    report: dict = {"command": run_command(__spec__.name), "throughput": [], "memory": [],
                    "machine": {"machine": machine_line(), **versions("torch", "ray", "deepspeed", "transformers"),
                                "load_avg_start": os.getloadavg()}}
    print(json.dumps(report["machine"]), flush=True)
    if args.skip != "throughput":
        for size in SIZES:
            args.size = size
            report["throughput"].append(throughput(args))
            print_table(report["throughput"][-1])
    if args.skip != "memory":
        model_dir, batch_file = memory_inputs(f"{args.work}/b")
        for chunk in CHUNKS:
            report["memory"].append(memory(model_dir, batch_file, chunk))
            print(json.dumps(report["memory"][-1]), flush=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    if args.out:
        write_json(args.out, report)
    if args.plot and report["throughput"]:
        plot(args.plot, report)


if __name__ == "__main__":
    main()
