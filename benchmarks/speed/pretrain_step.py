"""Cost of one aspect-pretraining step of MADRAL on multilingual-e5-small, before and after making it cheaper
(issue 26: "make each step cheaper before making more of them ... measure the cost per step before and after").

One config, one batch stream (`CatalogSampler.pretrain_batch` of the Home Depot catalog of
`configs/real/homedepot_hybrid.yaml`), the same seeded model; each variant runs `--steps` optimiser steps after
`--warmup` untimed ones (the memoised variants' warm-up fills their cache with the texts they will see, so their
timed steps are the steady state of a long run, where every text has been seen) and reports seconds per step:

- `mlm_full`: paper 000 Eq. 7 as written, L_MLM (15% masking, the 250k-piece vocabulary projection of a new MLM
  head: e5 ships none) + AP + APP, every unfrozen weight training (the word embeddings and the lowest
  `bench.freeze_layers` layers frozen as in fine-tuning);
- `aspect_only`: `mlm_weight: 0`, AP + APP through the same trained backbone (no masking, no projection);
- `heads_only`: the backbone frozen (`madr.training.freezing.backbone_frozen`), the heads train;
- `heads_memoised`: frozen and memoised (`madr.training.memoised_backbone`): each distinct text runs through
  e5 once, a step costs the heads alone: what `bench.pretrain_frozen_backbone: true` runs.

    python -m benchmarks.speed.pretrain_step --threads 2 --steps 20     # ~6 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import torch

from benchmarks.common.config import ROOT, RUN_OUT
from benchmarks.common.machine import machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.quality.aspect_models.data import catalog_for
from benchmarks.quality.aspect_models.rows import model_config
from benchmarks.quality.homedepot_hybrid import load
from madr.modeling.batching import TextBatch
from madr.modeling.model import build_model
from madr.recipes.aspects.experiment import prepare_tokenizer, prepare_vocabularies
from madr.training.freezing import backbone_frozen, freeze_backbone
from madr.training.loop import CatalogSampler, Optimisation, pretrain_batches
from madr.training.memoised_backbone import memoised_backbones
from madr.training.objectives import pretrain_loss

VARIANTS = ("mlm_full", "aspect_only", "heads_only", "heads_memoised")


def batches(model, catalog, n: int, size: int) -> list[tuple[TextBatch, TextBatch]]:
    """`n` seeded pretraining batches (search terms, titles) with their aspect labels, as the loop draws them."""
    sampler = CatalogSampler(catalog, "train", seed=0)
    return [pretrain_batches(model, sampler, size) for _ in range(n)]


def run_variant(variant: str, cfg, bench: dict, catalog, tokenizer, vocab, steps: int, warmup: int) -> dict:
    """Seconds per step of `variant` (module docstring) over the same `steps` batches for every variant, after
    `warmup` untimed steps (the memoised variant warms up on the timed batches themselves: its steady state)."""
    torch.manual_seed(0)
    model = build_model(model_config(cfg, "madral_pw"), tokenizer, vocab)
    freeze_backbone(model, bool(bench["freeze_word_embeddings"]), int(bench["freeze_layers"]))
    stage = dataclasses.replace(cfg.train.pretrain, mlm_weight=1.0 if variant == "mlm_full" else 0.0)
    timed = batches(model, catalog, steps, stage.batch_size)
    generator = torch.Generator().manual_seed(0)
    with contextlib.ExitStack() as ctx:
        if variant.startswith("heads"):
            ctx.enter_context(backbone_frozen(model, True, bench["pretrain_frozen_params"]))
        memo = ctx.enter_context(memoised_backbones(model)) if variant == "heads_memoised" else []
        params = [p for p in model.parameters() if p.requires_grad]
        first = timed if memo else timed[:warmup]
        optimisation = Optimisation.for_stage(params, dataclasses.replace(stage, steps=len(first) + steps))
        model.train()
        times, losses = [], []
        for i, (qb, db) in enumerate(first + timed):
            t0 = time.perf_counter()
            result = pretrain_loss(model, qb, db, stage, generator)
            optimisation.step(result.total)
            if i >= len(first):
                times.append(time.perf_counter() - t0)
                losses.append(result.parts["loss"])
    return {"s_per_step": sum(times) / len(times), "min_s": min(times),
            "trained_weights": sum(p.numel() for p in params), "final_loss": losses[-1],
            "cache_hits": memo[0].hits if memo else None}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "real" / "homedepot_hybrid.yaml"))
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--tag", default="pretrain_step")
    p.add_argument("--out-dir", default=str(RUN_OUT))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    home, cfg, bench = load(Path(args.config), args.set)
    catalog = catalog_for(home, cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    vocab = prepare_vocabularies(cfg, catalog, tokenizer)
    rows = {}
    for variant in args.variants:
        rows[variant] = run_variant(variant, cfg, bench, catalog, tokenizer, vocab, args.steps, args.warmup)
        print(f"{variant}: {json.dumps(rows[variant])}", flush=True)
    base_name = "mlm_full" if "mlm_full" in rows else next(iter(rows))
    base = rows[base_name]
    lines = [f"| variant | s / step | vs {base_name} | trained weights |", "|---|---|---|---|"]
    lines += [f"| {v} | {r['s_per_step']:.3f} | {base['s_per_step'] / r['s_per_step']:.1f}x | {r['trained_weights']:,} |"
              for v, r in rows.items()]
    info = machine_info()
    print("\n".join(lines) + "\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "rows": rows,
              "batch_size": cfg.train.pretrain.batch_size, "steps": args.steps, "machine": info, "table": "\n".join(lines)}
    print(f"wrote {write_result_json(Path(args.out_dir), args.tag, result)}")
    return result


if __name__ == "__main__":
    main()
