"""Impressions -> training judgments: what each click and each skip says about a query-document pair.

* Positives: every document clicked (or bought) for the query. Its weight is the sum over its clicks of the
  clipped inverse propensity of the rank it was clicked at, w(rank) = min(1 / p(rank), clip) (Joachims et al.,
  WSDM'17, "Unbiased Learning-to-Rank with Biased Feedback", Eq. 9 and its clipping), normalised to mean 1 over the
  positives: a click at a rarely examined rank says more than one at rank 1. `debias=False` counts every click as
  1 (the naive baseline: clicks taken as labels, the old ranker's position bias inherited).
* With a click-noise floor `noise` > 0 (epsilon, `madr.clicks.noise`), the weight is the affine correction's
  (Vardasbi et al., CIKM'20, Eq. 11): every impression of the pair adds w(rank) (clicked - p(rank) epsilon), so the
  clicks an irrelevant document gets by chance are taken off before position is undone; a clicked pair whose sum
  is not above 0 is within the noise and is no positive.
* With `allowed` (the pairs whose posterior click rate is high enough, `madr.clicks.noise.pair_rates_above`), a
  clicked pair outside it is no positive: one click in a few impressions of an irrelevant document is noise.
* Negatives: documents shown above a clicked document of the same search (skipped: examined, by the click below
  them, and not chosen), only at ranks examined with probability >= `skip_min_examination` (a skip at a rank users
  rarely reach carries little signal) and never clicked for the query anywhere in the log (Joachims, KDD'02's
  "click > skip above" preference, kept only where it is not contradicted).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from madr.clicks.examination import ExaminationCurve, estimate_from_table, write_curve
from madr.clicks.harvesting import harvest_from_table
from madr.clicks.noise import ClickNoise, estimate_click_noise, likely_above


@dataclass(frozen=True)
class ClickJudgment:
    """A judged (query text, document) pair of a click log: `relevant` (clicked) or a skipped negative."""

    query: str
    doc_id: str
    relevant: bool
    weight: float
    clicks: int


def click_weight(rank: int, curve: ExaminationCurve | None, clip: float) -> float:
    """min(1 / p(rank), clip): the clipped inverse propensity of a click at `rank` (1 without a curve)."""
    if curve is None:
        return 1.0
    return min(1.0 / max(curve.at(rank), 1e-9), clip)


def click_judgments(impressions: pa.Table, curve: ExaminationCurve | None, *, clip: float = 10.0,
                    skip_negatives: bool = True, skip_min_examination: float = 0.5,
                    noise: float = 0.0, allowed: Collection[tuple[str, str]] | None = None) -> list[ClickJudgment]:
    """The judgments of a click log's impressions (module docstring); `curve=None` is the naive weighting (no
    noise floor either); `allowed` (None: every clicked pair): the (query, document) pairs that may be positives.
    Sorted by (query, document)."""
    cols = {n: impressions.column(n).to_pylist() for n in ("search_id", "query", "doc_id", "position", "clicked",
                                                            "purchased")}
    floor = noise if curve is not None else 0.0
    weight: dict[tuple[str, str], float] = defaultdict(float)
    clicks: dict[tuple[str, str], int] = defaultdict(int)
    searches: dict[str, list[tuple[int, str, bool]]] = defaultdict(list)
    query_of: dict[str, str] = {}
    for sid, query, doc, rank, clicked, bought in zip(*cols.values(), strict=True):
        chosen = bool(clicked or bought)
        if chosen or floor:
            w = click_weight(rank, curve, clip)
            weight[query, doc] += w * (float(chosen) - (curve.at(rank) * floor if floor else 0.0))
        if chosen:
            clicks[query, doc] += 1
        searches[sid].append((rank, doc, chosen))
        query_of[sid] = query
    positive = {k: w for k, w in weight.items() if clicks[k] and w > 0 and (allowed is None or k in allowed)}
    skipped: set[tuple[str, str]] = set()
    if skip_negatives:
        for sid, shown in searches.items():
            lowest_click = max((rank for rank, _, chosen in shown if chosen), default=0)
            for rank, doc, chosen in shown:
                examined = curve.at(rank) if curve is not None else 1.0
                if rank < lowest_click and not chosen and examined >= skip_min_examination:
                    skipped.add((query_of[sid], doc))
    mean = sum(positive.values()) / max(len(positive), 1)
    out = [ClickJudgment(q, d, True, w / mean, clicks[q, d]) for (q, d), w in positive.items()]
    out += [ClickJudgment(q, d, False, 1.0, 0) for q, d in skipped if not clicks[q, d]]
    return sorted(out, key=lambda j: (j.query, j.doc_id))


def log_curve(impressions: pa.Table, clicks: Any) -> ExaminationCurve:
    """The examination curve of a log's impressions by the estimator `clicks` (a `ClickLogConfig`) names:
    "harvest" (`madr.clicks.harvesting`), "em" (`madr.clicks.examination`), or "auto": harvesting where the log
    links every rank to rank 1 by enough interventions (on simulated logs it is far closer to the true curve than
    EM, whose free per-pair relevance absorbs the rank effect when pairs rarely move), else EM, with the reason
    harvesting refused the log in the curve's `fallback`."""
    if clicks.estimator in ("harvest", "auto"):
        try:
            return harvest_from_table(impressions, clicks.max_rank, clicks.min_interventions)
        except ValueError as refused:
            if clicks.estimator == "harvest":
                raise
            curve = estimate_from_table(impressions, clicks.max_rank)
            curve.fallback = str(refused)
            return curve
    if clicks.estimator == "em":
        return estimate_from_table(impressions, clicks.max_rank)
    raise ValueError(f"data.clicks.estimator must be auto, harvest or em, got {clicks.estimator!r}")


def log_noise(impressions: pa.Table, curve: ExaminationCurve, clicks: Any) -> ClickNoise:
    """The click-noise floor `clicks.click_noise` asks for: "auto" estimates it from the log
    (`madr.clicks.noise.estimate_click_noise`), a number is taken as set (0: plain inverse-propensity weights)."""
    if clicks.click_noise == "auto":
        return estimate_click_noise(impressions, curve)
    return ClickNoise(float(clicks.click_noise), "set")


def judge_log_impressions(impressions: pa.Table, clicks: Any,
                          out_dir: str | Path) -> tuple[ExaminationCurve, list[ClickJudgment]]:
    """A log's examination curve, estimated from its impressions (`log_curve`) and written to `out_dir` (`examination.json` +
    `.png`) with the click-noise floor the judgments used (`log_noise`, the curve's `click_noise`), and the judgments
    `clicks` (a `madr.config.ClickLogConfig`) asks for: clipped inverse-propensity weights from that curve, less the
    floor, with `debias`; naive weights without; positives only among the pairs whose posterior click rate is
    high with `rate_quantile` (`madr.clicks.noise.pair_rates_above`)."""
    if impressions.num_rows == 0:
        raise ValueError(f"{clicks.path}: the click log holds no impression (see {out_dir}/summary.json)")
    curve = log_curve(impressions, clicks)
    noise = log_noise(impressions, curve, clicks) if clicks.debias else ClickNoise(0.0, "naive")
    curve.click_noise = noise.to_dict()
    write_curve(curve, out_dir)
    allowed = likely_above(impressions, curve, clicks.rate_quantile) if clicks.rate_quantile is not None else None
    judgments = click_judgments(impressions, curve if clicks.debias else None, clip=clicks.clip,
                                skip_negatives=clicks.skip_negatives, skip_min_examination=clicks.skip_min_examination,
                                noise=noise.epsilon, allowed=allowed)
    return curve, judgments


def summarize_judgments(judgments: list[ClickJudgment]) -> dict[str, Any]:
    """Counts and the positives' weight range, for the run's report."""
    positives = [j for j in judgments if j.relevant]
    weights = sorted(j.weight for j in positives)
    return {"positives": len(positives), "skip_negatives": len(judgments) - len(positives),
            "queries": len({j.query for j in judgments}),
            "weight_min": round(weights[0], 4) if weights else None,
            "weight_median": round(weights[len(weights) // 2], 4) if weights else None,
            "weight_max": round(weights[-1], 4) if weights else None}
