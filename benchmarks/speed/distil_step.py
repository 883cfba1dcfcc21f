"""Seconds per query-tower distillation step on multilingual-e5-small, live teacher vs cached teacher targets
(issue 27: the frozen 12-layer teacher ran on every step although its outputs never change).

One teacher (e5 through madr, word embeddings frozen, as in `benchmarks.quality.multilingual_e5`), one 3-layer
student per variant from the same weights, the same seeded batches of `--batch` query-side training texts;
each variant runs `--warmup` untimed then `--steps` timed `distill` steps (constant lr, L2 loss):

- `live`: the teacher encodes each batch (eval mode, no grad) and the student learns from it (today);
- `cached`: `cache_teacher_targets` encoded every text of the timed batches once beforehand (timed apart, per
  text: paid once per text, not once per step); a step looks the targets up and costs the student only.

    python -m benchmarks.speed.distil_step --threads 1 --steps 5
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.quality.distil_e5 import load_teacher
from benchmarks.quality.multilingual import prepare, write_result
from madr.recipes.multitask.data import query_side_texts
from madr.training.distill import distill, make_student
from madr.training.teacher_targets import cache_teacher_targets


def seconds_per_step(teacher, texts: list[str], steps: int, warmup: int, batch: int, targets=None) -> float:
    """Wall seconds per timed step (the warm-up steps' time subtracted: a run of warmup, then of warmup+steps)."""

    def tokenize(b: list[str]) -> dict[str, torch.Tensor]:
        return teacher.tokenize(b, "query")

    times = []
    for n in (warmup, warmup + steps):
        torch.manual_seed(0)
        student = make_student(teacher.query_tower, 3)
        t0 = time.perf_counter()
        distill(
            teacher.query_tower,
            student,
            texts,
            steps=n,
            batch_size=batch,
            lr=1e-4,
            tokenize=tokenize,
            targets=targets,
        )
        times.append(time.perf_counter() - t0)
    return (times[1] - times[0]) / steps


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(p, ROOT / "configs" / "real" / "multitask_e5.yaml", "distil_step", seeds=[0])
    p.add_argument("--out-dir", default=str(RUN_OUT))
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.set_defaults(build_backbone=False)  # prepare(): the e5 directory must exist
    args = p.parse_args(argv)
    run = prepare(args)
    teacher = load_teacher(run, None)
    # the texts the timed runs draw: distill's seeded order over these, (warmup + steps) batches of them
    texts = query_side_texts(run.data)[::7][: (args.warmup + args.steps) * args.batch]
    live = seconds_per_step(teacher, texts, args.steps, args.warmup, args.batch)
    t0 = time.perf_counter()
    targets = cache_teacher_targets(teacher.query_tower, texts, lambda b: teacher.tokenize(b, "query"))
    cache_s = time.perf_counter() - t0
    cached = seconds_per_step(teacher, texts, args.steps, args.warmup, args.batch, targets)
    rows = {
        "live_s_per_step": live,
        "cached_s_per_step": cached,
        "speedup": live / cached,
        "cache_ms_per_text": 1000 * cache_s / len(texts),
        "texts_cached": len(texts),
    }
    print(rows, flush=True)
    return write_result(
        run,
        __spec__.name,
        [{"seed": 0}],
        args.out_dir,
        args.tag,
        steps=args.steps,
        warmup=args.warmup,
        batch=args.batch,
        threads=args.threads,
        **rows,
    )


if __name__ == "__main__":
    main()
