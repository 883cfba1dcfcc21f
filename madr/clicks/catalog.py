"""A click log as a catalog (`madr.data.schema`): the click-derived judgments become the training split's.

`click_catalog(judgments, products, base=...)`:
* with a `base` catalog (`data.catalog_dir`): its products, its dev and test queries with their judgments (the
  evaluation stays on judgments), the click queries as the training queries; its own training queries are
  replaced; a click query whose text is a dev / test query's is left out (no test query trains), and so is a
  judgment of a product the catalog lacks (both counted);
* without one: the products the log describes (`log_products`: a document's text from the log; documents without
  any are left out, counted), the click queries split by a hash of their text into train and `holdout` dev and test
  (judged by clicks: biased, but all a log alone has).
Query ids are `click-` + a hash of the normalised text; positives are relevance 4 (ESCI "E") with their weight,
skipped negatives relevance 0 ("I"). `build_click_catalog` is the whole in-process path from a `ClickLogConfig`
(read, estimate, judge, write the report); the data stage (`pipelines.data.prepare`) runs the reading on Ray Data.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from madr.clicks.examination import ExaminationCurve
from madr.clicks.judgments import ClickJudgment, judge_log_impressions, summarize_judgments
from madr.data.schema import Catalog, Judgment, Product, Query

POSITIVE, NEGATIVE = (4, "E"), (0, "I")


def normalise_query(text: str) -> str:
    return " ".join(text.lower().split())


def query_id(text: str) -> str:
    return "click-" + hashlib.sha1(normalise_query(text).encode("utf-8")).hexdigest()[:12]


def _split(text: str, holdout: float) -> str:
    u = int(hashlib.sha1(("split/" + normalise_query(text)).encode("utf-8")).hexdigest()[:8], 16) / 2 ** 32
    return "test" if u < holdout else "dev" if u < 2 * holdout else "train"


def log_products(impressions: pa.Table) -> list[Product]:
    """One product per document the log describes (its first non-empty `doc_text`), sorted by id."""
    texts: dict[str, str] = {}
    for doc, text in zip(impressions.column("doc_id").to_pylist(), impressions.column("doc_text").to_pylist(),
                         strict=True):
        if text and text.strip() and doc not in texts:
            texts[doc] = text.strip()
    return [Product(doc, texts[doc], "") for doc in sorted(texts)]


def click_catalog(judgments: Sequence[ClickJudgment], products: Sequence[Product], base: Catalog | None = None,
                  holdout: float = 0.1, aspect_names: Sequence[str] = ()) -> tuple[Catalog, dict[str, int]]:
    """The catalog (module docstring) and the counts of what was left out."""
    known = {p.product_id for p in products}
    left_out: Counter = Counter()
    queries: dict[str, Query] = {}
    held: set[str] = set()
    kept_queries: list[Query] = []
    kept_judgments: list[Judgment] = []
    if base is not None:
        held = {normalise_query(q.text) for q in base.queries if q.split != "train"}
        kept_queries = [q for q in base.queries if q.split != "train"]
        ids = {q.query_id for q in kept_queries}
        kept_judgments = [j for j in base.judgments if j.query_id in ids]
    out: list[Judgment] = []
    for j in judgments:
        if j.doc_id not in known:
            left_out["unknown_products"] += 1
            continue
        if normalise_query(j.query) in held:
            left_out["evaluation_queries"] += 1
            continue
        qid = query_id(j.query)
        if qid not in queries:
            split = "train" if base is not None else _split(j.query, holdout)
            queries[qid] = Query(qid, j.query, {a: [] for a in aspect_names}, split)
        relevance, esci = POSITIVE if j.relevant else NEGATIVE
        out.append(Judgment(qid, j.doc_id, relevance, esci, float(j.weight)))
    catalog = Catalog(list(products), kept_queries + list(queries.values()), kept_judgments + out, list(aspect_names))
    return catalog.validate(), dict(left_out)


def report(log_summary: dict[str, Any], curve: ExaminationCurve, judgments: Sequence[ClickJudgment],
           left_out: dict[str, int], debias: bool) -> dict[str, Any]:
    """What the run's report says about the click log: reading, the examination curve, the judgments."""
    examination = {"estimator": curve.estimator, "propensity": curve.propensity, "iterations": curve.iterations,
                   "pairs_at_several_ranks": curve.pairs_at_several_ranks, "interventions": curve.interventions,
                   "click_noise": curve.click_noise}
    return {"log": log_summary, "examination": examination,
            "debiased": debias, "judgments": summarize_judgments(list(judgments)), "left_out": left_out}


def judge_click_log(impressions: pa.Table, clicks: Any, out_dir: str | Path, base: Catalog | None,
                    aspect_names: Sequence[str], log_summary: dict[str, Any]) -> tuple[Catalog, dict[str, Any]]:
    """From a log's impressions to the catalog: the examination curve (`out_dir/examination.json` + `.png`), the
    judgments (`ClickLogConfig` `clicks`), the catalog and `out_dir/report.json`."""
    curve, judgments = judge_log_impressions(impressions, clicks, out_dir)
    products = base.products if base is not None else log_products(impressions)
    catalog, left_out = click_catalog(judgments, products, base, clicks.holdout, aspect_names)
    summary = report(log_summary, curve, judgments, left_out, clicks.debias)
    (Path(out_dir) / "report.json").write_text(json.dumps(summary, indent=1))
    return catalog, summary


def build_click_catalog(clicks: Any, out_dir: str | Path, base: Catalog | None = None,
                        aspect_names: Sequence[str] = ()) -> tuple[Catalog, dict[str, Any]]:
    """In process: read the log (`madr.clicks.log`, quarantine under `out_dir/quarantine`), then `judge_click_log`."""
    from madr.clicks.log import read_click_log

    out = Path(out_dir)
    log = read_click_log(clicks.path, clicks.format, clicks.queries, position_base=clicks.position_base)
    summary = log.write(out, out / "quarantine")
    return judge_click_log(log.impressions, clicks, out, base, aspect_names, summary)


def read_impressions(directory: str | Path) -> pa.Table:
    """The impressions Parquet parts written by either reader."""
    return pq.read_table(Path(directory) / "impressions")
