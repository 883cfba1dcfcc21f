"""Two settings of the product-search pipeline on the test split, one run (`output_dir`) per seed each: A against B,
paired per query within each seed and over the seed means (each query's metric averaged over the seeds first), for
the recipe's fused run and the encoder alone (`pipeline_equivalence.PAIRS`); beside them the tune stage's dev
fusion score of each run (`tune/fusion.json`), what a setting is chosen by before test is read.
`--dev`: the fine-tuned encoders alone on dev instead, over what the fine-tuning's own validation searched (the
run's dev queries and `distributed.val_corpus` products drawn with its seed: `pipelines.train.loop.
validation_catalog`), per query (cached in <run>/finetune/dev_per_query.json); runs that went no further than
fine-tuning compare this way.

    python -m benchmarks.quality.pipeline_ab --a RUN_A_S0 RUN_A_S1 RUN_A_S2 --b RUN_B_S0 RUN_B_S1 RUN_B_S2 \\
        --label-a "MADRAL" --label-b "the recipe" --tag madral_vs_recipe
    python -m benchmarks.quality.pipeline_ab --dev --a RUN_A_S0 --b RUN_B_S0 --metrics recall@10 mrr@10 recall@100

The runs of one seed go in the same position of --a and --b. Writes <out-dir>/results/<tag>.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common.config import RUN_OUT, parser, write_result_json
from benchmarks.quality.pipeline_equivalence import PAIRS, pipeline_per_query
from madr.config import load_config
from madr.significance import paired_tests
from pipelines.evaluate.io import read_qrels

METRICS = ["recall@10", "mrr@10", "ndcg@10", "recall@100", "recall@1000"]


def run_per_query(run: Path, pair: str, metrics: list[str]) -> tuple[str, dict[str, dict[str, float]]]:
    """(the TREC run's name, {metric: {query: value}}) of one pipeline run's `pair` over its judged test queries."""
    queries = set(read_qrels(run / "data" / "eval" / "qrels.parquet", doc_column="product_id"))
    return pipeline_per_query(run, pair, metrics, queries)


def dev_per_query(run: Path, metrics: list[str]) -> tuple[str, dict[str, dict[str, float]]]:
    """("encoder alone", {metric: {query: value}}): the run's fine-tuned encoder searched exactly over its
    fine-tuning's validation catalog, scored as the evaluate stage scores (cached per fine-tuning, by its marker's
    run id, and metric list)."""
    marker = json.loads((run / "_stages" / "finetune.done.json").read_text())
    cache = run / "finetune" / "dev_per_query.json"
    cached = json.loads(cache.read_text()) if cache.is_file() else {}
    if (cached.get("metrics"), cached.get("run_id")) == (metrics, marker.get("run_id")):
        return "encoder alone", cached["per_query"]
    import torch

    from madr.data.schema import Catalog
    from madr.metrics import evaluate
    from madr.modeling.model import BiEncoder
    from madr.recipes.aspects.evaluation import ranked_run
    from madr.recipes.aspects.experiment import catalog_dir
    from pipelines.train.config import distributed_config
    from pipelines.train.loop import validation_catalog, validation_split

    cfg = load_config(marker["config"])
    catalog = Catalog.read(catalog_dir(cfg), aspect_names=cfg.model.aspects)  # what the training read
    split = validation_split(catalog)
    catalog = validation_catalog(catalog, split, distributed_config(cfg).val_corpus, cfg.train.seed)
    model = BiEncoder.load(run / "finetune" / "model").eval()
    with torch.no_grad():
        ranked = ranked_run(model, catalog, split, cfg.eval.top_k)[0]
    per_query = evaluate(ranked, catalog.qrels(split), metrics, relevance_threshold=cfg.eval.relevance_threshold,
                         gains=cfg.eval.gains, per_query=True)
    cache.write_text(json.dumps({"metrics": metrics, "run_id": marker.get("run_id"), "per_query": per_query}))
    return "encoder alone", per_query


def seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Each query's value averaged over the seeds (the queries every seed scored)."""
    queries = set.intersection(*(set(s) for s in per_seed))
    return {q: float(np.mean([s[q] for s in per_seed])) for q in queries}


def side_by_side(a: dict[str, float], b: dict[str, float], draws: int) -> dict:
    """Means of A and B over the queries both score, and the paired tests of A - B."""
    common = set(a) & set(b)
    a, b = {q: a[q] for q in common}, {q: b[q] for q in common}
    return {"a": float(np.mean(list(a.values()))), "b": float(np.mean(list(b.values()))),
            **paired_tests(a, b, draws)}


def dev_fusion(run: Path) -> dict:
    """The tune stage's choice on dev (weight, normalisation, its dev score), without the grid."""
    path = run / "tune" / "fusion.json"
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "grid"} if path.is_file() else {}


def compare(runs_a: list[Path], runs_b: list[Path], metrics: list[str], draws: int, dev: bool = False) -> dict:
    """{pair: {"seed <i>" | "seed mean": {metric: {a, b, diff, p_randomisation, p_ttest, n}}}, "runs": names};
    `dev`: the encoders alone on their validation catalogs (`dev_per_query`)."""
    if len(runs_a) != len(runs_b):
        raise ValueError(f"{len(runs_a)} runs of A against {len(runs_b)} of B: give one of each per seed")
    out: dict = {"pairs": {}, "dev_fusion": {"a": [dev_fusion(r) for r in runs_a],
                                             "b": [dev_fusion(r) for r in runs_b]}}
    for pair in ["encoder alone (dev)"] if dev else PAIRS:
        scored = [[dev_per_query(r, metrics) if dev else run_per_query(r, pair, metrics) for r in runs]
                  for runs in (runs_a, runs_b)]
        rows: dict = {}
        for i, ((_, a), (_, b)) in enumerate(zip(*scored, strict=True)):
            rows[f"seed {i}"] = {m: side_by_side(a[m], b[m], draws) for m in metrics}
        if len(runs_a) > 1:
            rows["seed mean"] = {m: side_by_side(seed_mean([a[m] for _, a in scored[0]]),
                                                 seed_mean([b[m] for _, b in scored[1]]), draws) for m in metrics}
        out["pairs"][pair] = {"rows": rows, "runs": [scored[0][0][0], scored[1][0][0]]}
    return out


def table(result: dict, label_a: str, label_b: str) -> str:
    """One markdown row per (pair, seed): A / B and A - B (randomisation p) per metric."""
    metrics = list(next(iter(next(iter(result["pairs"].values()))["rows"].values())))
    lines = [f"| ranker | seed | {' | '.join(metrics)} |", "|---|---|" + "---|" * len(metrics),
             f"| ({label_a} / {label_b}, diff (p)) | | " + " | ".join("" for _ in metrics) + " |"]
    for pair, entry in result["pairs"].items():
        for seed, row in entry["rows"].items():
            cells = [f"{r['a']:.4f} / {r['b']:.4f}, {r['diff']:+.4f} ({r['p_randomisation']:.2g})" for r in row.values()]
            lines.append(f"| {pair} | {seed} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--a", nargs="+", required=True, help="the runs of setting A, one output_dir per seed")
    p.add_argument("--b", nargs="+", required=True, help="the runs of setting B, in the same seed order")
    p.add_argument("--label-a", default="A")
    p.add_argument("--label-b", default="B")
    p.add_argument("--metrics", nargs="+", default=METRICS)
    p.add_argument("--dev", action="store_true", help="the fine-tuned encoders alone on their validation catalogs")
    p.add_argument("--draws", type=int, default=10000)
    p.add_argument("--out-dir", default=str(RUN_OUT))
    p.add_argument("--tag", default="pipeline_ab")
    args = p.parse_args(argv)
    if len(args.a) != len(args.b):
        p.error(f"{len(args.a)} runs in --a, {len(args.b)} in --b: give one of each per seed")
    result = compare([Path(r) for r in args.a], [Path(r) for r in args.b], args.metrics, args.draws, args.dev)
    text = table(result, args.label_a, args.label_b)
    print(text)
    write_result_json(args.out_dir, args.tag, {**result, "table": text, "args": vars(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
