"""Paper 002 Eq. 1's lam for a saved model with a sparse head (issue 26 item 1a), re-tuned on dev without
retraining: the model that `benchmarks.quality.homedepot_hybrid` saved for `--row` (its `bench.save_models`) scores
the same dev and test splits; lam is chosen on dev over the coarse grid (multiples of `bench.fusion_step`, what
the benchmark chose from before) and over `fusion_lists.eq1_grid` (that grid plus values near 1, where raw sparse
dot products and cosines balance). Each choice is paired query by query on test with the dense part alone
(lam = 1), and fused with BM25 (weights and normalisation chosen on dev, as every fused row) against the
benchmark's target fusion (`bench.target`, e.g. BM25 + e5) from its cached lists.

    python -m benchmarks.quality.eq1_lambda --threads 1 --seeds 0 --row madral_pw_sparse --tag real_homedepot_eq1_lambda
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import paired_tests
from benchmarks.quality.aspect_models.data import EvalSet, catalog_for
from benchmarks.quality.aspect_models.evaluation import Lists, means, search_depth
from benchmarks.quality.fusion_lists import (
    eq1_at,
    eq1_dev_lambda,
    eq1_grid,
    eq1_matrices,
    fuse,
    metrics_of,
    tune_weights,
)
from benchmarks.quality.homedepot_hybrid import load
from madr.modeling.model import BiEncoder

METRICS = ("recall@10", "recall@100", "recall@1000", "mrr@10", "ndcg@10")


def cached(lists_dir: Path, name: str) -> dict[str, Lists]:
    """A reference row's lists as the benchmark cached them (`fusion_lists.cached_lists`)."""
    with np.load(lists_dir / f"{name}.npz", allow_pickle=False) as z:
        return {n: Lists(z[f"{n}_scores"], z[f"{n}_ids"], z[f"{n}_judged"]) for n in ("dev", "test")}


def fused(parts: list[dict[str, Lists]], splits: dict[str, EvalSet], cfg, bench: dict, k: int) -> tuple[Lists, str]:
    """`parts` fused at the weights and normalisation chosen on dev; (test lists, "norm w/w...")."""
    (norm, weights), _ = tune_weights([p["dev"] for p in parts], splits["dev"], cfg, bench["tune_metric"],
                                      float(bench["fusion_step"]), k, list(bench["fusion_normalisations"]))
    return fuse([p["test"] for p in parts], weights, k, norm), f"{norm} {'/'.join(f'{w:g}' for w in weights)}"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot_hybrid.yaml", "real_homedepot_eq1_lambda", seeds=[0])
    p.add_argument("--row", default="madral_pw_sparse", help="the saved row with a sparse head")
    p.add_argument("--out-dir", default=str(RUN_OUT))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    home, cfg, bench = load(Path(args.config), args.set)
    seed, k = args.seeds[0], search_depth(cfg)
    catalog, thr = catalog_for(home, cfg), cfg.eval.relevance_threshold
    splits = {"dev": EvalSet.of(catalog, "dev", thr, bench["dev_corpus_size"]),
              "test": EvalSet.of(catalog, "test", thr, bench["corpus_size"])}
    model = BiEncoder.load(Path(cfg.output_dir) / f"seed{seed}" / args.row / "model").eval()
    matrices, terms = eq1_matrices(model, splits, int(bench["encode_batch_size"]), f"{args.row} seed {seed}")
    step = float(bench["fusion_step"])
    coarse = [round(i * step, 6) for i in range(round(1 / step), -1, -1)]
    chosen, curves = {}, {}
    for name, grid in (("coarse", coarse), ("fine", eq1_grid(step))):
        chosen[name], curves[name] = eq1_dev_lambda(matrices["dev"], splits["dev"], k, cfg, bench["tune_metric"], grid)
    rows = {"dense part (lam 1)": 1.0, "sparse part (lam 0)": 0.0,
            f"Eq. 1, lam {chosen['coarse']:g} (coarse grid, dev)": chosen["coarse"],
            f"Eq. 1, lam {chosen['fine']:g} (fine grid, dev)": chosen["fine"]}
    per_q = {label: metrics_of(eq1_at(matrices["test"], splits["test"], k, lam), splits["test"], cfg)
             for label, lam in rows.items()}
    lists_dir = Path(cfg.output_dir) / "lists"
    target = str(bench["target"])  # e.g. bm25+e5
    fine = {n: eq1_at(matrices[n], splits[n], k, chosen["fine"]) for n in splits}
    for label, parts in ((target, [cached(lists_dir, name) for name in target.split("+")]),
                         (f"bm25 + Eq. 1 lam {chosen['fine']:g}", [cached(lists_dir, "bm25"), fine])):
        lists, how = fused(parts, splits, cfg, bench, k)
        per_q[f"{label} ({how}, dev)"] = metrics_of(lists, splits["test"], cfg)
    base = {"dense part (lam 1)": next(iter(per_q)), target: next(x for x in per_q if x.startswith(f"{target} ("))}
    vals = {label: means(q) for label, q in per_q.items()}
    shown = [m for m in METRICS if m in vals[base["dense part (lam 1)"]]]  # those of the config's eval
    lines = [f"| row | {' | '.join(shown)} | vs |", "|---" * (len(shown) + 2) + "|"]
    tests = {}
    for label, q in per_q.items():
        ref = base[target] if label.startswith("bm25") else base["dense part (lam 1)"]
        tests[label] = {m: paired_tests(q[m], per_q[ref][m]) for m in shown} if label != ref else {}
        cells = [f"{vals[label][m]:.4f}" + (f" ({tests[label][m]['diff']:+.4f}, p {tests[label][m]['p_ttest']:.2g})"
                                            if tests[label] else "") for m in shown]
        lines.append(f"| {label} | {' | '.join(cells)} | {ref if tests[label] else '-'} |")
    dev_line = ", ".join(f"{lam:g}: {v:.4f}" for lam, v in curves["fine"].items())
    text = (f"# {args.row} seed {seed}: Eq. 1 lam re-tuned on dev ({bench['tune_metric']}); {len(splits['test'].query_ids)} "
            f"test queries, {len(splits['test'].product_ids)} docs; non-zero terms {terms}\n"
            f"dev {bench['tune_metric']} by lam: {dev_line}\n" + "\n".join(lines))
    print(text, flush=True)
    out = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "row": args.row, "seed": seed,
           "chosen": chosen, "dev": {n: {str(lam): v for lam, v in c.items()} for n, c in curves.items()},
           "terms": terms, "values": vals, "tests": tests, "machine": machine_info(),
           "wall_s": time.perf_counter() - start, "table": text}
    write_result_json(args.out_dir, args.tag, out)
    return out


if __name__ == "__main__":
    main()
