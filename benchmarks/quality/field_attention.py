"""Real data: click documents by concatenated fields vs query-dependent field attention (paper 004 Sec. IV).

Paper 004 Sec. IV embeds a document with several text entities either by concatenating them into one text
(a fixed vector, indexable) or by encoding each entity and attending to them with the query, Eq. 8-9
(`f(d) = sum_k alpha_k f(d^k)`, `alpha = softmax_k a(q, d^k)`), and expects the attention to do better where
a field is noisy. Here the multi-task row of `benchmarks.quality.multilingual` (configs/real/multitask.yaml:
click + NLI + translation, the same steps, batch, optimiser and start weights) is trained twice per seed:

- concatenation: `tasks.click.field_attention: null`, the ad's title and description joined into one text;
- attention: `tasks.click.field_attention: <scorer>` (default additive, the Bahdanau net paper 004 cites),
  title and description encoded separately by the doc tower and attended by the query, in training (the
  triplet task's documents) and in evaluation (held-out click pairs).

Both are scored on the same held-out items (click AUC / NDCG@5, NLI AUC, cross-lingual top-1) and compared
with the paired bootstrap of the multi-task benchmark (attention minus concatenation, per seed). The attention
weights on the held-out click pairs are recorded (mean weight on the title, its spread over pairs) to show
whether the attention learned anything beyond a fixed mix. No student, no shared rows: those are the
multi-task benchmark's.

    OMP_NUM_THREADS=1 flock /tmp/madr_bench.lock python -m benchmarks.quality.field_attention --threads 1

Writes benchmarks/results/<tag>.json (`--merge` adds seeds from earlier JSONs; <tag>.partial.json after
every seed). `--initial-weights` only prints the untrained attention's weights per seed (the start of training).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import seed_mean_std
from benchmarks.quality.multilingual import (
    encoder,
    load_config,
    madr_item_scores,
    seed_runs,
    table,
    train_model,
)
from benchmarks.quality.multilingual_scores import metrics, paired_bootstrap
from madr.data.records import MultilingualData
from madr.data.sources.real_multilingual import load_real_multilingual
from madr.modeling.heads.field_attention import SCORERS
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.encoders import build_tokenizer
from madr.recipes.multitask.experiment import row_labels

CONCAT = "Multi-task, concatenated fields"


def attention_label(scorer: str) -> str:
    return f"Multi-task, field attention ({scorer})"


def with_attention(cfg: MultiTaskExperimentConfig, scorer: str | None) -> MultiTaskExperimentConfig:
    """`cfg` with `tasks.click.field_attention` set to `scorer` (None: concatenation)."""
    click = dataclasses.replace(cfg.tasks.click, field_attention=scorer)
    return dataclasses.replace(cfg, tasks=dataclasses.replace(cfg.tasks, click=click))


def attention_weights(model, data: MultilingualData, order: list[str], batch_size: int) -> dict[str, float]:
    """Eq. 9's alpha on the held-out click pairs: mean and spread of the first field's weight where every
    field is present, and the share of such pairs."""
    clicks = data.clicks_eval
    fields = [[r.fields.get(name) or "" for name in order] for r in clicks]
    alpha = model.encode_field_documents([r.query for r in clicks], fields, batch_size).weights.numpy()
    full = np.array([all(t.strip() for t in row) for row in fields])
    first = alpha[full, 0]
    return {f"alpha_{order[0]}_mean": float(first.mean()), f"alpha_{order[0]}_std": float(first.std()),
            f"alpha_{order[0]}_min": float(first.min()), f"alpha_{order[0]}_max": float(first.max()),
            "pairs_with_every_field": float(full.mean())}


def initial_weights(cfg: MultiTaskExperimentConfig, bench: dict, data: MultilingualData, tokenizer,
                    seeds: list[int], scorer: str) -> dict[int, dict[str, float]]:
    """`attention_weights` of the untrained attention model of each seed (what training starts from)."""
    vcfg, out = with_attention(cfg, scorer), {}
    for seed in seeds:
        model = encoder(vcfg, tokenizer, seed, bench["pooling"]).eval()
        out[seed] = attention_weights(model, data, vcfg.tasks.click.field_order, vcfg.eval.batch_size)
        print(f"seed {seed} untrained {scorer} attention: {json.dumps(out[seed])}", flush=True)
    return out


def run_seed(cfg: MultiTaskExperimentConfig, bench: dict, data: MultilingualData, tokenizer, seed: int,
             scorer: str) -> dict[str, Any]:
    """Both multi-task variants of one seed, their held-out metrics and the paired bootstrap."""
    order, bs = cfg.tasks.click.field_order, cfg.eval.batch_size
    tasks = cfg.tasks.enabled
    rows, seconds, training, scores, weights = {}, {}, {}, {}, {}
    for name, variant in ((CONCAT, None), (attention_label(scorer), scorer)):
        vcfg = with_attention(cfg, variant)
        t0 = time.perf_counter()
        model, training[name] = train_model(vcfg, tokenizer, data, tasks, seed, bench)
        seconds[f"train {name}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores[name] = madr_item_scores(model, data, order, bs)
        rows[name] = metrics(scores[name], data, cfg.eval.ndcg_at)
        if variant is not None:
            weights[name] = attention_weights(model, data, order, bs)
        seconds[f"eval {name}"] = time.perf_counter() - t0
        print(f"seed {seed} {name} ({seconds[f'train {name}']:.0f} s): "
              f"{json.dumps({k: round(v, 4) for k, v in rows[name].items()})} {weights.get(name, '')}", flush=True)
        del model
    paired = paired_bootstrap(scores[attention_label(scorer)], scores[CONCAT], data, int(bench["bootstrap"]), seed)
    return {"seed": seed, "rows": rows, "paired_attention_minus_concat": paired, "attention_weights": weights,
            "seconds": seconds, "training": training}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "multitask.yaml", "real_field_attention")
    p.add_argument("--scorer", default="additive", choices=SCORERS, help="a(q, d) of Eq. 9")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ goes under it")
    p.add_argument("--merge", nargs="+", default=[], metavar="JSON", help="add the seeds of earlier runs' JSON")
    p.add_argument("--initial-weights", action="store_true",
                   help="only print the untrained attention's weights on the held-out pairs per seed (no training)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    real, cfg, bench = load_config(Path(args.config), args.set)
    if cfg.tasks.click.field_attention is not None:
        raise SystemExit(f"{args.config}: tasks.click.field_attention must be null here (the script sets it)")
    seeds = args.seeds if args.seeds is not None else list(bench["seeds"])
    start, load_before = time.perf_counter(), load_average()
    data = load_real_multilingual(real)
    tokenizer = build_tokenizer(cfg, data, Path(cfg.output_dir))
    print(json.dumps(data.summary), flush=True)
    if args.initial_weights:
        return {"initial_weights": initial_weights(cfg, bench, data, tokenizer, seeds, args.scorer)}
    partial = Path(args.out_dir) / "results" / f"{args.tag}.partial.json"
    runs = seed_runs(seeds, lambda seed: run_seed(cfg, bench, data, tokenizer, seed, args.scorer), partial,
                     data.summary, args.merge)
    mean, std = seed_mean_std([r["rows"] for r in runs])
    text = table(mean, std, set(mean))
    print(text)
    result = {"command": run_command(__spec__.name), "multi_task_row": row_labels(cfg)[1], "scorer": args.scorer,
              "config": {"real_data": dataclasses.asdict(real), "bench": bench, **cfg.to_dict()},
              "machine": machine_info(load_average=load_average()), "load_average_before": load_before, "sizes": data.summary,
              "seeds": [r["seed"] for r in runs], "wall_s": time.perf_counter() - start, "runs": runs,
              "mean": mean, "std": std, "table": text}
    out = write_result_json(args.out_dir, args.tag, result)
    partial.unlink(missing_ok=True)
    print(f"wrote {out} ({result['wall_s']:.0f} s; load {load_before} -> {result['machine']['load_average']})")
    return result


if __name__ == "__main__":
    main()
