"""The report of the multi-aspect product-search tables: seed aggregates, the paired tests (every row against
the baseline, the fusions against Weighted Sum, the MURAL family against MADRAL, the ablations against their
full model), the tables in the papers' shapes and the bar plot."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.stats import mean_std, paired_tests
from benchmarks.quality.aspect_models.evaluation import means
from benchmarks.quality.aspect_models.rows import ABLATION_BASES, FUSIONS, MURAL_VS
from madr.config import ExperimentConfig


def significance(rows: dict[str, dict[str, dict[str, float]]], base: str, draws: int) -> dict[str, dict]:
    """{row: {metric: paired tests of row - base}} for every row but `base`."""
    return {key: {m: paired_tests(rows[key][m], rows[base][m], draws) for m in rows[base]}
            for key in rows if key != base and base in rows}


def seed_mean(runs: list[dict], shared: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per row and metric, the per-query value averaged over seeds (the references have one value)."""
    rows = dict(shared)
    for key in runs[0]["per_query"]:
        rows[key] = {m: {q: float(np.mean([r["per_query"][key][m][q] for r in runs])) for q in v}
                     for m, v in runs[0]["per_query"][key].items()}
    return rows


def header(m: str) -> str:
    name, _, k = m.partition("@")
    return {"recall": "R", "ndcg": "NDCG", "mrr": "MRR", "auc": "AUC"}.get(name, name) + (f"@{k}" if k else "")


def value_table(order: list[str], labels: dict, mean: dict, std: dict, metrics: list[str], seeded: set) -> str:
    lines = ["| Model | " + " | ".join(header(m) for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for key in order:
        cells = [f"{mean[key][m]:.4f}" + (f" ± {std[key][m]:.4f}" if key in seeded and std[key][m] > 0 else "")
                 for m in metrics]
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_table(order: list[str], labels: dict, mean: dict, metrics: list[str], base: str, tests: dict,
                   alpha: float) -> str:
    """Paper 000 Tables 4 / 7: change relative to `base` in %, † where the paired t-test has p < alpha."""
    lines = ["| Model | " + " | ".join(header(m) for m in metrics) + " |", "|---|" + "---|" * len(metrics)]
    for key in order:
        cells = []
        for m in metrics:
            b = mean[base][m]
            rel = 100.0 * (mean[key][m] - b) / b if b else math.nan
            mark = "†" if key != base and tests.get(key, {}).get(m, {}).get("p_ttest", 1.0) < alpha else ""
            cells.append(f"{rel:+.2f}%{mark}")
        lines.append(f"| {labels[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aspect_table(order: list[str], labels: dict, acc: dict, aspects: list[str]) -> str:
    """Paper 000 Table 5: Accuracy@1 per aspect, queries then documents."""
    cols = [f"{side}_acc@1_{a}" for side in ("query", "doc") for a in aspects]
    lines = ["| Model | " + " | ".join(f"{c.split('_')[0]} {c.rsplit('_', 1)[1]}" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for key in order:
        if acc.get(key):
            lines.append(f"| {labels[key]} | " + " | ".join(f"{acc[key][c]:.3f}" if c in acc[key] else "-"
                                                             for c in cols) + " |")
    return "\n".join(lines)


def plot(order: list[str], labels: dict, runs: list[dict], shared_means: dict, path: Path, title: str,
         metrics: tuple[str, ...], base: str) -> bool:
    """Bars of each metric per row: seed mean with the seeds' std, every seed as a dot, the baseline dashed;
    the y axis is zoomed on the values (re-ranking metrics of all rows lie within a few points)."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.6))
    x = np.arange(len(order))
    for ax, m in zip(np.atleast_1d(axes), metrics, strict=True):
        vals = [[shared_means[k][m]] if k in shared_means else [means(r["per_query"][k])[m] for r in runs]
                for k in order]
        ax.bar(x, [np.mean(v) for v in vals], yerr=[np.std(v, ddof=1) if len(v) > 1 else 0 for v in vals],
               capsize=3, color=["#999999" if k in shared_means else "#4c72b0" for k in order])
        for i, v in enumerate(vals):
            ax.scatter([i] * len(v), v, s=8, color="black", zorder=3)
        if base in order:
            ax.axhline(np.mean(vals[order.index(base)]), color="#c44e52", lw=0.8, ls="--")
        flat = [x for v in vals for x in v]
        pad = max(0.02, 0.15 * (max(flat) - min(flat)))
        ax.set_ylim(max(0.0, min(flat) - 3 * pad), min(1.0, max(flat) + pad))
        ax.set_xticks(x, [labels[k].replace(" (", "\n(") for k in order], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"test {header(m)}")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(textwrap.fill(title, 150), fontsize=8)
    save_figure(fig, path, dpi=110)
    return True


@dataclass
class Invocation:
    """What every (partial) report of one run of the script shares."""

    cfg: ExperimentConfig
    home: dict | None
    bench: dict
    keys: list[str]             # rows in table order
    trained: list[str]          # the seeded rows among them
    labels: dict[str, str]
    sizes: dict[str, Any]       # EvalSet.summary + vocabulary sizes and token lengths
    shared: dict                # per-query metrics of the untrained reference rows
    shared_seconds: dict
    start: float                # perf_counter at the start
    load_before: str
    out_dir: Path
    tag: str


def aggregate(ctx: Invocation, runs: list[dict]) -> dict[str, Any]:
    """Per row: mean / std over seeds of the per-seed means, aspect accuracy; paired tests against the
    baseline (and fusions against Weighted Sum) on the seed-mean per query, and per seed."""
    shared_means = {k: means(v) for k, v in ctx.shared.items()}
    mean, std = dict(shared_means), {k: {m: 0.0 for m in v} for k, v in shared_means.items()}
    for key in ctx.trained if runs else []:
        per_seed = [means(r["per_query"][key]) for r in runs]
        pairs = {m: mean_std([s[m] for s in per_seed]) for m in per_seed[0]}
        mean[key], std[key] = {m: p[0] for m, p in pairs.items()}, {m: p[1] for m, p in pairs.items()}
    acc = {key: {c: float(np.mean([r["aspects"][key][c] for r in runs])) for c in runs[0]["aspects"][key]}
           for key in ctx.trained} if runs else {}
    draws, base = int(ctx.bench["draws"]), ctx.bench["baseline"]
    pooled = seed_mean(runs, ctx.shared) if runs else dict(ctx.shared)
    tests = {"vs_baseline": significance(pooled, base, draws)}
    fusions = [k for k in FUSIONS if k in mean]
    if len(fusions) > 1:
        tests["fusion_vs_weighted_sum"] = significance({k: pooled[k] for k in fusions}, fusions[0], draws)
    family = [k for k in MURAL_VS if k in mean]
    if MURAL_VS[0] in family and len(family) > 1:
        tests["vs_madral"] = significance({k: pooled[k] for k in family}, MURAL_VS[0], draws)
    ablations = {}
    for prefix, ref in ABLATION_BASES.items():
        group = [k for k in mean if k.startswith(prefix)]
        if group and ref in mean:
            ablations[ref] = group
            tests[f"ablations_vs_{ref}"] = significance({k: pooled[k] for k in (ref, *group)}, ref, draws)
    per_seed_tests = {r["seed"]: significance({**ctx.shared, **r["per_query"]}, base, draws) for r in runs}
    return {"shared_means": shared_means, "mean": mean, "std": std, "aspect_accuracy": acc, "tests": tests,
            "tests_per_seed": per_seed_tests, "fusions": fusions, "family": family, "ablations": ablations}


def budget_text(cfg: ExperimentConfig) -> str:
    ft = cfg.train.finetune
    return (f"{ft.steps} fine-tune steps x batch {ft.batch_size} (+1 hard negative), lr {ft.learning_rate:g}, "
            f"aspect weight {ft.aspect_weight:g}" + (f"; pretrain {cfg.train.pretrain.steps} steps"
                                                     if cfg.train.pretrain.steps else "; no pretraining"))


def report_text(ctx: Invocation, agg: dict, seeds: list[int], metrics: list[str], source: str) -> str:
    """The tables in the papers' shapes and the paired tests, as printed and stored in the JSON."""
    cfg, labels, mean, tests = ctx.cfg, ctx.labels, agg["mean"], agg["tests"]
    base, alpha, fusions = ctx.bench["baseline"], float(ctx.bench["alpha"]), agg["fusions"]
    order = [k for k in ctx.keys if k in mean]
    text = [f"# {source} product search, {cfg.eval.split}: {ctx.sizes['evaluated_test_queries']} queries with a "
            f"product of relevance >= {cfg.eval.relevance_threshold:g}, corpus {ctx.sizes['corpus']} products; "
            f"backbone {cfg.model.backbone.name_or_path}, query/doc length {cfg.model.max_query_length}/"
            f"{cfg.model.max_doc_length}; {budget_text(cfg)}; seeds {seeds}",
            "\n## Values (paper 001 Table 3 shape; mean ± std over seeds)",
            value_table(order, labels, mean, agg["std"], metrics, set(ctx.trained))]
    if base in mean:
        text += [f"\n## Relative to {labels[base]} (paper 000 Table 4 shape; † paired t-test p < {alpha:g} on the "
                 f"seed-mean per query)", relative_table(order, labels, mean, metrics, base, tests["vs_baseline"],
                                                         alpha)]
    if len(fusions) > 1:
        text += [f"\n## Fusion networks relative to {labels[fusions[0]]} (paper 000 Table 7 shape)",
                 relative_table(fusions, labels, mean, metrics, fusions[0], tests["fusion_vs_weighted_sum"], alpha)]
    if "vs_madral" in tests:
        text += [f"\n## Relative to {labels[MURAL_VS[0]]} (paper 001 Table 3 shape; † paired t-test p < {alpha:g})",
                 relative_table(agg["family"], labels, mean, metrics, MURAL_VS[0], tests["vs_madral"], alpha)]
    for ref, group in agg["ablations"].items():
        shape = "paper 000 Table 6" if ref.startswith("madral") else "paper 001 Table 5"
        rows = [ref, *group] + ([base] if base in mean else [])
        text += [f"\n## Ablations relative to {labels[ref]} ({shape} shape; † paired t-test p < {alpha:g})",
                 relative_table(rows, labels, mean, metrics, ref, tests[f"ablations_vs_{ref}"], alpha)]
    if any(agg["aspect_accuracy"].values()):
        text += ["\n## Aspect Accuracy@1 (paper 000 Table 5 shape; phrase values)",
                 aspect_table(order, labels, agg["aspect_accuracy"], list(cfg.model.aspects))]
    if tests["vs_baseline"]:
        text.append(f"\n## Paired tests vs {labels.get(base, base)} (seed-mean per query): diff, p_t, p_rand")
        text += paired_lines(tests["vs_baseline"], labels)
    return "\n".join(text)


def paired_lines(tests: dict[str, dict[str, dict]], labels: dict) -> list[str]:
    """One line per row of `significance`'s tests: each metric's mean difference, paired t-test p and
    randomisation p."""
    return [f"{labels[key]}: " + "; ".join(
        f"{header(m)} {v['diff']:+.4f} (p_t {v['p_ttest']:.2g}, p_rand {v['p_randomisation']:.2g})"
        for m, v in t.items()) for key, t in tests.items()]
