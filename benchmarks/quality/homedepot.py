"""Quality on REAL product search: the multi-aspect family vs dense baselines on Home Depot (issue 10; paper 000
Tables 4, 5 and 7, paper 001 Table 3).

Data (`homedepot:` of the config, `madr.data.sources.homedepot.write_homedepot_catalog`, cached under
`<output_dir>/catalog-<hash>`): the Home Depot relevance file as a catalog: unique products (title only) with
category / brand / colour from a title annotator, unique search terms split by term 70/10/20 into train / dev /
test, graded judgments 0-4 (raters' mean 1-3 -> round(2 (mean - 1))). Without a `homedepot:` section the
config's `data:` is used (a catalog directory or the synthetic generator: the smoke test).

Rows, every trained one from the SAME backbone weights (`model.backbone`), steps, batch, optimiser and seed;
the optional pretraining stage (`train.pretrain`, MLM + aspect losses) is off by default because the backbone
is already pretrained, the fine-tuning stage is paper 000 Eq. 8 (L_CE + in-batch L_SCE with one hard negative
+ `aspect_weight` x aspect losses for the aspect-learning models):
- references, not trained: BM25 on the backbone's word pieces (`madr.search.sparse.BM25Index`, Anserini k1/b) and the
  zero-shot backbone (`bench.zero_shot_pooling`: mean = all-MiniLM's own recipe, or cls = BiBERT untrained);
- BiBERT (CLS), MpBERT (first K tokens + Presence Weighting), MtBERT (CLS + aspect prediction), MADR and MADRAL
  (Aspect Extraction Network + fusion; MADRAL with aspect learning) with the three fusion networks (Weighted
  Sum, Presence Weighting, CLS-Gating; MADR with Presence Weighting, the paper's default), MUR and MURAL
  (aspect tokens + CLS-Gating; MURAL with multi-granularity aspect learning); DSSM on request (`--models`);
- ablations on request (`--models`): paper 000 Table 6 `madral_no_<aspect>`, `madral_no_other`,
  `madral_no_query` / `madral_no_doc` (aspect learning on one side only), relative to MADRAL (Presence
  Weighting); paper 001 Table 5 `mural_only_<aspect>` / `mural_only_<phrase|word|token>`, relative to MURAL.
Metrics on the test queries that have at least one product of relevance >= `eval.relevance_threshold`:
Recall@k over the WHOLE product corpus (exact search) and MRR@10 (paper 000 Recall@10k, paper 001 R@100 /
R@500: the corpus here is 41k products, so k = 10 / 100 / 1000), NDCG@k with gain 2^rel - 1 and per-query AUC
by re-ranking each query's judged products (paper 000 Sec. 8.3), aspect Accuracy@1 at phrase granularity for
the models that predict aspects (Table 5; queries: the test queries, documents: the whole corpus).
Significance: every row against BiBERT (Tables 4 / 3), every fusion against Weighted Sum (Table 7) and every
ablation against its full model (Tables 6 / 5), per metric, over the test queries: Student's paired t-test (the
papers' test; `bench.alpha`, paper 000 uses 0.01) and a two-sided paired randomisation test (sign flips,
`bench.draws`). With several seeds each seed is tested and so is the per-query mean over seeds (the table's
marks).

Budget on 2 CPU cores (measured with other work running): a fine-tuning step at batch 32 takes ~1.9 s (word
embeddings frozen, `bench.freeze_word_embeddings`; 2.9 s without), ~3.5 s for MUR / MURAL (9 aspect tokens);
the whole-corpus evaluation of one model takes ~200 s (41k titles in length-sorted batches at ~210/s), ~340 s
for MUR / MURAL. One seed of the default 11 rows: ~60 min, 38 of them encoding the corpus;
`--set bench.corpus_size=12000` (the test queries' judged products + a seeded sample) takes ~32 min.

    flock /tmp/madr_bench.lock python -m benchmarks.quality.homedepot --threads 2        # the table
    python -m benchmarks.quality.homedepot --seeds 0 1 2 --set bench.corpus_size=12000    # 3 seeds, ~95 min
    python -m benchmarks.quality.homedepot --models bm25 bibert madral_pw --set bench.corpus_size=3000 \\
        --set train.finetune.steps=4 --set homedepot.max_queries=1000 --tag smoke           # quick look (2 min)
    python -m benchmarks.quality.homedepot --seeds 0 --set bench.corpus_size=12000 --tag real_homedepot_ablations \
        --models bibert madral_pw mural madral_no_category madral_no_brand madral_no_color madral_no_other \
        madral_no_query madral_no_doc mural_only_category mural_only_brand mural_only_color mural_only_phrase \
        mural_only_word mural_only_token                                                   # Tables 6 / 5

Prints the tables (absolute values, relative change over BiBERT in %, fusions, aspect accuracy), machine,
versions and timings; writes <out-dir>/results/<tag>.json and <out-dir>/plots/<tag>.png (out-dir: benchmarks/)
after every seed. Each trained row's per-query result is kept in <output_dir>/seed<seed>/<row>/result.json with a
fingerprint of everything it depends on: a stopped run resumes at the next row, and adding a seed trains only it.
This module is the command line and the report's output; the rows, data, scoring, training (with that cache)
and the tables are in `benchmarks.quality.aspect_models`, shared with `benchmarks.quality.esci_transfer`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import load_average, machine_info, run_command
from benchmarks.common.results import write_result_json
from benchmarks.quality.aspect_models.data import eval_lengths, load_config, prepare
from benchmarks.quality.aspect_models.evaluation import means
from benchmarks.quality.aspect_models.report import Invocation, aggregate, budget_text, plot, report_text
from benchmarks.quality.aspect_models.rows import REFERENCES, ROWS, label_of, trained_rows
from benchmarks.quality.aspect_models.training import reference_rows, run_seed


def publish(ctx: Invocation, runs: list[dict]) -> dict[str, Any]:
    """Aggregate the seeds done so far; print the tables, machine and timings; write <tag>.json and <tag>.png."""
    cfg, seeds = ctx.cfg, [r["seed"] for r in runs]
    metrics = list(cfg.eval.retrieval_metrics) + list(cfg.eval.rerank_metrics)
    agg = aggregate(ctx, runs)
    source = "Home Depot" if ctx.home is not None else Path(cfg.data.catalog_dir or "synthetic catalog").name
    seconds = {**ctx.shared_seconds, **{f"seed{r['seed']} {k}": v for r in runs for k, v in r["seconds"].items()}}
    info = machine_info(load_average=load_average())
    table_text = "\n".join([
        report_text(ctx, agg, seeds, metrics, source),
        "\nmachine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + f"; load before {ctx.load_before}",
        "seconds: " + ", ".join(f"{k} " + "/".join(f"{x:.0f}" for x in v.values()) for k, v in seconds.items())])
    print(table_text, flush=True)
    result = {"benchmark": __spec__.name, "command": run_command(__spec__.name),
              "config": {"homedepot": ctx.home, "bench": ctx.bench, **cfg.to_dict()}, "rows": ctx.labels,
              "trained_rows": ctx.trained, "seeds": seeds, "data": ctx.sizes, "machine": info,
              "load_average_before": ctx.load_before, "wall_s": time.perf_counter() - ctx.start,
              "seconds": seconds, "metrics": metrics, "mean": agg["mean"], "std": agg["std"],
              "aspect_accuracy": agg["aspect_accuracy"],
              "per_seed": {r["seed"]: {k: {**means(v), **r["aspects"][k]} for k, v in r["per_query"].items()}
                           for r in runs},
              "training": {r["seed"]: r["training"] for r in runs}, "tests": agg["tests"],
              "tests_per_seed": agg["tests_per_seed"], "table": table_text}
    json_path = write_result_json(ctx.out_dir, ctx.tag, result)
    png = ctx.out_dir / "plots" / f"{ctx.tag}.png"
    title = (f"{source} {cfg.eval.split} ({ctx.sizes['evaluated_test_queries']} queries, corpus "
             f"{ctx.sizes['corpus']}); {Path(str(cfg.model.backbone.name_or_path)).name}; {budget_text(cfg)}; "
             f"seeds {seeds}")
    plot_metrics = tuple(m for m in ("recall@100", "ndcg@10") if m in metrics) or tuple(metrics[:2])
    order = [k for k in ctx.keys if k in agg["mean"]]
    if plot(order, ctx.labels, runs, agg["shared_means"], png, title, plot_metrics, ctx.bench["baseline"]):
        print(f"wrote {png}")
    print(f"wrote {json_path} ({result['wall_s']:.0f} s; load {ctx.load_before} -> {info['load_average']})")
    return result


# ---- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p, ROOT / "configs" / "real" / "homedepot.yaml", "real_homedepot_aspects")
    p.add_argument("--models", nargs="+", default=None, metavar="ROW",
                   help=f"rows (default: bench.models); known: {', '.join([*REFERENCES, *ROWS])} and the "
                        "ablations madral_no_<aspect|other|query|doc>, mural_only_<aspect|phrase|word|token>")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    home, cfg, bench = load_config(Path(args.config), args.set)
    seeds = list(args.seeds if args.seeds is not None else bench["seeds"])
    keys = list(dict.fromkeys(args.models if args.models is not None else bench["models"]))
    known = trained_rows(cfg)
    unknown = [k for k in keys if k not in known and k not in REFERENCES]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; known: {', '.join([*REFERENCES, *known])}")
    trained = [k for k in keys if k in known]
    refs = [k for k in keys if k in REFERENCES]
    start, load_before = time.perf_counter(), load_average()

    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    catalog, tokenizer, vocab, ev = prepare(home, cfg, bench)
    sizes = ev.summary(catalog)
    sizes["aspect_vocabulary_phrases"] = {a: len(vocab.get(a, "phrase")) for a in cfg.model.aspects}
    lengths = eval_lengths(tokenizer, ev, cfg)
    sizes["mean_tokens"] = {side: float(v.mean()) for side, v in lengths.items()}
    print("data: " + json.dumps(sizes), flush=True)
    labels = {k: label_of(k, bench, cfg) for k in keys}

    shared, shared_seconds = reference_rows(refs, cfg, ev, tokenizer, lengths, bench)
    ctx = Invocation(cfg, home, bench, keys, trained, labels, sizes, shared, shared_seconds, start, load_before,
                     Path(args.out_dir), args.tag)
    runs: list[dict] = []
    result = publish(ctx, runs) if not trained else {}
    for seed in seeds:  # the report is rewritten after every seed: a long run leaves its partial result behind
        runs.append(run_seed(trained, cfg, catalog, ev, tokenizer, vocab, lengths, seed, bench))
        result = publish(ctx, runs)
    return result


if __name__ == "__main__":
    main()
