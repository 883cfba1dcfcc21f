"""Quality on the ESCI samples: the Home Depot-trained rows of benchmarks.quality.homedepot, evaluated
without further training on the public Amazon Shopping Queries (ESCI) samples with product text (issue 10:
"aspect models and dense baselines: product_search/ and the ESCI samples"; paper 001 Table 3 reports its
MURAL vs MADRAL comparison on ESCI).

Why transfer: the ESCI product file was not obtainable; the two samples with product text hold 530 US Exact
judgments over 54 queries (`madr.data.sources.esci.esci_text_catalog`), too few to train on, so they are a second,
out-of-domain test set (Amazon's whole catalog vs Home Depot's home-improvement one) for the models the Home
Depot table trains. Each query's Exact products are its relevant ones; every other product of the sample is a
distractor (not judged for that query, so read the numbers as a lower bound). Metrics over the 530 products:
Recall@10 / @50, MRR@10, NDCG@10 (gain 2^rel - 1, every relevant product has the same grade).

Models: for each seed and row the Home Depot run's saved model (<output_dir>/seed<seed>/<row>/model); a row
whose model was not saved is trained by aspect_models.training.run_row with the same config and corpus (so its
Home Depot result.json is reproduced, not changed) and saved. References: BM25 on the word pieces and the
zero-shot backbone. Paired tests as in the Home Depot script: every row vs BiBERT, MADR / MUR / MURAL vs
MADRAL (Presence Weighting), on the seed-mean per query. It also measures the Home Depot title annotator
(`TitleAnnotator`, fitted on the ESCI titles as it is fitted on the Home Depot ones) against the ESCI
catalog's own brand and colour fields: an external check of the rules the Home Depot aspects come from.

    python -m benchmarks.quality.esci_transfer --seeds 0 --set bench.corpus_size=12000     # ~20 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.common.stats import mean_std
from benchmarks.quality.aspect_models.data import EvalSet, eval_lengths, load_config, prepare
from benchmarks.quality.aspect_models.evaluation import bm25_runs, dense_runs, encode, means
from benchmarks.quality.aspect_models.report import (
    budget_text,
    plot,
    relative_table,
    seed_mean,
    significance,
    value_table,
)
from benchmarks.quality.aspect_models.rows import MURAL_VS, REFERENCES, label_of, trained_rows
from benchmarks.quality.aspect_models.training import run_row, zero_shot_model
from madr.data.sources.esci import esci_text_catalog
from madr.data.sources.homedepot import TitleAnnotator, annotator_accuracy
from madr.metrics import evaluate
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import load_tokenizer
from madr.recipes.aspects.experiment import prepare_tokenizer

DEFAULT_MODELS = ["bm25", "zero_shot", "bibert", "madr", "madral_pw", "mur", "mural"]
METRICS = ["recall@10", "recall@50", "mrr@10", "ndcg@10"]
DEPTH = 50


def home_depot_models(keys: list[str], seeds: list[int], home: dict | None, cfg, bench: dict) -> dict:
    """{(seed, row): model directory}: the saved Home Depot models, training (and saving) the missing ones
    exactly as the Home Depot table does, so their cached results stay valid."""
    where = {(s, k): Path(cfg.output_dir) / f"seed{s}" / k / "model" for s in seeds for k in keys}
    missing = [sk for sk, path in where.items() if not path.is_dir()]
    if missing:
        catalog, tokenizer, vocab, ev = prepare(home, cfg, bench)
        lengths = eval_lengths(tokenizer, ev, cfg)
        saving = {**bench, "save_models": sorted({k for _, k in missing})}
        for seed, key in missing:
            print(f"seed {seed} {key}: no saved model, training it as the Home Depot table does", flush=True)
            run_row(key, cfg, catalog, ev, tokenizer, vocab, lengths, seed, saving)
    return where


def retrieval_metrics(run: dict, ev: EvalSet) -> dict[str, dict[str, float]]:
    # Every judgment is Exact (grade 4, madr.data.sources.esci), so any threshold in (0, 4] gives the same values; 3.0 is
    # the Home Depot table's ("E" = grade 3-4, configs/real/homedepot.yaml), not paper 000's 2.
    return evaluate(run, ev.qrels, METRICS, relevance_threshold=3.0, gains="exp2", per_query=True)


def dense_row(model: BiEncoder, ev: EvalSet, cfg, batch_size: int, label: str) -> dict[str, dict[str, float]]:
    lengths = eval_lengths(model.tokenizer, ev, cfg)
    d = encode(model, ev.doc_texts, lengths["doc"], "doc", batch_size, f"{label}: ESCI products")
    q = encode(model, ev.query_texts, lengths["query"], "query", batch_size, f"{label}: ESCI queries")
    return retrieval_metrics(dense_runs(q.vectors, d.vectors, ev, DEPTH)[0], ev)


def reference_rows(keys: list[str], cfg, ev: EvalSet, tokenizer, bench: dict) -> dict[str, dict]:
    rows = {}
    if "bm25" in keys:
        rows["bm25"] = retrieval_metrics(bm25_runs(tokenizer, ev, DEPTH)[0], ev)
    if "zero_shot" in keys:
        rows["zero_shot"] = dense_row(zero_shot_model(cfg, tokenizer, bench), ev, cfg, bench["encode_batch_size"],
                                      "zero-shot")
    return rows


def annotator_check(catalog) -> dict[str, dict[str, float]]:
    """The title annotator (fitted on these titles) against the catalog's brand and colour fields: exact match
    of the lower-cased value, "no value" when the field is empty; no category field in ESCI."""
    titles = {p.product_id: p.title for p in catalog.products}
    gold = [{"product_uid": p.product_id, "brand": (p.aspects["brand"] or ["-"])[0],
             "color": (p.aspects["color"] or ["-"])[0], "category": "?"} for p in catalog.products]
    out = annotator_accuracy(TitleAnnotator.fit(titles.values()), titles, gold)
    return {a: v for a, v in out.items() if a != "category"}


def report(keys: list[str], labels: dict, shared: dict, runs: list[dict], bench: dict) -> tuple[str, dict]:
    """Values (mean ± std over seeds), change relative to BiBERT and to MADRAL with paired tests."""
    trained = [k for k in keys if k not in shared]
    per_seed = {r["seed"]: {k: means(v) for k, v in {**shared, **r["per_query"]}.items()} for r in runs}
    pairs = {k: {m: mean_std([s[k][m] for s in per_seed.values()]) for m in METRICS} for k in keys}
    mean = {k: {m: p[0] for m, p in v.items()} for k, v in pairs.items()}
    std = {k: {m: p[1] for m, p in v.items()} for k, v in pairs.items()}
    pooled = seed_mean(runs, shared)
    draws, alpha = int(bench["draws"]), float(bench["alpha"])
    tests = {"vs_baseline": significance(pooled, "bibert", draws)}
    family = [k for k in MURAL_VS if k in keys]
    text = ["## Values (mean ± std over seeds)", value_table(keys, labels, mean, std, METRICS, set(trained)),
            f"\n## Relative to BiBERT († paired t-test p < {alpha:g} on the seed-mean per query)",
            relative_table(keys, labels, mean, METRICS, "bibert", tests["vs_baseline"], alpha)]
    if MURAL_VS[0] in family and len(family) > 1:
        tests["vs_madral"] = significance({k: pooled[k] for k in family}, MURAL_VS[0], draws)
        text += [f"\n## Relative to {labels[MURAL_VS[0]]} (paper 001 Table 3 shape)",
                 relative_table(family, labels, mean, METRICS, MURAL_VS[0], tests["vs_madral"], alpha)]
    return "\n".join(text), {"mean": mean, "std": std, "per_seed": per_seed, "tests": tests}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot.yaml", "esci_transfer", seeds=[0])  # the Home Depot config
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS, metavar="ROW")
    p.add_argument("--esci-dir", default=str(ROOT.parent / "shared" / "data" / "esci"))
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    home, cfg, bench = load_config(Path(args.config), args.set)
    known = trained_rows(cfg)
    unknown = [k for k in args.models if k not in known and k not in REFERENCES]
    if unknown or "bibert" not in args.models:
        raise SystemExit(f"--models needs bibert (the baseline) and rows of {', '.join([*REFERENCES, *known])}; "
                         f"unknown: {unknown}")
    keys = list(dict.fromkeys(args.models))
    trained = [k for k in keys if k in known]
    start, load_before = time.perf_counter(), load_average()

    esci = esci_text_catalog(args.esci_dir)
    ev = EvalSet.of(esci, "test", 3.0)
    annotator = annotator_check(esci)
    data = {"products": len(esci.products), "queries": len(ev.query_ids),
            "judged_per_query": float(np.mean([len(j) for j in ev.judged])), "annotator_vs_esci_fields": annotator}
    print("data: " + json.dumps(data), flush=True)
    models = home_depot_models(trained, args.seeds, home, cfg, bench)
    labels = {k: label_of(k, bench, cfg) for k in keys}
    # the references tokenize as the trained rows do (their saved tokenizer; a tiny test backbone has no other)
    tokenizer = (load_tokenizer(models[(args.seeds[0], trained[0])] / "tokenizer") if trained
                 else prepare_tokenizer(cfg, esci))
    shared = reference_rows(keys, cfg, ev, tokenizer, bench)
    runs = []
    for seed in args.seeds:
        per_query = {}
        for key in trained:
            t0 = time.perf_counter()
            per_query[key] = dense_row(BiEncoder.load(models[(seed, key)]), ev, cfg, bench["encode_batch_size"],
                                       labels[key])
            print(f"seed {seed} {labels[key]}: " + json.dumps({m: round(v, 4) for m, v in means(
                per_query[key]).items()}) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
        runs.append({"seed": seed, "per_query": per_query})
    table, agg = report(keys, labels, shared, runs, bench)
    info = machine_info(load_average=load_average())
    head = (f"# ESCI samples (US, {data['queries']} queries, {data['products']} products, Exact judgments only), "
            f"zero-shot transfer of the Home Depot rows ({budget_text(cfg)}; seeds {args.seeds})")
    annot = "\n".join(f"title annotator vs ESCI {a}: accuracy {v['accuracy']:.3f}, precision {v['precision']:.3f}, "
                      f"recall {v['recall']:.3f} (n {v['n']})" for a, v in annotator.items())
    text = "\n".join([head, table, "", annot, "\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items())
                      + f"; load before {load_before}"])
    print(text, flush=True)
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name),
              "config": {"homedepot": home, "bench": bench, **cfg.to_dict()}, "rows": labels, "seeds": args.seeds,
              "data": data, "metrics": METRICS, **agg, "machine": info, "load_average_before": load_before,
              "wall_s": time.perf_counter() - start, "table": text}
    out = Path(args.out_dir)
    json_path = write_result_json(out, args.tag, result)
    png = out / "plots" / f"{args.tag}.png"
    if plot(keys, labels, runs, {k: means(v) for k, v in shared.items()}, png, head.lstrip("# "),
               ("recall@10", "mrr@10"), "bibert"):
        print(f"wrote {png}")
    print(f"wrote {json_path} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
