"""The product-search pipeline's run against the benchmark's exported rows (`homedepot_hybrid --export`), paired per
query (`--between-seeds`: the benchmark's seed against its seed; `--over-seeds`: per-seed results paired by seed);
`--multilingual`:
the multilingual pipeline's runs against the published teacher rows.

    python -m benchmarks.quality.pipeline_equivalence --pipeline-dir runs/product_search --export DIR/export
    python -m benchmarks.quality.pipeline_equivalence --between-seeds --export DIR/export --seed 3 4
    python -m benchmarks.quality.pipeline_equivalence --pipeline-dir RUN_S0 RUN_S1 RUN_S2 \\
        --multilingual benchmarks/results/real_multitask_e5.json --seed 0 1 2
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from benchmarks.common.config import RUN_OUT, parser, write_json, write_result_json
from benchmarks.common.machine import load_average, machine_info
from madr.config import load_config
from madr.metrics import Run, evaluate
from madr.significance import paired_tests
from pipelines.evaluate.io import read_qrels

SINGLE_METRICS = ("click_auc", "ndcg@5", "nli_auc_en", "nli_auc_xx")  # multilingual: compared where both report
PAIRS = {"fused": ("{model}", "bm25+{row}"), "encoder alone": ("{model}-dense", "{row}")}
RETRIEVAL = ("recall@", "mrr@")  # computed from ranked lists on both sides (module docstring)
ROW = "bibert_mined"  # the benchmark's row the product-search pipeline runs (the recipe)


def write_row(export: Path, row: str, seed: int, per_query: dict[str, dict], labels: dict[str, str],
              info: dict, device: str) -> Path:
    """<export>/seed<seed>/<row>.json (`homedepot_hybrid --export`): the per-query test metrics of a trained row and
    its fusions ({key: {metric: {query: value}}}), their labels, the training info and where it ran."""
    import torch

    accelerator = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return write_json(export / f"seed{seed}" / f"{row}.json",
                      {"row": row, "seed": seed, "per_query": per_query, "labels": labels, "info": info,
                       "device": device, "accelerator": accelerator,
                       "machine": machine_info(load_average=load_average())}, indent=None)


def read_trec_run(path: Path) -> Run:
    """`qid Q0 docid rank score tag` lines -> {qid: {docid: score}}."""
    run: Run = defaultdict(dict)
    for line in path.read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run[qid][doc] = float(score)
    return dict(run)


def benchmark_per_query(export: Path, row: str, seed: int) -> dict[str, dict[str, dict[str, float]]]:
    """{pair: {metric: {query: value}}} of the benchmark's exported row (the retrieval metrics, `PAIRS`' rows)."""
    exported = json.loads((export / f"seed{seed}" / f"{row}.json").read_text())["per_query"]
    out = {}
    for pair, (_, theirs) in PAIRS.items():
        bench = exported[theirs.format(row=row)]
        out[pair] = {m: bench[m] for m in sorted(bench) if m.startswith(RETRIEVAL)}
    return out


def pipeline_per_query(pipeline_dir: Path, pair: str, metrics: list[str], queries: set[str]
                       ) -> tuple[str, dict[str, dict[str, float]]]:
    """(the run's name, {metric: {query: value}}): the pipeline's TREC run of `pair` scored on `queries`."""
    stage_cfg = _experiment(pipeline_dir)
    ours = PAIRS[pair][0].format(model=stage_cfg.model.name)
    qrels = read_qrels(pipeline_dir / "data" / "eval" / "qrels.parquet", doc_column="product_id")
    run = read_trec_run(pipeline_dir / "evaluation" / f"{ours}.trec")
    judged = {q: qrels.get(q, {}) for q in queries}
    return ours, evaluate(run, judged, metrics, relevance_threshold=stage_cfg.eval.relevance_threshold,
                          gains=stage_cfg.eval.gains, per_query=True)


def paired(a: dict[str, float], b: dict[str, float], draws: int) -> dict:
    """Means of `a` and `b` over the queries `a` holds, and the paired tests between them."""
    b = {q: b[q] for q in a}
    return {"pipeline": sum(a.values()) / len(a), "benchmark": sum(b.values()) / len(b), **paired_tests(a, b, draws)}


def compare(pipeline_dir: Path, export: Path, row: str, seed: int, draws: int) -> dict:
    """{pair: {metric: {pipeline, benchmark, diff, p_randomisation, p_ttest, n}}} (module docstring)."""
    out: dict[str, dict] = {}
    for pair, bench in benchmark_per_query(export, row, seed).items():
        queries = set(next(iter(bench.values())))
        ours, per_q = pipeline_per_query(pipeline_dir, pair, list(bench), queries)
        out[pair] = {m: {**paired({q: per_q[m][q] for q in bench[m] if q in per_q[m]}, bench[m], draws),
                         "runs": [ours, PAIRS[pair][1].format(row=row)]} for m in bench}
    return out


def compare_seeds(export: Path, row: str, seeds: list[int], draws: int) -> dict:
    """Seed a against seed b of the benchmark's row: what two trainings of the same code differ by."""
    a, b = seeds
    bench_a, bench_b = benchmark_per_query(export, row, a), benchmark_per_query(export, row, b)
    return {f"benchmark seed {a} vs {b}: {pair}": {m: paired(metrics[m], bench_b[pair][m], draws) for m in metrics}
            for pair, metrics in bench_a.items()}


def over_seeds(results: list[Path], draws: int) -> dict:
    """Each side's mean over the per-seed `compare` results in `results`, paired by seed."""
    per_seed = {path.stem: json.loads(path.read_text())["pairs"] for path in results}

    def side(pair: str, metric: str, name: str) -> dict[str, float]:
        return {seed: pairs[pair][metric][name] for seed, pairs in per_seed.items()}

    return {pair: {m: paired(side(pair, m, "pipeline"), side(pair, m, "benchmark"), draws) for m in metrics}
            for pair, metrics in next(iter(per_seed.values())).items()}


def compare_multilingual(pipeline_dir: Path, published: Path, seed: int, draws: int,
                         row: str = "multitask", theirs_row: str = "multi-task e5 teacher (12 layers)") -> dict:
    """Click and NLI metrics side by side, cross-lingual top-1 paired per source language."""
    ours = json.loads((pipeline_dir / "metrics.json").read_text())["rows"][row]
    runs = json.loads(published.read_text())["runs"]
    theirs = next(r for r in runs if r["seed"] == seed)["rows"][theirs_row]
    langs = sorted(k for k in theirs if k.startswith("xling_top1_"))
    a, b = {k: ours[k] for k in langs}, {k: theirs[k] for k in langs}
    single = {m: {"pipeline": ours[m], "benchmark": theirs[m], "diff": ours[m] - theirs[m], "n": 1}
              for m in SINGLE_METRICS if m in ours and m in theirs}
    return {**single, "xling_top1 (per language)": paired(a, b, draws)}


def compare_multilingual_seeds(runs: dict[int, Path], published: Path, draws: int) -> dict:
    """`compare_multilingual` per seed's run, then each metric over the seeds, paired by seed."""
    per_seed = {seed: compare_multilingual(path, published, seed, draws) for seed, path in sorted(runs.items())}
    out: dict[str, dict] = {f"seed {seed}": rows for seed, rows in per_seed.items()}
    if len(per_seed) > 1:
        metrics = set.intersection(*(set(rows) for rows in per_seed.values()))
        out["over seeds"] = {m: paired({s: r[m]["pipeline"] for s, r in per_seed.items()},
                                       {s: r[m]["benchmark"] for s, r in per_seed.items()}, draws)
                             for m in sorted(metrics)}
    return out


def _experiment(pipeline_dir: Path):
    """The experiment config the pipeline ran with (its materialised copy, else the marker's config path)."""
    marker = json.loads((pipeline_dir / "_stages" / "evaluate.done.json").read_text())
    return load_config(marker["config"])


def table(result: dict) -> str:
    lines = ["| pair | metric | pipeline | benchmark | diff | p (t) | p (rand.) | n |",
             "|---|---|---|---|---|---|---|---|"]
    for pair, rows in result.items():
        for m, r in rows.items():
            p_t, p_rand = (f"{r[k]:.3g}" if k in r else "-" for k in ("p_ttest", "p_randomisation"))
            lines.append(f"| {pair} | {m} | {r['pipeline']:.4f} | {r['benchmark']:.4f} | {r['diff']:+.4f} | "
                         f"{p_t} | {p_rand} | {r['n']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--pipeline-dir", nargs="*", default=[], help="the pipeline's output_dir, one per --seed")
    p.add_argument("--export", help="the benchmark's --export folder (product search)")
    p.add_argument("--multilingual", help="the published multilingual JSON (the multilingual recipe's runs)")
    p.add_argument("--between-seeds", action="store_true",
                   help="the benchmark's seed A against its seed B (--seed A B)")
    p.add_argument("--over-seeds", nargs="+", default=[], metavar="RESULT", help="per-seed results, paired by seed")
    p.add_argument("--seed", type=int, nargs="+", default=[0])
    p.add_argument("--draws", type=int, default=10000)
    p.add_argument("--out-dir", default=str(RUN_OUT))
    p.add_argument("--tag", default="pipeline_equivalence")
    args = p.parse_args(argv)
    if len(args.pipeline_dir) != (0 if args.between_seeds or args.over_seeds else len(args.seed)):
        p.error(f"{len(args.pipeline_dir)} --pipeline-dir for {len(args.seed)} --seed: give one run per seed "
                "(none with --between-seeds or --over-seeds)")
    if args.over_seeds:
        result = over_seeds([Path(r) for r in args.over_seeds], args.draws)
    elif args.multilingual:
        runs = {seed: Path(d) for seed, d in zip(args.seed, args.pipeline_dir, strict=True)}
        result = compare_multilingual_seeds(runs, Path(args.multilingual), args.draws)
    elif args.export and args.between_seeds:
        if len(args.seed) != 2:
            p.error("--between-seeds compares two seeds (--seed A B)")
        result = compare_seeds(Path(args.export), ROW, args.seed, args.draws)
    elif args.export:
        if len(args.seed) > 1:
            p.error("product search compares one seed per run (--seed N)")
        result = compare(Path(args.pipeline_dir[0]), Path(args.export), ROW, args.seed[0], args.draws)
    else:
        p.error("one of --export (product search) and --multilingual is needed")
    text = table(result)
    print(text)
    write_result_json(args.out_dir, args.tag, {"pairs": result, "table": text, "args": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
