"""Learning from clicks where the truth is known: a click log simulated from the Home Depot judgments, the recipe
trained through the product's own stages on naive clicks, debiased clicks, rate-filtered clicks and the judgments;
test recall / MRR with paired tests, and the debiased row's examination curve error. Runs and logs are kept for a
rerun.

    python -m benchmarks.quality.click_debias --sizes 5000 20000 80000 --seeds 0 1 2 --corpus-size 12000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import ROOT, parser, write_result_json
from madr.clicks.examination import curve_error
from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)
from madr.config import ExperimentConfig, config_hash, load_config
from madr.config_overrides import parse_overrides
from madr.data.schema import Catalog
from madr.index.encode import encode_documents, encode_queries
from madr.index.lexical import word_pieces
from madr.metrics import evaluate as metrics_evaluate
from madr.search.sparse import BM25Index
from madr.significance import paired_tests

HOMEDEPOT = ROOT.parent / "shared" / "data" / "product_search" / "homedepot_relevance_dev.parquet"
ROWS = ("naive", "debiased", "filtered", "judgments")  # filtered: naive weights, the posterior rate filter
METRICS = ("recall@10", "mrr@10")
# the simulation: the old ranker's score noise (x the scores' std), the share of searches with two shown ranks
# swapped (interventions, as A/B tests leave), the examination curve's power, a grade-0 product's click chance
SIMULATION = {"noise": 0.5, "swap_share": 0.0, "eta": 1.0, "epsilon": 0.1}
# data.clicks of the click rows (IPW clip, harvest's minimum interventions), the filtered row's posterior rate
# filter quantile, and train.finetune.judged_negative_share of click rows
CLICKS, RATE_QUANTILE, SKIP_SHARE = {"clip": 10.0, "min_interventions": 20}, 0.75, 0.5


def base_catalog(out: Path) -> Path:
    """The judged catalog under `out/catalog`: the one there (a test's), else Home Depot's, written once."""
    where = out / "catalog"
    if not (where / "judgments.parquet").is_file():
        from madr.data.sources.homedepot import homedepot_catalog

        homedepot_catalog(HOMEDEPOT, seed=0).write(where)
    return where


def old_ranker_candidates(catalog: Catalog, tokenizer: Any, pool: int) -> dict[str, list[tuple[str, float, int]]]:
    """Each training query's BM25 top `pool` over the catalog: (product id, BM25 score, judged grade or 0)."""
    grades: dict[str, dict[str, int]] = {}
    for j in catalog.judgments:
        grades.setdefault(j.query_id, {})[j.product_id] = j.relevance
    queries = catalog.queries_in("train")
    index = BM25Index().fit(word_pieces(tokenizer, [catalog.product_text(p) for p in catalog.products]))
    scores, rows = index.search(word_pieces(tokenizer, [q.text for q in queries]), k=min(pool, len(catalog.products)))
    out = {}
    for q, s, r in zip(queries, scores, rows, strict=True):
        ids = [(catalog.products[i].product_id, float(v)) for i, v in zip(r, s, strict=True) if i >= 0]
        out[q.text] = [(pid, score, grades.get(q.query_id, {}).get(pid, 0)) for pid, score in ids]
    return out


def simulation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a simulated log depends on besides its size and seed."""
    return {"top_k": args.top_k, "pool": args.pool, **SIMULATION, "catalog": "homedepot", "max_queries": None}


def write_log(candidates: dict, args: argparse.Namespace, size: int, seed: int, out: Path) -> Path:
    """The simulated impressions of `size` searches (one seed) as JSONL (the plain impressions layout), kept under
    `out/logs` in a file named after the simulation's settings."""
    path = out / "logs" / f"n{size}-seed{seed}-{config_hash(simulation_settings(args))[:10]}.jsonl"
    if path.is_file():
        return path
    sim = ClickSimulation(size, args.top_k, power_law_examination(args.top_k, SIMULATION["eta"]),
                          graded_attractiveness(4, SIMULATION["epsilon"]), noise=SIMULATION["noise"], seed=seed,
                          swap_share=SIMULATION["swap_share"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in simulate_impressions(candidates, sim)))
    tmp.rename(path)
    return path


def run_config(base: ExperimentConfig, row: str, catalog_dir: Path, log: Path | None, out: Path, seed: int,
               args: argparse.Namespace) -> ExperimentConfig:
    cfg = load_config(None, {**base.to_dict(), "output_dir": str(out), "data.catalog_dir": str(catalog_dir)})
    cfg.train.seed = seed
    if row != "judgments":
        cfg = load_config(None, {**cfg.to_dict(), "data.clicks": {
            "path": str(log), "format": "impressions", "max_rank": args.top_k, "debias": row == "debiased",
            **CLICKS, "estimator": args.estimator, "rate_quantile": RATE_QUANTILE if row == "filtered" else None},
            "train.finetune.judged_negative_share": SKIP_SHARE})
    return cfg


def evaluation_set(catalog: Catalog, cfg: ExperimentConfig, corpus_size: int) -> tuple[list, list, dict]:
    """Test queries with a relevant product, the corpus (their judged products + a seeded sample), qrels."""
    threshold = cfg.eval.relevance_threshold
    qrels = {q: {p: r for p, r in rels.items()} for q, rels in catalog.qrels("test").items()
             if any(r >= threshold for r in rels.values())}
    queries = [q for q in catalog.queries_in("test") if q.query_id in qrels]
    products = catalog.products
    if corpus_size and corpus_size < len(products):
        judged = {p for rels in qrels.values() for p in rels}
        rest = sorted(p.product_id for p in products if p.product_id not in judged)
        keep = judged | set(np.random.default_rng(0).permutation(rest)[: max(corpus_size - len(judged), 0)])
        products = [p for p in products if p.product_id in keep]
    return queries, products, qrels


def evaluate(model: Any, catalog: Catalog, cfg: ExperimentConfig, corpus_size: int) -> dict[str, dict[str, float]]:
    """Per test query Recall@10 and MRR@10 by exact search over the corpus."""
    queries, products, qrels = evaluation_set(catalog, cfg, corpus_size)
    d, _ = encode_documents(model, [catalog.product_text(p) for p in products])
    q, _ = encode_queries(model, [x.text for x in queries])
    top = np.argsort(-(q @ d.T), axis=1)[:, :10]
    run = {x.query_id: {products[i].product_id: float(-r) for r, i in enumerate(row)}
           for x, row in zip(queries, top, strict=True)}
    per = metrics_evaluate(run, qrels, METRICS, relevance_threshold=cfg.eval.relevance_threshold, per_query=True)
    return {x.query_id: {m: per[m][x.query_id] for m in METRICS} for x in queries}


def train_and_evaluate(cfg: ExperimentConfig, corpus_size: int) -> dict[str, Any]:
    """The product's in-process stages: catalog (clicks judged when `data.clicks`), model, fine-tune, evaluate."""
    from madr.recipes.aspects.experiment import (
        build_catalog_model,
        load_catalog,
        prepare_tokenizer,
        prepare_vocabularies,
    )
    from madr.training.loop import catalog_sampler, train_stage

    start = time.perf_counter()
    catalog = load_catalog(cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    torch.manual_seed(cfg.train.seed)
    model = build_catalog_model(cfg.model, catalog, tokenizer, prepare_vocabularies(cfg, catalog, tokenizer))
    sampler = catalog_sampler(catalog, cfg.train.finetune, tokenizer, cfg.train.seed)
    history = train_stage(model, sampler, cfg.train.finetune, "finetune", cfg.train.seed, progress=False)
    per_query = evaluate(model.eval(), catalog, cfg, corpus_size)
    result: dict[str, Any] = {"per_query": per_query, "final_loss": history[-1]["loss"] if history else None,
                              "seconds": round(time.perf_counter() - start, 1)}
    examination = Path(cfg.output_dir) / "data" / "clicks" / "examination.json"
    if cfg.data.clicks is not None and examination.is_file():
        result["examination"] = json.loads(examination.read_text())["propensity"]
    return result


def cached_run(cfg: ExperimentConfig, args: argparse.Namespace, log: Path | None) -> dict[str, Any]:
    """`train_and_evaluate`, kept in `<output_dir>/result.json` under a fingerprint of what it depends on."""
    path = Path(cfg.output_dir) / "result.json"
    key = config_hash({"cfg": {k: v for k, v in cfg.to_dict().items() if k != "output_dir"},
                       "log": log.stat().st_size if log else None, "corpus": args.corpus_size,
                       "simulation": simulation_settings(args) if log else None})
    if path.is_file() and json.loads(path.read_text()).get("fingerprint") == key:
        return {**json.loads(path.read_text()), "cached": True}
    result = {"fingerprint": key, **train_and_evaluate(cfg, args.corpus_size)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result))
    return {**result, "cached": False}


def seed_means(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per query, each metric's mean over the seeds' runs."""
    queries = set.intersection(*(set(r["per_query"]) for r in runs))
    return {q: {m: float(np.mean([r["per_query"][q][m] for r in runs])) for m in METRICS} for q in sorted(queries)}


def size_report(runs: dict[str, list[dict]], truth: np.ndarray, draws: int) -> dict[str, Any]:
    per_query = {row: seed_means(r) for row, r in runs.items() if r}
    means = {row: {m: float(np.mean([v[m] for v in pq.values()])) for m in METRICS} for row, pq in per_query.items()}
    tests = {}
    for a, b in (("debiased", "naive"), ("filtered", "naive"), ("judgments", "debiased"), ("judgments", "naive")):
        if a in per_query and b in per_query:
            tests[f"{a} vs {b}"] = {m: paired_tests({q: v[m] for q, v in per_query[a].items()},
                                                    {q: v[m] for q, v in per_query[b].items()}, draws)
                                    for m in METRICS}
    both = {"naive", "judgments"} <= set(means)  # the share of the naive -> judgments gap a row recovers
    gap = {m: means["judgments"][m] - means["naive"][m] for m in METRICS} if both else {}
    recovered = {row: {m: (means[row][m] - means["naive"][m]) / gap[m] if abs(gap[m]) > 1e-9 else None
                       for m in METRICS} for row in ("debiased", "filtered") if row in means and gap}
    curves = [r["examination"] for r in runs.get("debiased", []) if "examination" in r]
    errors = [curve_error(SimpleNamespace(propensity=c), truth) for c in curves]  # the JSON curves
    return {"means": means, "tests": tests, "gap_recovered": recovered, "curve_max_abs_error": errors,
            "estimated_curves": curves, "true_curve": truth.tolist()}


def report_text(result: dict[str, Any]) -> str:
    lines = []
    for size, rep in result["sizes"].items():
        lines.append(f"\n{size} searches: " + ", ".join(
            f"{row} R@10 {v['recall@10']:.4f} MRR@10 {v['mrr@10']:.4f}" for row, v in rep["means"].items()))
        for name, per_metric in rep["tests"].items():
            lines.append(f"  {name}: " + "; ".join(
                f"{m} {t['diff']:+.4f} (t p={t['p_ttest']:.3g}, rand p={t['p_randomisation']:.3g}, n={t['n']})"
                for m, t in per_metric.items()))
        lines.append(f"  gap naive -> judgments recovered (by row): {rep['gap_recovered']}")
        lines.append("  the debiased row's examination curve, max abs error vs truth per seed: "
                     f"{rep['curve_max_abs_error']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser("benchmarks.quality.click_debias", __doc__)
    p.add_argument("--config", default=str(ROOT / "configs" / "product_search.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted config override")
    p.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000, 80000], help="searches per simulated log")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--pool", type=int, default=50, help="the old ranker's candidates per query")
    p.add_argument("--estimator", choices=("em", "harvest"), default="em", help="the debiased row's estimator")
    p.add_argument("--corpus-size", type=int, default=12000)
    p.add_argument("--draws", type=int, default=10000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "runs" / "click_debias"))
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks"))
    p.add_argument("--tag", default="click_debias", help="results name")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from madr.recipes.aspects.experiment import prepare_tokenizer

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    base = load_config(args.config, parse_overrides(args.set))
    catalog_dir = base_catalog(out)
    catalog = Catalog.read(catalog_dir, aspect_names=base.model.aspects)
    tokenizer = prepare_tokenizer(load_config(None, {**base.to_dict(), "output_dir": str(out / "old_ranker")}),
                                  catalog)
    candidates = old_ranker_candidates(catalog, tokenizer, args.pool)
    truth = power_law_examination(args.top_k, SIMULATION["eta"])
    settings = {**SIMULATION, **CLICKS, "rate_quantile": RATE_QUANTILE, "skip_share": SKIP_SHARE,
                "homedepot": str(HOMEDEPOT), "max_queries": None}  # the run's settings, as when they were options
    result: dict[str, Any] = {"args": {**vars(args), **settings}, "sizes": {}, "runs": {}}
    judged: list[dict] = []
    if "judgments" in args.rows:
        for seed in args.seeds:
            cfg = run_config(base, "judgments", catalog_dir, None, out / "runs" / "judgments" / f"seed{seed}", seed,
                             args)
            judged.append(cached_run(cfg, args, None))
    for size in args.sizes:
        logs = [write_log(candidates, args, size, seed, out) for seed in args.seeds]
        runs: dict[str, list[dict]] = {"judgments": judged}
        for row in (r for r in args.rows if r != "judgments"):
            runs[row] = [cached_run(run_config(base, row, catalog_dir, log, out / "runs" / row / f"n{size}" /
                                               f"seed{seed}", seed, args), args, log)
                         for seed, log in zip(args.seeds, logs, strict=True)]
        result["sizes"][str(size)] = size_report(runs, truth, args.draws)
        result["runs"][str(size)] = {row: [{k: v for k, v in r.items() if k != "per_query"} for r in rs]
                                     for row, rs in runs.items()}
    print(report_text(result))
    write_result_json(args.results_dir, args.tag, result)
    return result


if __name__ == "__main__":
    main()
