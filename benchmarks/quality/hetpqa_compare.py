"""Two `benchmarks.quality.hetpqa` runs side by side, with a paired test per model (issue 20 item 3).

Written for the sparse top-k placement (paper 002 Sec. 4.2 cuts the term weights to the top k; SPLADE trains
on the whole vector): run A with the default (`model.sparse_top_k_in_training: false`, the cut at inference
only), run B with `--set model.sparse_top_k_in_training=true`, the same split, seeds and budget. Any two runs
on the same test questions can be compared.

For each fine-tuned model (dense only, sparse only, the hybrid's halves, hybrid, hybrid + source prior): the
test metrics of each run, mean ± std over seeds; the difference A - B of the seed means; and a paired test
over the test questions on the seed-mean per question (`benchmarks.common.stats.paired_tests`: two-sided paired
randomisation with 10,000 sign flips, Student's paired t-test), on MRR@5 and P@1. Needs result JSONs with
`fine_tuned.per_question_seed_mean` (written since issue 20). Also the mean non-zero terms per test query /
candidate, which is where the two placements differ most.

    python -m benchmarks.quality.hetpqa_compare benchmarks/results/real_hetpqa_topk_infer.json \\
        benchmarks/results/real_hetpqa_topk_train.json --names "inference only" "training too"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.stats import format_mean_std, paired_tests
from benchmarks.quality import hetpqa as pqa

ROWS = ("dense_alone", "sparse_alone", "dense_part", "sparse_part", "hybrid", "source_prior")
NNZ = ("hybrid", "sparse")


def load(path: Path) -> dict[str, Any]:
    """A benchmarks.quality.hetpqa result with per-question values (else SystemExit naming what is missing)."""
    res = json.loads(Path(path).read_text())
    if "per_question_seed_mean" not in res.get("fine_tuned", {}):
        raise SystemExit(f"{path}: no fine_tuned.per_question_seed_mean (written by benchmarks.quality.hetpqa since issue 20)")
    return res


def check_comparable(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Same seeds and the same test questions, else a paired test means nothing."""
    if a["config"]["seeds"] != b["config"]["seeds"]:
        raise ValueError(f"seeds differ: {a['config']['seeds']} vs {b['config']['seeds']}")
    qa = a["fine_tuned"]["per_question_seed_mean"]["mrr@5"]["hybrid"]
    qb = b["fine_tuned"]["per_question_seed_mean"]["mrr@5"]["hybrid"]
    if set(qa) != set(qb):
        raise ValueError(f"test questions differ ({len(qa)} vs {len(qb)}): not the same split")


def metrics_table(runs: dict[str, dict[str, Any]]) -> str:
    """Every row of every run: test metrics, mean ± std over seeds."""
    lines = ["| Model | run | " + " | ".join(pqa.HEADERS) + " |", "|---|---|" + "---|" * len(pqa.HEADERS)]
    for row in ROWS:
        for name, res in runs.items():
            per_seed = res["fine_tuned"]["test"]
            cells = " | ".join(format_mean_std([s[row][m] for s in per_seed]) for m in pqa.PQA_METRICS)
            lines.append(f"| {pqa.LABELS[row]} | {name} | {cells} |")
    return "\n".join(lines)


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """{row: {metric: paired_tests(A, B)}} on the seed-mean per question, for `pqa.PAIRED_METRICS`."""
    pa, pb = a["fine_tuned"]["per_question_seed_mean"], b["fine_tuned"]["per_question_seed_mean"]
    return {row: {m: paired_tests(pa[m][row], pb[m][row]) for m in pqa.PAIRED_METRICS} for row in ROWS}


def tests_table(tests: dict[str, dict[str, dict[str, float]]], names: tuple[str, str]) -> str:
    head = " | ".join(f"{m} {names[0]} - {names[1]} (p_rand / p_t)" for m in pqa.PAIRED_METRICS)
    lines = [f"| Model | {head} |", "|---|" + "---|" * len(pqa.PAIRED_METRICS)]
    for row, t in tests.items():
        cells = " | ".join(f"{t[m]['diff']:+.3f} ({t[m]['p_randomisation']:.3f} / {t[m]['p_ttest']:.3f})"
                           for m in pqa.PAIRED_METRICS)
        lines.append(f"| {pqa.LABELS[row]} | {cells} |")
    return "\n".join(lines)


def nnz_table(runs: dict[str, dict[str, Any]]) -> str:
    """Mean non-zero terms per test query / candidate (after the inference cut), mean over seeds."""
    lines = ["| run | " + " | ".join(f"{r} nnz query | {r} nnz doc" for r in NNZ) + " |", "|---|" + "---|" * 4]
    for name, res in runs.items():
        chosen = res["fine_tuned"]["chosen"]
        cells = [f"{np.mean([c['nnz'][r][side] for c in chosen]):.1f}" for r in NNZ for side in ("query", "doc")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, help="result JSON of run A")
    p.add_argument("b", type=Path, help="result JSON of run B")
    p.add_argument("--names", nargs=2, default=("A", "B"), help="what to call the two runs")
    p.add_argument("--out", type=Path, default=None, help="write the paired tests here as JSON")
    args = p.parse_args(argv)
    a, b = load(args.a), load(args.b)
    check_comparable(a, b)
    names = tuple(args.names)
    runs = {names[0]: a, names[1]: b}
    tests = paired(a, b)
    n = next(iter(tests["hybrid"].values()))["n"]
    print(f"# fine-tuned, test ({n} questions), seeds {a['config']['seeds']}\n\n" + metrics_table(runs))
    print("\n## paired over questions, seed-mean per question\n\n" + tests_table(tests, names))
    print("\n## non-zero terms per text\n\n" + nnz_table(runs))
    result = {"a": str(args.a), "b": str(args.b), "names": list(names), "paired": tests}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
