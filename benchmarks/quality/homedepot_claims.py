"""The papers' claims on real product search at the issue-26 budget, from trained rows exported per query
(issue 26 item 3): MADRAL vs MADR and MtBERT vs BiBERT (paper 000 Table 4), the three fusion networks (Table 7),
MURAL vs MUR and MURAL vs MADRAL (paper 001 Table 3), each paired over the test queries on the seed-mean, and
every row alone and fused with BM25 against the target, BM25 + untouched e5.

The trained rows come from `benchmarks.quality.homedepot_hybrid --export DIR` (same config, data and split; on a
GPU machine with `--device cuda`), one or more folders (`benchmarks.quality.row_export`): the per-query test
metrics of each row alone and of its fusions with BM25 (weights chosen on dev there). The reference rows (BM25, the untrained encoders and
their dev-tuned fusions) are this machine's run of `homedepot_hybrid` (its cached lists): the same corpus and
queries, so the tests pair query by query.

    python -m benchmarks.quality.homedepot_claims --export runs/gpu_export/runs/export --tag real_homedepot_claims
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import machine_info
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import mean_std, paired_tests
from benchmarks.quality.aspect_models.data import EvalSet, catalog_for
from benchmarks.quality.aspect_models.evaluation import means, search_depth
from benchmarks.quality.aspect_models.report import header, relative_table, significance, value_table
from benchmarks.quality.fusion_lists import metrics_of
from benchmarks.quality.homedepot_hybrid import Run, load, reference_rows
from benchmarks.quality.hybrid_report import aspect_lines, plot_rows
from benchmarks.quality.row_export import read_rows

# (row, compared with, the claim): paper 000 Tables 4 / 7, paper 001 Table 3
CLAIMS = [
    ("madral_pw", "madr", "aspect learning in MADRAL (paper 000 Table 4: MADRAL > MADR)"),
    ("madral_ws", "madr", "MADRAL (Weighted Sum) vs MADR (Presence): aspect learning, and another fusion"),
    ("madral_pw", "bibert", "paper 000 Table 4: MADRAL > BiBERT"),
    ("madr", "bibert", "the multi-aspect architecture without aspect learning (paper 000 Table 4: MADR vs BiBERT)"),
    ("mtbert", "bibert", "multi-task aspect learning (paper 000 Table 4: MtBERT > BiBERT)"),
    ("madral_pw", "madral_ws", "fusion: Presence Weighting vs Weighted Sum (paper 000 Table 7)"),
    ("madral_cls", "madral_ws", "fusion: CLS-Gating vs Weighted Sum (paper 000 Table 7)"),
    ("madral_cls", "madral_pw", "fusion: CLS-Gating vs Presence Weighting (paper 000 Table 7)"),
    ("madral_cls", "madr", "aspect learning with CLS-Gating (MADRAL CLS-Gating vs MADR)"),
    ("mural", "mur", "aspect learning in MURAL (paper 001 Table 3: MURAL > MUR)"),
    ("mur", "bibert", "aspect tokens without aspect learning (paper 001 Table 3: MUR vs BiBERT)"),
    ("mural", "madral_pw", "paper 001 Table 3: MURAL > MADRAL"),
    ("bibert_mined", "bibert", "BM25-mined hard negatives (BiBERT)"),
    ("madral_pw_mined", "bibert_mined", "aspect learning with BM25-mined negatives (MADRAL PW vs BiBERT)"),
]


def seed_means(per_seed: dict[int, dict]) -> tuple[dict, dict, dict]:
    """(per-query mean over seeds, mean and std over seeds of the per-seed means) of one row."""
    seeds = sorted(per_seed)
    first = per_seed[seeds[0]]
    pooled = {m: {q: float(np.mean([per_seed[s][m][q] for s in seeds])) for q in v} for m, v in first.items()}
    vals = [means(per_seed[s]) for s in seeds]
    pairs = {m: mean_std([v[m] for v in vals]) for m in vals[0]}
    return pooled, {m: p[0] for m, p in pairs.items()}, {m: p[1] for m, p in pairs.items()}


def claim_lines(pooled: dict, metrics: list[str], draws: int, alpha: float, labels: dict,
                claims=CLAIMS) -> tuple[list[str], dict]:
    """Markdown table of each claim present in `pooled` (row - other: mean difference, paired t-test p) and the
    tests."""
    lines = ["| claim | row - compared | " + " | ".join(header(m) for m in metrics) + " |",
             "|---|---|" + "---|" * len(metrics)]
    tests = {}
    for row, other, claim in claims:
        if row not in pooled or other not in pooled:
            continue
        t = {m: paired_tests(pooled[row][m], pooled[other][m], draws) for m in metrics}
        tests[f"{row} vs {other}"] = t
        cells = [f"{t[m]['diff']:+.4f}{'†' if t[m]['p_ttest'] < alpha else ''} (p {t[m]['p_ttest']:.2g})"
                 for m in metrics]
        lines.append(f"| {claim} | {labels[row]} - {labels[other]} | " + " | ".join(cells) + " |")
    return lines, tests


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot_hybrid.yaml", "real_homedepot_claims")
    p.add_argument("--export", required=True, nargs="+", help="the folders homedepot_hybrid --export wrote")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    args = p.parse_args(argv)
    start = time.perf_counter()
    home, cfg, bench = load(Path(args.config), args.set)
    catalog = catalog_for(home, cfg)
    thr = cfg.eval.relevance_threshold
    splits = {"dev": EvalSet.of(catalog, "dev", thr, bench["dev_corpus_size"]),
              "test": EvalSet.of(catalog, "test", thr, bench["corpus_size"])}
    run = Run(cfg, bench, splits, Path(cfg.output_dir), search_depth(cfg))
    fusions = reference_rows(run)
    pooled = {key: metrics_of(run.lists[key]["test"], splits["test"], cfg) for key in run.lists}
    mean = {key: means(v) for key, v in pooled.items()}
    std = {key: {m: 0.0 for m in v} for key, v in mean.items()}
    labels = dict(run.labels)
    per_seed, imported_labels, info, machines = read_rows([Path(e) for e in args.export])
    seeds = sorted({s for v in per_seed.values() for s in v})
    for key, each in per_seed.items():
        pooled[key], mean[key], std[key] = seed_means(each)
        labels[key] = imported_labels[key] + ("" if len(each) == len(seeds) else f" (seeds {sorted(each)})")
    metrics = list(cfg.eval.retrieval_metrics) + list(cfg.eval.rerank_metrics)
    alpha, draws, target = float(bench["alpha"]), int(bench["draws"]), bench["target"]
    tests = significance(pooled, target, draws)
    order = sorted(mean, key=lambda k: (k in per_seed, -mean[k][bench["tune_metric"]]))
    claims, claim_tests = claim_lines(pooled, metrics, draws, alpha, labels)
    text = [f"# Home Depot test: {len(splits['test'].query_ids)} queries over {len(splits['test'].product_ids)} "
            f"products; trained rows from {' + '.join(args.export)} (seeds {seeds}), references from this machine's cached lists",
            "\n## Values (trained rows: mean ± std over seeds)", value_table(order, labels, mean, std, metrics,
                                                                          set(per_seed)),
            f"\n## Relative to {labels[target]} († paired t-test p < {alpha:g}, seed-mean per query)",
            relative_table(order, labels, mean, metrics, target, tests, alpha),
            f"\n## The papers' claims (row - compared, seed-mean per query; † paired t-test p < {alpha:g})", *claims]
    seeds_info = {s: {row: each[s] for row, each in info.items() if s in each} for s in seeds}
    text += aspect_lines(seeds_info, list(info), labels)
    machine = machine_info()
    text.append("\nreferences: " + "; ".join(f"{k} {v}" for k, v in machine.items()))
    text += [f"trained rows ({where}): " + "; ".join(f"{k} {v}" for k, v in m.items()) for where, m in machines.items()]
    print("\n".join(text), flush=True)
    result = {"benchmark": __spec__.name, "config": cfg.to_dict(), "bench": bench, "seeds": seeds, "labels": labels,
              "mean": mean, "std": std, "tests": tests, "claims": claim_tests, "fusions": fusions, "training": info,
              "machine": machine, "trained_machines": machines, "wall_s": time.perf_counter() - start,
              "table": "\n".join(text)}
    path = write_result_json(args.out_dir, args.tag, result)
    plot_rows(order, labels, mean, std, metrics, Path(args.out_dir) / "plots" / f"{args.tag}.png", target)
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
