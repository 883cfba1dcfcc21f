"""Catalog and evaluation set of the product-search benchmark: the Home Depot catalog (written once under the
output dir) and the evaluated test queries over the corpus."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from madr.config import ExperimentConfig, config_hash
from madr.data.schema import Catalog
from madr.recipes.aspects.experiment import load_catalog


def catalog_for(home: dict | None, cfg: ExperimentConfig) -> Catalog:
    """The Home Depot catalog (written once per `homedepot:` settings under the output dir), else `data:`."""
    if home is not None:
        from madr.data.sources import homedepot

        code = hashlib.sha256(Path(homedepot.__file__).read_bytes()).hexdigest()  # a changed annotator: rewrite
        where = Path(cfg.output_dir) / f"catalog-{config_hash({**home, 'code': code})}"
        if not (where / "judgments.parquet").is_file():
            t0 = time.perf_counter()
            args = {k: v for k, v in home.items() if k != "path"}
            if "fractions" in args:
                args["fractions"] = tuple(args["fractions"])
            homedepot.write_homedepot_catalog(Path(home["path"]), where, **args)
            print(f"wrote catalog {where} ({time.perf_counter() - t0:.0f} s)", flush=True)
        cfg.data.catalog_dir = str(where)
    return load_catalog(cfg)


@dataclass
class EvalSet:
    """The evaluated test queries (>= 1 relevant product), the whole corpus, and what the metrics need."""

    product_ids: list[str]
    doc_texts: list[str]
    doc_aspects: list[dict[str, list[str]]]
    query_ids: list[str]
    query_texts: list[str]
    query_aspects: list[dict[str, list[str]]]
    qrels: dict[str, dict[str, float]]
    judged: list[np.ndarray]  # per query: corpus rows of its judged products (qrels order)

    @classmethod
    def of(cls, catalog: Catalog, split: str, threshold: float, corpus_size: int | None = None,
           seed: int = 0) -> EvalSet:
        """`corpus_size` (None: all) keeps the queries' judged products and a seeded sample of the others."""
        qrels_all = catalog.qrels(split)
        queries = [q for q in catalog.queries_in(split)
                   if any(r >= threshold for r in qrels_all.get(q.query_id, {}).values())]
        if not queries:
            raise SystemExit(f"no {split} query has a product of relevance >= {threshold}")
        qrels = {q.query_id: {pid: float(r) for pid, r in qrels_all[q.query_id].items()} for q in queries}
        products = list(catalog.products)
        if corpus_size is not None and corpus_size < len(products):
            judged = {pid for docs in qrels.values() for pid in docs}
            others = [p for p in products if p.product_id not in judged]
            rng = np.random.default_rng(seed)
            keep = judged | {others[i].product_id for i in rng.choice(
                len(others), max(0, min(len(others), corpus_size - len(judged))), replace=False)}
            products = [p for p in products if p.product_id in keep]
        row = {p.product_id: i for i, p in enumerate(products)}
        return cls([p.product_id for p in products], [catalog.product_text(p) for p in products],
                   [p.aspects for p in products], [q.query_id for q in queries], [q.text for q in queries],
                   [q.aspects for q in queries], qrels,
                   [np.array([row[pid] for pid in qrels[q.query_id]], dtype=np.int64) for q in queries])

