"""The tables of the product-search benchmark in the papers' shapes: values, change relative to a baseline with
the paired tests (paper 000 Tables 4 / 7)."""

from __future__ import annotations

import math

from benchmarks.common.stats import paired_tests


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
