"""The pipeline's data stage: `python -m pipelines.data.prepare --config EXPERIMENT.yaml`.

From the experiment's data section to the files every later stage reads (layout: `madr.layout`):
1. the catalog: a click log `data.clicks` (`pipelines.data.click_log`, `madr.clicks`: its judgments the training
   split's, its estimated examination curve in `data/clicks/examination.json` + `.png`), `data.catalog_dir` (the `madr.data.schema` layout; a bad row is an error naming the file,
   the row and the field), a BEIR directory `data.beir_dir` with optional TREC / BEIR qrels files
   `data.qrels` (`madr.data.beir`, local or a pyarrow filesystem URI; bad rows are counted and quarantined
   under `data/quarantine` with their file, line and field, as every ingested source's), or the seeded
   synthetic multilingual multi-aspect world (`data.synthetic_products`, `synthetic_queries`, `languages`);
2. the corpus the encode stage indexes: one row per product with its index id (`doc_id`) and text and
   aspect fields, written by Ray Data in blocks (steps 2, 4 and 5 run in this process, on the same batch
   functions, for a catalog of at most `IN_PROCESS_ROWS` products and queries: `pipelines.data.batched`);
3. the queries and qrels of `eval.split` (evaluation) and of the train split (hard-negative mining);
4. the tokenizer (the backbone's, or a WordPiece trained on the catalog) and the phrase / word / token
   aspect vocabularies, aggregated by Ray Data over products and queries (paper 001 Sec. 5.3.1);
5. aspect coverage statistics (paper 000 Table 3 / paper 001 Table 2);
6. `prepared.json` last, which tells the training stages that the catalog is complete and whose it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.clicks.catalog import judge_click_log, read_impressions
from madr.config import ExperimentConfig, load_config
from madr.data.schema import JUDGMENTS_FILE, PRODUCTS_FILE, QUERIES_FILE, Catalog
from madr.data.synthetic.catalog import generate_catalog
from madr.layout import RunLayout, mark_prepared
from madr.modeling.backbone import resolve_backbone_path
from madr.recipes.aspects.experiment import prepare_tokenizer, read_beir_catalog
from pipelines.data.batched import IN_PROCESS_ROWS

CORPUS_ROWS_PER_FILE = 50_000


def click_log_catalog(cfg: ExperimentConfig, log: Any = print) -> tuple[Catalog, str]:
    """`data.clicks`: the log read on Ray Data (`pipelines.data.click_log`), its examination curve estimated and
    its judgments made (`madr.clicks.catalog.judge_click_log`), everything under `<output_dir>/data/clicks`."""
    from pipelines.data.click_log import ingest_click_log

    clicks, out = cfg.data.clicks, RunLayout.of(cfg).clicks
    summary = ingest_click_log(clicks.format, clicks.path, out, out / "quarantine", queries=clicks.queries,
                               position_base=clicks.position_base)
    base = Catalog.read(cfg.data.catalog_dir, aspect_names=cfg.model.aspects) if cfg.data.catalog_dir else None
    catalog, report = judge_click_log(read_impressions(out), clicks, out, base, cfg.model.aspects, summary)
    searches, judged = summary["searches"], report["judgments"]
    log(f"[data] click log {clicks.path}: {searches['events']} events, {searches['impressions']} impressions, "
        f"{searches['clicked_impressions']} clicked, {searches['duplicate_events']} duplicate events; "
        f"examination ({report['examination']['estimator']}) "
        f"{[round(p, 2) for p in report['examination']['propensity']]} -> {out}/examination.png; "
        f"{judged['positives']} positives, {judged['skip_negatives']} skipped negatives")
    products = f"products of {cfg.data.catalog_dir}" if base is not None else "products the log describes"
    return catalog, f"click log {clicks.path} ({clicks.format}, {'debiased' if clicks.debias else 'naive'}), {products}"


def source_catalog(cfg: ExperimentConfig, log: Any = print) -> tuple[Catalog, str]:
    """The catalog the config names (validated while read), or a generated one; and where it came from."""
    if cfg.data.clicks is not None:
        return click_log_catalog(cfg, log)
    if cfg.data.catalog_dir:
        return Catalog.read(cfg.data.catalog_dir, aspect_names=cfg.model.aspects), cfg.data.catalog_dir
    if cfg.data.beir_dir:
        catalog, summary = read_beir_catalog(cfg)
        log(f"[data] {summary.format()}\n[data] quarantine -> {RunLayout.of(cfg).quarantine}")
        qrels = "".join(f", {split} qrels {path}" for split, path in sorted(cfg.data.qrels.items()))
        return catalog, f"BEIR directory {cfg.data.beir_dir}{qrels}"
    catalog = generate_catalog(cfg.data.synthetic_products, cfg.data.synthetic_queries, seed=cfg.data.seed,
                               languages=cfg.data.languages)
    where = (f"synthetic world (seed {cfg.data.seed}, {cfg.data.synthetic_products} products, "
             f"{cfg.data.synthetic_queries} queries, languages {','.join(cfg.data.languages)})")
    return catalog, where


def corpus_table(products: pa.Table, aspects: list[str]) -> pa.Table:
    """Products -> the corpus of the encode stage: `doc_id` = row number; the aspect lists are kept (the
    index's DocStore returns them, and the search API's aspect filters match any of their values)."""
    columns: dict[str, Any] = {"doc_id": pa.array(np.arange(products.num_rows, dtype=np.int64)),
                               "product_id": products.column("product_id"),
                               "title": products.column("title"),
                               "description": products.column("description")}
    for a in aspects:
        columns[a] = products.column(a)
    return pa.table(columns)


def write_corpus(ray: Any, products: pa.Table, aspects: list[str], out: Path, in_process: bool = False) -> int:
    """The corpus of the catalog's `products` as Parquet files written by Ray Data (ids assigned in file order
    before distribution); with `in_process`, one file written here."""
    table = corpus_table(products, aspects)
    if in_process:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        pq.write_table(table, out / "part-000000.parquet")
        return table.num_rows
    ds = ray.data.from_arrow(table).repartition(max(1, -(-table.num_rows // CORPUS_ROWS_PER_FILE)))
    ds.write_parquet(str(out), mode="overwrite")
    return table.num_rows


def write_split(catalog_dir: Path, split: str, queries_out: Path, qrels_out: Path,
                required: bool = True) -> tuple[int, int]:
    """Queries (query_id, text, language) and qrels (query_id, product_id, relevance) of one split; a split
    without queries is an error when `required` (the evaluation split), else written empty (a BEIR set that
    ships only test qrels has no training queries to mine)."""
    queries = pq.read_table(catalog_dir / QUERIES_FILE)
    queries = queries.filter(pa.compute.equal(queries.column("split"), split))
    if queries.num_rows == 0 and required:
        raise ValueError(f"{catalog_dir / QUERIES_FILE}: no queries of split {split!r}")
    judgments = pq.read_table(catalog_dir / JUDGMENTS_FILE)
    judgments = judgments.filter(pa.compute.is_in(judgments.column("query_id"), queries.column("query_id")))
    queries_out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(queries.select(["query_id", "text", "language"]), queries_out)
    pq.write_table(judgments.select(["query_id", "product_id", "relevance"]), qrels_out)
    return queries.num_rows, judgments.num_rows


def tokenizer_path(cfg: ExperimentConfig, catalog: Catalog) -> str:
    """A directory `load_tokenizer` opens: `data.tokenizer` or the backbone's, else a WordPiece trained on
    the catalog and saved under `<output_dir>/tokenizer` (where the training stages find it)."""
    prepare_tokenizer(cfg, catalog)
    named = cfg.data.tokenizer or cfg.model.backbone.name_or_path
    return resolve_backbone_path(named) if named else str(Path(cfg.output_dir) / "tokenizer")


def prepare(cfg: ExperimentConfig, log: Any = print) -> dict[str, Any]:
    """Run the data stage (module docstring); returns its summary (also written to `data/summary.json`)."""
    import ray

    from pipelines.data.stats import aspect_stats
    from pipelines.data.vocab_job import build_vocabularies_ray

    start = time.perf_counter()
    layout = RunLayout.of(cfg)
    (layout.catalog / "prepared.json").unlink(missing_ok=True)  # the catalog is incomplete from here on
    catalog, origin = source_catalog(cfg, log)
    catalog.write(layout.catalog)
    log(f"[data] catalog from {origin}: {len(catalog.products)} products, {len(catalog.queries)} queries, "
        f"{len(catalog.judgments)} judgments -> {layout.catalog}")
    aspects = list(cfg.model.aspects)
    in_process = len(catalog.products) + len(catalog.queries) <= IN_PROCESS_ROWS
    products = pq.read_table(layout.catalog / PRODUCTS_FILE)
    docs = write_corpus(ray, products, aspects, layout.corpus, in_process)
    log(f"[data] corpus: {docs} documents -> {layout.corpus} "
        f"({'in this process' if in_process else 'by Ray Data'}; corpus, vocabularies and statistics)")
    n_queries, n_qrels = write_split(layout.catalog, cfg.eval.split, layout.queries("eval"), layout.qrels("eval"))
    log(f"[data] evaluation split {cfg.eval.split!r}: {n_queries} queries, {n_qrels} judgments")
    n_train, _ = write_split(layout.catalog, "train", layout.queries("train"), layout.qrels("train"), required=False)
    if not n_train:
        log("[data] no training queries (the train split is empty): the training stages need some")
    if cfg.eval.split != "dev":  # the tune stage's queries (fusion weights are chosen on them, never on test)
        n_dev, _ = write_split(layout.catalog, "dev", layout.queries("dev"), layout.qrels("dev"), required=False)
        log(f"[data] dev split: {n_dev} queries")
    tokenizer = tokenizer_path(cfg, catalog)
    if in_process:  # the same batch functions, without starting Ray Data tasks (pipelines.data.batched)
        queries = pq.read_table(layout.catalog / QUERIES_FILE)
        annotated = pa.concat_tables([products.select(aspects), queries.select(aspects)], promote_options="default")
        sides = {"item": products, "query": queries}
    else:
        annotated = ray.data.read_parquet([str(layout.catalog / PRODUCTS_FILE), str(layout.catalog / QUERIES_FILE)],
                                          columns=aspects)
        sides = {"item": ray.data.read_parquet(str(layout.catalog / PRODUCTS_FILE)),
                 "query": ray.data.read_parquet(str(layout.catalog / QUERIES_FILE))}
    vocabs = build_vocabularies_ray(annotated, aspects, tokenizer=tokenizer, min_freq=cfg.model.vocab_min_freq)
    vocabs.save(layout.vocab)
    stats = aspect_stats(sides, aspects, vocabs)
    layout.stats.write_text(json.dumps(stats.to_dict(), indent=1))
    log(stats.format())
    counts = {"products": len(catalog.products), "queries": len(catalog.queries),
              "judgments": len(catalog.judgments), "corpus": docs, "eval_queries": n_queries}
    summary = {"origin": origin, "counts": counts, "tokenizer": tokenizer, "vocab": str(layout.vocab),
               "seconds": round(time.perf_counter() - start, 2)}
    if (layout.clicks / "report.json").is_file() and cfg.data.clicks is not None:
        summary["clicks"] = json.loads((layout.clicks / "report.json").read_text())
    (layout.data / "summary.json").write_text(json.dumps(summary, indent=1))
    mark_prepared(cfg, counts)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.data.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="experiment YAML (e.g. configs/demo.yaml)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray (default: all)")
    args = parser.parse_args(argv)
    from pipelines.runtime import init_ray

    try:
        cfg = load_config(args.config)
        init_ray(args.num_cpus)
        summary = prepare(cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
