"""Issue 27: which distillation setting keeps the e5 teacher's cross-lingual top-1 in a 3-layer query student.

The serving pair of `benchmarks.quality.multilingual_e5` kept ~52% of its teacher's cross-lingual top-1. This
script isolates the query tower's distillation (paper 004 Sec. V-A): one teacher, one set of query-side training
texts, its outputs cached once (`madr.training.teacher_targets`), and one 3-layer student per arm, each
distilled for `student.steps` steps x `student.batch_size` with `student.learning_rate`:

    --arm NAME:LOSS:LAYERS   e.g. mse_first3:mse:0,1,2 (today's recipe), cosine_first3:cosine:0,1,2,
                             mse_spread:mse:0,6,11; LOSS "cosine+kl" adds the in-batch score KL
                             (`student.similarity_weight`, default 1 here)

Teacher: `--teacher DIR` (a saved `BiEncoder`, e.g. the benchmark's `bench.save_models` output) or, by
default, e5 itself through madr (the zero-shot start: the same weights with "query: " / "passage: "), which
isolates the distillation question from the teacher's training. Each arm records the curve (held-out
student-teacher L2 and cross-lingual top-1 of the student's queries against the teacher's documents on
`student.probe_sources` held-out sources (0: all), every `student.eval_every` steps) and, at the end, top-1 on every
held-out source; top-1 kept = student / teacher. The training texts may be capped (`--max-texts`, an even
sample of the same mix). The cached targets and each finished arm are kept under
`output_dir` and the results JSON, so a rerun skips them.

    python -m benchmarks.quality.distil_e5 --threads 1 --set student.steps=300 --max-texts 6000 \
        --set real_data.parallel_languages='[deu,fra,...]' --tag distil_e5_small
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.quality.multilingual import prepare, settings, train_model, write_result
from madr.data.records import MultilingualData
from madr.losses import DistillationCosineLoss, DistillationMSELoss
from madr.modeling.model import BiEncoder
from madr.recipes.multitask.data import held_out_query_texts, query_side_texts
from madr.recipes.multitask.encoders import HELD_OUT_DISTANCE_TEXTS, xling_probe
from madr.training.distill import distill, make_student
from madr.training.teacher_targets import TeacherTargets, cache_teacher_targets

DEFAULT_ARMS = (
    "mse_first3:mse:0,1,2",
    "cosine_first3:cosine:0,1,2",
    "mse_spread:mse:0,6,11",
    "cosine_spread:cosine:0,6,11",
)
LOSSES = ("mse", "cosine", "cosine+kl")


def parse_arm(text: str) -> dict[str, Any]:
    """`NAME:LOSS:i,j,k` -> {name, loss, layers}; SystemExit naming the bad part."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise SystemExit(f"--arm {text!r}: expected NAME:LOSS:LAYERS, e.g. mse_first3:mse:0,1,2")
    name, loss, layers = parts
    if loss not in LOSSES:
        raise SystemExit(f"--arm {text!r}: loss {loss!r} is not one of {', '.join(LOSSES)}")
    try:
        picks = [int(i) for i in layers.split(",")]
    except ValueError:
        raise SystemExit(f"--arm {text!r}: layers must be comma-separated teacher layer indices") from None
    return {"name": name, "loss": loss, "layers": picks}


def capped_texts(data: MultilingualData, cap: int | None) -> list[str]:
    """The query-side training texts (`query_side_texts`), or an even sample of `cap` of them (the same mix of
    click queries, NLI sentences and translation sentences)."""
    every = query_side_texts(data)
    if cap is None or cap >= len(every):
        return every
    return every[:: len(every) // cap][:cap]


def loss_module(loss: str, cfg) -> torch.nn.Module:
    if loss == "mse":
        return DistillationMSELoss()
    weight = (cfg.student.similarity_weight or 1.0) if loss == "cosine+kl" else 0.0
    return DistillationCosineLoss(weight, cfg.student.similarity_temperature)


def load_teacher(run, path: str | None) -> BiEncoder:
    """A saved BiEncoder, or e5 through madr (the zero-shot start: `steps=0`), word embeddings frozen."""
    if path:
        teacher = BiEncoder.load(path)
        for tower in teacher.towers():
            tower.backbone.get_input_embeddings().weight.requires_grad_(False)
        return teacher.eval()

    cfg = dataclasses.replace(run.cfg, steps=0)
    return train_model(
        cfg, run.tokenizer, run.data, run.cfg.tasks.baseline, 0, {**run.bench, "freeze_word_embeddings": True}
    )[0]


def teacher_targets(teacher: BiEncoder, texts: list[str], path: Path) -> tuple[TeacherTargets, float]:
    """The teacher's query-side outputs for `texts`, from `path` when it holds them all, else computed (and saved)."""
    if path.is_file():
        cached = TeacherTargets.load(path)
        if all(t in cached for t in texts):
            return cached, 0.0
    t0 = time.perf_counter()
    targets = cache_teacher_targets(teacher.query_tower, texts, lambda b: teacher.tokenize(b, "query"))
    seconds = time.perf_counter() - t0
    targets.save(path)
    return targets, seconds


def run_arm(
    run,
    teacher: BiEncoder,
    arm: dict,
    texts: list[str],
    targets: TeacherTargets,
    held: list[str],
    probe,
    final_probe,
    seed: int,
    out: Path,
    run_id: str,
) -> dict[str, Any]:
    """One student distilled as `arm` says; its curve, final top-1 and seconds per step."""
    s = run.cfg.student
    student = make_student(teacher.query_tower, len(arm["layers"]), arm["layers"])
    t0 = time.perf_counter()
    history = distill(
        teacher.query_tower,
        student,
        texts,
        steps=s.steps,
        batch_size=s.batch_size,
        lr=s.learning_rate,
        seed=seed,
        tokenize=lambda b: teacher.tokenize(b, "query"),
        loss=loss_module(arm["loss"], run.cfg),
        targets=targets,
        probe=probe,
        eval_texts=held,
        eval_every=s.eval_every or s.steps,
        checkpoint=out / f"{arm['name']}_seed{seed}_{run_id}.pt",
    )
    seconds = time.perf_counter() - t0
    student.eval()
    with torch.no_grad():
        top1 = final_probe(student)["xling_top1_probe"]
    return {
        **arm,
        "curve": history.curve(),
        "xling_top1": top1,
        "xling_top1_kept": top1 / final_probe.teacher,
        "seconds": seconds,
        "loss_last_20": sum(history.losses[-20:]) / max(1, len(history.losses[-20:])),
    }


def plot(arms: list[dict], teacher_probe: float, path: Path, title: str) -> bool:
    """Held-out distance and probe top-1 kept (student / teacher) against steps, one line per arm."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arm in arms:
        steps = [p["step"] for p in arm["curve"]]
        axes[0].plot(steps, [p["held_out_l2"] for p in arm["curve"]], marker="o", label=arm["name"])
        axes[1].plot(
            steps,
            [p["xling_top1_probe"] / teacher_probe for p in arm["curve"]],
            marker="o",
            label=arm["name"],
        )
    axes[0].set_ylabel("held-out student-teacher L2")
    axes[1].set_ylabel("x-ling top-1 kept (student / teacher, probe slice)")
    axes[1].axhline(0.97, color="grey", ls="--", lw=0.8)
    for ax in axes:
        ax.set_xlabel("distillation steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return True


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(p, ROOT / "configs" / "real" / "multitask_e5.yaml", "distil_e5", seeds=[0])
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    p.add_argument("--arm", action="append", default=None, help=f"NAME:LOSS:LAYERS (default {DEFAULT_ARMS})")
    p.add_argument("--teacher", default=None, help="a saved BiEncoder (default: e5 through madr, untrained)")
    p.add_argument("--max-texts", type=int, default=None, help="cap on the query-side training texts")
    p.add_argument(
        "--held-out-texts",
        type=int,
        default=HELD_OUT_DISTANCE_TEXTS,
        help="held-out query-side texts the student-teacher distance is measured on (about)",
    )
    p.set_defaults(build_backbone=False)  # prepare(): the e5 directory must exist
    args = p.parse_args(argv)
    arms = [parse_arm(a) for a in (args.arm or DEFAULT_ARMS)]
    run = prepare(args)
    seed, out = run.seeds[0], Path(run.cfg.output_dir)
    teacher = load_teacher(run, args.teacher)
    texts = capped_texts(run.data, args.max_texts)
    held = held_out_query_texts(run.data)
    held = held[:: max(1, len(held) // args.held_out_texts)]
    targets, cache_seconds = teacher_targets(
        teacher, texts + held, out / f"teacher_targets_query_{len(texts)}.pt"
    )
    print(
        f"{len(texts)} training + {len(held)} held-out texts; teacher targets in {cache_seconds:.0f} s",
        flush=True,
    )
    t0 = time.perf_counter()
    sources = run.cfg.student.probe_sources or len(run.data.parallel_eval)
    probe = xling_probe(teacher, run.data, "query", sources)
    final = (
        probe
        if sources >= len(run.data.parallel_eval)
        else xling_probe(teacher, run.data, "query", len(run.data.parallel_eval))
    )
    print(
        f"teacher x-ling top-1 {final.teacher:.3f} (probe {probe.teacher:.3f}) in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    partial = Path(args.out_dir) / "results" / f"{args.tag}.partial.json"
    key = json.dumps(
        {**settings(run), "teacher": args.teacher, "max_texts": args.max_texts}, sort_keys=True, default=str
    )
    done = json.loads(partial.read_text()) if partial.is_file() else {}
    results = done.get("arms", {}) if done.get("key") == key else {}
    for arm in arms:
        if arm["name"] in results and results[arm["name"]]["layers"] == arm["layers"]:
            print(f"{arm['name']}: cached in {partial}", flush=True)
            continue
        results[arm["name"]] = run_arm(
            run,
            teacher,
            arm,
            texts,
            targets,
            held,
            probe,
            final,
            seed,
            out,
            hashlib.sha1(key.encode()).hexdigest()[:10],
        )
        print(
            f"{arm['name']}: {json.dumps({k: v for k, v in results[arm['name']].items() if k != 'curve'})}",
            flush=True,
        )
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"key": key, "arms": results}, indent=1))
    ordered = [results[a["name"]] for a in arms]
    result = write_result(
        run,
        __spec__.name,
        [{"seed": seed}],
        args.out_dir,
        args.tag,
        arms=ordered,
        teacher=args.teacher or "e5 through madr (untrained, side prefixes)",
        training_texts=len(texts),
        teacher_target_seconds=cache_seconds,
        teacher_xling_top1=final.teacher,
        teacher_xling_top1_probe=probe.teacher,
        probe_sources=sources,
        held_out_sources=len(run.data.parallel_eval),
    )
    s = run.cfg.student
    plot(
        ordered,
        probe.teacher,
        Path(args.out_dir) / "plots" / f"{args.tag}.png",
        f"3-layer query students of e5 ({s.steps} steps x {s.batch_size}, lr {s.learning_rate}; "
        f"{len(texts)} texts, seed {seed})",
    )
    return result


if __name__ == "__main__":
    main()
