"""`benchmarks.quality.homedepot_hybrid`'s tables (values, change relative to a baseline with paired tests,
aspect Accuracy@1) and plots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.common.config import pyplot, save_figure
from madr.significance import paired_tests


def significance(rows: dict[str, dict[str, dict[str, float]]], base: str, draws: int) -> dict[str, dict]:
    """{row: {metric: paired tests of row - base}} for every row but `base`."""
    return {key: {m: paired_tests(rows[key][m], rows[base][m], draws) for m in rows[base]}
            for key in rows if key != base and base in rows}


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


def aspect_lines(training: dict, rows: list[str], labels: dict, chance: dict | None = None) -> list[str]:
    """Markdown lines: test aspect Accuracy@1 per trained row (mean over seeds), under the `chance` row."""
    acc = {row: [t[row]["aspects"]["test"] for t in training.values() if t.get(row, {}).get("aspects", {}).get("test")]
           for row in rows}
    acc = {row: each for row, each in acc.items() if each}
    if not acc:
        return []
    if chance:
        acc = {"chance": [chance], **acc}
        labels = {**labels, "chance": "chance: the most frequent training value"}
    cols = sorted({c for each in acc.values() for a in each for c in a})
    lines = ["\n## Aspect Accuracy@1 on the test queries and corpus (mean over seeds)",
             "| Model | " + " | ".join(c.replace("_acc@1_", " ") for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row, each in acc.items():
        lines.append(f"| {labels.get(row, row)} | " + " | ".join(
            f"{np.mean([a[c] for a in each if c in a]):.3f}" for c in cols) + " |")
    return lines


def short_label(label: str) -> str:
    """A row's label for a plot axis (without "(dev)" and the served-configuration note)."""
    return label.replace(" (dev)", "").replace("; the served configuration", "").replace("weights ", "")


def plot_rows(order: list[str], labels: dict, mean: dict, std: dict, metrics: list[str], path: Path, target: str) -> None:
    """Horizontal bars of every row's test mean (± std over seeds) per metric, the target in red, fusions in blue."""
    plt = pyplot()
    if plt is None:
        return
    shown = [m for m in ("recall@10", "recall@100", "mrr@10", "ndcg@10") if m in metrics]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.4 * len(shown), 5))
    for ax, m in zip(np.atleast_1d(axes), shown, strict=True):
        y = np.arange(len(order))[::-1]
        ax.barh(y, [mean[k][m] for k in order], xerr=[std[k][m] for k in order], capsize=2,
                color=["#c44e52" if k == target else "#4c72b0" if "+" in k else "#999999" for k in order])
        ax.set_yticks(y, [short_label(labels[k]) for k in order] if ax is np.atleast_1d(axes)[0] else [], fontsize=7)
        lo = min(mean[k][m] for k in order)
        ax.set_xlim(max(0.0, lo - 0.1), None)
        ax.set_xlabel(f"test {header(m)}")
        ax.grid(alpha=0.3, axis="x")
    save_figure(fig, path, dpi=110)
