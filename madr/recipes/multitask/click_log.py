"""A raw click log as the multi-task recipe's click task (paper 004 Sec. III-A), debiased as in `madr.clicks`.

`data.clicks` (`madr.config.ClickLogConfig`, the product-search recipe's setting, same keys) names the log;
`apply_click_log(data, cfg, out_dir)` replaces the training click records of `data` with the log's:

1. the log is read in process (`madr.clicks.log.read_click_log`: bad rows quarantined under
   `out_dir/quarantine`, impressions and `summary.json` under `out_dir`; the multi-task data stage needs no Ray);
2. the examination curve is estimated from the log by EM (`madr.clicks.examination`) or intervention harvesting
   (`madr.clicks.harvesting`), as `estimator` says, and written as
   `out_dir/examination.json` + `.png`;
3. the judgments (`madr.clicks.judgments.click_judgments`): clipped inverse-propensity weights of the clicks,
   skipped documents above a click as negatives;
4. one `ClickRecord` per (query, shown document) pair of the log (`log_click_records`): clicked if any of its
   impressions was, its impressions and clicks counted, its best rank as `position`. A clicked pair's `weight`
   is the mean clipped inverse propensity of its clicks (`pair_weights`), normalised to mean 1 over the clicked
   pairs kept: paper 004 trains each clicked pair once, so the click count is no weight here, and
   `debias: false` gives every pair weight 1. The query's skip negatives ride on its clicked records
   (`negatives`, at most `MAX_SKIP_NEGATIVES`), extra negatives of that query in the triplet loss (Eq. 3).

Left out, and counted in `out_dir/report.json` (`left_out`): impressions whose document has no text in the log
(doc text / UBI `object_description`) and impressions of a query that is a held-out evaluation query (no
evaluation query trains). The held-out click evaluation stays on the recipe's judged candidates (synthetic
catalog or `real_data:`): its NDCG needs graded relevance, which clicks only give biased by the very position
effect debiased here, so a hashed holdout of the log's queries (`clicks.holdout`, product search without a
catalog) is not used.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from madr.clicks.catalog import log_products, normalise_query, query_id, report
from madr.clicks.judgments import ClickJudgment, judge_log_impressions
from madr.data.records import ClickRecord, MultilingualData

CLICKS_DIR = Path("data") / "clicks"  # under the run's output_dir, as the product-search data stage
MAX_SKIP_NEGATIVES = 8


def pair_weights(judgments: Sequence[ClickJudgment]) -> dict[tuple[str, str], float]:
    """(query, document) -> the mean clipped inverse propensity of its clicks (up to the judgments' common
    normaliser): a judgment's weight sums them over its clicks."""
    return {(j.query, j.doc_id): j.weight / max(j.clicks, 1) for j in judgments if j.relevant}


def normalise_weights(records: list[ClickRecord]) -> list[ClickRecord]:
    """The clicked records' weights divided by their mean (mean 1; the others keep 1), to 9 decimals (equal
    weights become exactly 1)."""
    clicked = [r.weight for r in records if r.clicked]
    mean = sum(clicked) / max(len(clicked), 1)
    return [dataclasses.replace(r, weight=round(r.weight / mean, 9)) if r.clicked else r for r in records]


def skipped_docs(judgments: Sequence[ClickJudgment]) -> dict[str, list[str]]:
    """Query -> the documents skipped above a click for it (the judgments' negatives), sorted."""
    out: dict[str, list[str]] = defaultdict(list)
    for j in judgments:
        if not j.relevant:
            out[j.query].append(j.doc_id)
    return {q: sorted(docs) for q, docs in out.items()}


def _pairs(impressions: pa.Table) -> dict[tuple[str, str], dict[str, int]]:
    """(query, document) -> impressions, clicked impressions and best rank."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    cols = [impressions.column(n).to_pylist() for n in ("query", "doc_id", "position", "clicked", "purchased")]
    for query, doc, rank, clicked, bought in zip(*cols, strict=True):
        pair = out.setdefault((query, doc), {"impressions": 0, "clicks": 0, "position": rank})
        pair["impressions"] += 1
        pair["clicks"] += bool(clicked or bought)
        pair["position"] = min(pair["position"], rank)
    return out


def log_click_records(impressions: pa.Table, judgments: Sequence[ClickJudgment], field: str,
                      eval_queries: Collection[str] = ()) -> tuple[list[ClickRecord], dict[str, int]]:
    """The click records of a log's impressions (module docstring, step 4; the document text under `field`),
    sorted by (query, document), and the counts of what was left out. `eval_queries`: normalised query texts."""
    texts = {p.product_id: p.title for p in log_products(impressions)}
    weights, skipped = pair_weights(judgments), skipped_docs(judgments)
    left_out: Counter = Counter()
    records = []
    for (query, doc), pair in sorted(_pairs(impressions).items()):
        if normalise_query(query) in eval_queries:
            left_out["evaluation_query_impressions"] += pair["impressions"]
            continue
        if doc not in texts:
            left_out["impressions_without_text"] += pair["impressions"]
            continue
        clicked = pair["clicks"] > 0
        negatives = {d: texts[d] for d in skipped.get(query, []) if d in texts} if clicked else {}
        records.append(ClickRecord(query, {field: texts[doc]}, clicked, pair["position"], pair["impressions"],
                                   pair["clicks"], query_id=query_id(query), doc_id=doc,
                                   weight=weights.get((query, doc), 1.0) if clicked else 1.0,
                                   negatives=dict(list(negatives.items())[:MAX_SKIP_NEGATIVES])))
    missing = sum(d not in texts for docs in skipped.values() for d in docs)
    if missing:
        left_out["skip_negatives_without_text"] = missing
    return normalise_weights(records), dict(left_out)


def records_summary(records: Sequence[ClickRecord]) -> dict[str, Any]:
    """Counts of the click task's records from the log, and its clicked pairs' weight range."""
    clicked = [r for r in records if r.clicked]
    weights = sorted(r.weight for r in clicked)
    return {"pairs": len(records), "clicked_pairs": len(clicked), "queries": len({r.query for r in records}),
            "with_skip_negatives": sum(bool(r.negatives) for r in clicked),
            "skip_negatives": sum(len(r.negatives) for r in clicked),
            "weight_min": round(weights[0], 4) if weights else None,
            "weight_max": round(weights[-1], 4) if weights else None}


def judge_log(impressions: pa.Table, clicks: Any, out_dir: str | Path, field: str, eval_queries: Collection[str],
              log_summary: dict[str, Any]) -> tuple[list[ClickRecord], dict[str, Any]]:
    """Steps 2-4 of the module docstring on a log's impressions; `out_dir/report.json` says what they did."""
    curve, judgments = judge_log_impressions(impressions, clicks, out_dir)
    records, left_out = log_click_records(impressions, judgments, field, eval_queries)
    summary = {**report(log_summary, curve, judgments, left_out, clicks.debias), "records": records_summary(records),
               "path": clicks.path, "format": clicks.format}
    (Path(out_dir) / "report.json").write_text(json.dumps(summary, indent=1))
    return records, summary


def apply_click_log(data: MultilingualData, clicks: Any, out_dir: str | Path,
                    field: str = "title") -> tuple[MultilingualData, dict[str, Any]]:
    """`data` with its training click records replaced by those of the log `clicks` (`ClickLogConfig`), and the
    click summary (what `report.json` holds). Files under `out_dir` (module docstring)."""
    from madr.clicks.log import read_click_log

    out = Path(out_dir)
    log = read_click_log(clicks.path, clicks.format, clicks.queries, position_base=clicks.position_base)
    log_summary = log.write(out, out / "quarantine")
    held_out = {normalise_query(r.query) for r in data.clicks_eval}
    records, summary = judge_log(log.impressions, clicks, out, field, held_out, log_summary)
    if not any(r.clicked for r in records):
        raise ValueError(f"{clicks.path}: no clicked pair with a document text is left for the click task "
                         f"(left out: {summary['left_out']}; see {out / 'report.json'})")
    return dataclasses.replace(data, clicks_train=records), summary
