"""Issue 27: a multilingual encoder a user would choose over the untouched multilingual-e5-small.

Same data loader and metrics as `benchmarks.quality.multilingual` (issue 10), with the recipe that adds to e5
instead of truncating it (`configs/real/multitask_e5.yaml`):
- teacher: the full 12-layer e5 fine-tuned with its own conventions ("query: " / "passage: " prefixes via
  `model.text_prefixes`, mean pooling) on clicks (XGLUE QADSM + QAM), NLI (XNLI-de + SNLI) and Tatoeba
  translation pairs of every language in the file, proportional schedule (paper 004 Sec. III-B);
- serving pair (paper 004 Sec. V-A): the teacher's document tower cut to `student.doc_layers` (6) and its
  query tower cut to `student.num_layers` (3) layers, each distilled with the L2 loss on its side's training
  texts (every language); and the 3-layer query student beside the teacher's own document tower. The
  `student:` settings of issue 27 (layer picks, cosine loss, cached teacher targets, `eval_every` curves with a
  resumable checkpoint) apply; with `student.eval_every` the curves go to the JSON (`distil_curves`) and to
  plots/<tag>_distil.png.

Rows a user would set up instead, from the same run on the same held-out items: random scores, BM25 on e5's
word pieces, the untouched e5 with its own recipe (symmetric tasks take "query: " on both sides, ads
"passage: "), and BM25 + e5 fused with one weight per task chosen on HELD-IN training items only (clicks: global
z-scores; translation: per-source min-max over the candidates). The zero-shot start (e5 through madr's encoder
with side prefixes, what training starts from) is a row too.

Paired bootstrap (2,000 resamples of the held-out items, per seed): teacher minus untouched e5, serving pair
minus teacher. Encode latency (1 torch thread, on `bench.latency_texts` held-out texts): per query one text at
a time through each query tower, per document in batches of 64 through each document tower; the plot puts
quality against query latency.

    flock /tmp/madr_bench.lock python -m benchmarks.quality.multilingual_e5 --threads 2
    python -m benchmarks.quality.multilingual_e5 --seeds 0 --set steps=3 --set student.steps=2 --tag smoke
    # the teachers only (no distillation, no evaluation), saved under output_dir/seed<N>/teacher for
    # `benchmarks.quality.multilingual_int8 --model-dir`:
    python -m benchmarks.quality.multilingual_e5 --set student.enabled=false --set bench.save_models=true \
        --set bench.evaluate=false --set output_dir=runs/real_multitask_e5_teacher --tag real_multitask_e5_teacher

Each finished seed is cached in benchmarks/results/<tag>.partial.json and skipped when the command is rerun
(delete it to start over); writes benchmarks/results/<tag>.json and benchmarks/plots/<tag>.png.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.stats import seed_mean_std
from benchmarks.quality import multilingual_scores as item
from benchmarks.quality.multilingual import (
    e5_reference_embedder,
    madr_item_scores,
    prepare,
    seed_runs,
    settings,
    summarise,
    train_model,
    write_result,
)
from benchmarks.quality.multilingual_fusion import fused_rows
from madr.data.records import MultilingualData
from madr.metrics import roc_auc
from madr.modeling.backbone import resolve_backbone_path
from madr.modeling.wheel_e5 import PACKAGES
from madr.recipes.multitask.data import doc_text
from madr.recipes.multitask.encoders import distil_query_student
from madr.training.distill import attach_query_student, num_layers

E5 = "untouched multilingual-e5-small (12 layers, its own prefixes, mean pooling)"
BM25 = "BM25 (e5 word pieces)"
FUSION = "BM25 + untouched e5 (weight per task tuned on held-in items)"
ZERO_SHOT = "zero-shot start (e5 through madr, side prefixes)"
TEACHER = "multi-task e5 teacher (12 layers)"
PAIR = "serving pair: 6-layer docs, 3-layer query student"
STUDENT_ONLY = "3-layer query student, teacher's 12-layer docs"
SEEDED = (TEACHER, PAIR, STUDENT_ONLY)
COLUMNS = (("click_auc", "Click AUC"), ("click_auc_qadsm", "QADSM AUC"), ("click_auc_qam", "QAM AUC"),
           ("nli_auc_en", "SNLI AUC (en)"), ("nli_auc_xx", "XNLI AUC (de)"), ("nli_auc_all3", "NLI AUC 3-way"),
           ("xling_top1", "X-ling top-1"))
ISSUE_ASK = "issue 27: click task on QADSM + QAM, translation over every Tatoeba language"


# ---- latency -----------------------------------------------------------------------------------------------------


@torch.no_grad()
def encode_ms(model, texts: Sequence[str], side: str, batch_size: int) -> float:
    """Median milliseconds per text of `model.encode_texts` on `texts` (1 torch thread), in batches of
    `batch_size` (1: a live query), after one warm-up batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.encode_texts(list(texts[:batch_size]), side, batch_size)
        per = []
        for i in range(0, len(texts), batch_size):
            chunk = list(texts[i:i + batch_size])
            t0 = time.perf_counter()
            model.encode_texts(chunk, side, batch_size)
            per.append((time.perf_counter() - t0) * 1000 / len(chunk))
        return float(np.median(per))
    finally:
        torch.set_num_threads(threads)


def latency(model, data: MultilingualData, order: Sequence[str], n: int) -> dict[str, float]:
    """Query ms (one at a time) and document ms (batches of 64) of `model`'s towers on held-out texts, on this
    CPU (a copy of the model, 1 thread) and, for a model on a GPU, there too (`*_gpu`; fp32, each batch waited
    for: `encode_texts` returns its vectors on the CPU)."""
    queries = [r.query for r in data.clicks_eval][:n]
    docs = [doc_text(r, order) for r in data.clicks_eval][:n]
    device = next(model.parameters()).device
    cpu = copy.deepcopy(model).cpu() if device.type != "cpu" else model
    out = {"query_ms": encode_ms(cpu, queries, "query", 1), "doc_ms": encode_ms(cpu, docs, "doc", 64),
           "query_layers": float(num_layers(model.query_tower)), "doc_layers": float(num_layers(model.doc_tower))}
    if device.type == "cuda":
        out.update(query_ms_gpu=encode_ms(model, queries, "query", 1), doc_ms_gpu=encode_ms(model, docs, "doc", 64))
    return out


# ---- rows -------------------------------------------------------------------------------------------------------


def memoised(embed: item.Embedder) -> item.Embedder:
    """`embed` with each (text, role) embedded once: the e5 row and the fusion row share their texts."""
    cache: dict[tuple[str, str], torch.Tensor] = {}

    def wrapped(texts: list[str], role: str) -> torch.Tensor:
        new = list(dict.fromkeys(t for t in texts if (t, role) not in cache))
        if new:
            cache.update({(t, role): v for t, v in zip(new, embed(new, role), strict=True)})
        return torch.stack([cache[(t, role)] for t in texts])

    return wrapped


def click_source_metrics(scores: dict[str, np.ndarray], data: MultilingualData) -> dict[str, float]:
    """Click AUC per click source: QAM records have a `passage` field, QADSM ones a title."""
    out = {}
    qam = np.array(["passage" in r.fields for r in data.clicks_eval])
    rel = np.array([bool(r.relevance) for r in data.clicks_eval])
    for name, rows in (("qadsm", ~qam), ("qam", qam)):
        if rows.any() and "click" in scores:
            out[f"click_auc_{name}"] = roc_auc(scores["click"][rows], rel[rows])
    return out


def row_metrics(scores: dict[str, np.ndarray], data: MultilingualData, ks: Sequence[int]) -> dict[str, float]:
    return {**item.metrics(scores, data, ks), **click_source_metrics(scores, data)}


def shared_rows(cfg, bench: dict, data: MultilingualData, tokenizer) -> dict[str, Any]:
    """Rows that do not depend on the seed, their item scores (for the paired tests) and the e5 latency."""
    order, ks, bs = cfg.tasks.click.field_order, cfg.eval.ndcg_at, cfg.eval.batch_size
    t0 = time.perf_counter()
    path = resolve_backbone_path(cfg.model.backbone.name_or_path)
    e5 = memoised(e5_reference_embedder(path, cfg.model.max_doc_length, bs, bench.get("device", "cpu")))
    scores = {"Random scores": item.random_scores(data, 0), BM25: item.bm25_scores(tokenizer, data, order),
              E5: item.item_scores(e5, data, order)}
    print(f"e5 and BM25 rows: {time.perf_counter() - t0:.0f} s", flush=True)
    fusion = fused_rows(e5, tokenizer, data, order, bench, seed=0)
    scores[FUSION] = fusion["scores"]
    print(f"+ fusion row: {time.perf_counter() - t0:.0f} s", flush=True)
    start = train_model(dataclasses.replace(cfg, steps=0), tokenizer, data, cfg.tasks.baseline, 0, bench)[0]
    scores[ZERO_SHOT] = madr_item_scores(start, data, order, bs)
    print(f"+ zero-shot row: {time.perf_counter() - t0:.0f} s", flush=True)
    rows = {name: row_metrics(s, data, ks) for name, s in scores.items()}
    lat = {E5: latency(start, data, order, int(bench["latency_texts"]))}
    return {"rows": rows, "scores": scores, "latency": lat, "fusion_weights": fusion["weights"],
            "fusion_held_in": fusion["held_in"], "seconds": time.perf_counter() - t0}


def run_seed(cfg, bench: dict, data: MultilingualData, tokenizer, seed: int, shared: dict) -> dict[str, Any]:
    """Teacher, serving pair and query-student-only rows of one seed, their latency and the paired tests.
    With `student.enabled: false` only the teacher is trained, saved (`bench.save_models`) and evaluated: no
    distillation, no serving-pair rows."""
    order, ks, bs = cfg.tasks.click.field_order, cfg.eval.ndcg_at, cfg.eval.batch_size
    rows, seconds, scores, lat = {}, {}, {}, {}
    t0 = time.perf_counter()
    teacher, training = train_model(cfg, tokenizer, data, cfg.tasks.enabled, seed, bench)
    seconds["train teacher"] = time.perf_counter() - t0
    print(f"seed {seed}: teacher trained in {seconds['train teacher']:.0f} s", flush=True)
    models, reports = {TEACHER: teacher}, {TEACHER: training}
    if cfg.student.enabled:
        t0 = time.perf_counter()
        pair, distilled = distil_query_student(cfg, teacher, data, seed)
        seconds["distil serving pair"] = time.perf_counter() - t0
        print(f"seed {seed}: serving pair distilled in {seconds['distil serving pair']:.0f} s {distilled}",
              flush=True)
        models.update({PAIR: pair, STUDENT_ONLY: attach_query_student(teacher, pair.query_tower).eval()})
        reports[PAIR] = distilled
    if bench.get("save_models"):  # for later distillation / int8 runs: e5-small is ~0.5 GB per model
        for name, label in (("teacher", TEACHER), ("serving_pair", PAIR)):
            if label in models:
                models[label].save(str(Path(cfg.output_dir) / f"seed{seed}" / name))
    for name, model in models.items():
        t0 = time.perf_counter()
        scores[name] = madr_item_scores(model, data, order, bs)
        rows[name] = row_metrics(scores[name], data, ks)
        seconds[f"eval {name}"] = time.perf_counter() - t0
        lat[name] = latency(model, data, order, int(bench["latency_texts"]))
        print(f"seed {seed} {name}: {json.dumps({k: round(v, 4) for k, v in rows[name].items()})[:600]} "
              f"latency {lat[name]}", flush=True)
    draws = int(bench["bootstrap"])
    paired = {"paired_teacher_minus_e5": item.paired_bootstrap(scores[TEACHER], shared["scores"][E5], data, draws,
                                                               seed),
              "paired_teacher_minus_zero_shot": item.paired_bootstrap(scores[TEACHER], shared["scores"][ZERO_SHOT],
                                                                      data, draws, seed)}
    if PAIR in scores:
        paired.update(
            paired_pair_minus_teacher=item.paired_bootstrap(scores[PAIR], scores[TEACHER], data, draws, seed),
            paired_pair_minus_e5=item.paired_bootstrap(scores[PAIR], shared["scores"][E5], data, draws, seed))
    return {"seed": seed, "rows": {**shared["rows"], **rows}, "latency": {**shared["latency"], **lat}, **paired,
            "seconds": seconds, "training": reports}


# ---- seeds, cache, table, plot -------------------------------------------------------------------------------


def plot(mean: dict, latency: dict, path: Path, title: str) -> bool:
    """Click AUC and cross-lingual top-1 against the query encode latency of every encoder row."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (key, label) in zip(axes, (("click_auc", "Click AUC (QADSM + QAM)"), ("xling_top1", "X-ling top-1")),
                                strict=True):
        for name, lat in latency.items():
            ax.scatter(lat["query_ms"], mean[name][key], s=30)
            ax.annotate(name.split(" (")[0][:34], (lat["query_ms"], mean[name][key]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel("query encode ms (1 thread, one query at a time)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return True


def distil_curves(runs: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """seed -> tower -> its distillation curve (`student.eval_every`), from the runs' serving-pair reports."""
    out: dict[str, dict[str, list[dict]]] = {}
    for r in runs:
        report = r.get("training", {}).get(PAIR, {})
        towers = {side: report[f"{side}_curve"] for side in ("query", "doc") if f"{side}_curve" in report}
        if towers:
            out[str(r["seed"])] = towers
    return out


def plot_curves(curves: dict[str, dict[str, list[dict]]], path: Path, title: str) -> bool:
    """Quality vs distillation steps: held-out student-teacher cosine distance and (with `student.probe_sources`)
    the probe slice's cross-lingual top-1, per seed and tower."""
    plt = pyplot()
    if plt is None or not curves:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for seed, towers in curves.items():
        for side, curve in towers.items():
            steps = [p["step"] for p in curve]
            axes[0].plot(steps, [p["held_out_cosine_distance"] for p in curve], marker="o", label=f"{side} s{seed}")
            if all("xling_top1_probe" in p for p in curve):
                axes[1].plot(steps, [p["xling_top1_probe"] for p in curve], marker="o", label=f"{side} s{seed}")
    axes[0].set_ylabel("held-out 1 - cos(student, teacher)")
    axes[1].set_ylabel("x-ling top-1 (probe slice; the other side is the teacher's)")
    for ax in axes:
        ax.set_xlabel("distillation steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return True


def train_only(run, args: argparse.Namespace) -> dict:
    """`bench.evaluate: false`: each seed's teacher (and, with `student.enabled`, its serving pair) trained and
    saved under output_dir/seed<N>/ (needs `bench.save_models`), nothing scored or timed: the models for a
    later evaluation (e.g. `benchmarks.quality.multilingual_int8 --model-dir`). Seeds cached as in `main`."""
    cfg, bench, data, tokenizer = run.cfg, run.bench, run.data, run.tokenizer
    if not bench.get("save_models"):
        raise ValueError("bench.evaluate false trains models only to save them: set bench.save_models true")

    def one(seed: int) -> dict[str, Any]:
        seconds, reports, models = {}, {}, {}
        t0 = time.perf_counter()
        models["teacher"], reports[TEACHER] = train_model(cfg, tokenizer, data, cfg.tasks.enabled, seed, bench)
        seconds["train teacher"] = time.perf_counter() - t0
        print(f"seed {seed}: teacher trained in {seconds['train teacher']:.0f} s", flush=True)
        if cfg.student.enabled:
            t0 = time.perf_counter()
            models["serving_pair"], reports[PAIR] = distil_query_student(cfg, models["teacher"], data, seed)
            seconds["distil serving pair"] = time.perf_counter() - t0
        saved = {name: str(model.save(Path(cfg.output_dir) / f"seed{seed}" / name)) for name, model in models.items()}
        print(f"seed {seed}: saved {saved}", flush=True)
        return {"seed": seed, "seconds": seconds, "training": reports, "saved": saved}

    key = json.dumps(settings(run), sort_keys=True, default=str)
    runs = seed_runs(run.seeds, one, Path(args.out_dir) / "results" / f"{args.tag}.partial.json", data.summary, [],
                     key)
    return write_result(run, __spec__.name, runs, args.out_dir, args.tag, issue=ISSUE_ASK + " (models only)")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "multitask_e5.yaml", "real_multitask_e5")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    p.add_argument("--build-backbone", action="store_true", help="build the e5 directory first if it is missing")
    args = p.parse_args(argv)
    run = prepare(args)
    cfg, bench, data, tokenizer = run.cfg, run.bench, run.data, run.tokenizer
    if not bench.get("evaluate", True):
        return train_only(run, args)
    shared = shared_rows(cfg, bench, data, tokenizer)
    print(f"shared rows ({shared['seconds']:.0f} s): {json.dumps(shared['rows'], default=float)[:1500]}", flush=True)
    kept = {k: v for k, v in bench.items() if k not in ("seeds", "save_models")}  # what the numbers depend on
    key = json.dumps({**settings(run), "bench": kept}, sort_keys=True, default=str)
    runs = seed_runs(run.seeds, lambda seed: run_seed(cfg, bench, data, tokenizer, seed, shared),
                     Path(args.out_dir) / "results" / f"{args.tag}.partial.json", data.summary, [], key)
    mean, std, text = summarise(runs, set(SEEDED), COLUMNS)
    lat_mean, _ = seed_mean_std([r["latency"] for r in runs])
    result = write_result(run, __spec__.name, runs, args.out_dir, args.tag, issue=ISSUE_ASK,
                          shared_seconds=shared["seconds"], fusion_weights=shared["fusion_weights"],
                          fusion_held_in=shared["fusion_held_in"], mean=mean, std=std, latency=lat_mean, table=text,
                          e5_wheels=list(PACKAGES.values()), distil_curves=distil_curves(runs))
    budget = f"{cfg.steps} steps x {cfg.schedule.batch_size}"
    if plot(mean, lat_mean, Path(args.out_dir) / "plots" / f"{args.tag}.png",
            f"multilingual-e5-small teacher and its distilled towers ({budget}; seeds {result['seeds']})"):
        print(f"plot: {Path(args.out_dir) / 'plots' / f'{args.tag}.png'}")
    curve_png = Path(args.out_dir) / "plots" / f"{args.tag}_distil.png"
    if plot_curves(result["distil_curves"], curve_png, f"distillation curves ({cfg.student.loss} loss, "
                   f"{cfg.student.steps} steps x {cfg.student.batch_size}; seeds {result['seeds']})"):
        print(f"plot: {curve_png}")
    return result


if __name__ == "__main__":
    main()
