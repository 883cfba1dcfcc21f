"""Fit a trained aspect model's temperatures on held-out annotated texts (`madr.modeling.calibration`).

`calibrate` runs the model's towers over query and document texts with aspect annotations (the dev split's
search terms and the products they judged, for a catalog: `dev_texts`), fits one temperature per aspect and
side, and reports per aspect the Accuracy@1 (unchanged by T), the mean top-value confidence and the expected
calibration error before and after, and what an aspect filter would use (`madr.search.aspect_match`): the share of
the items whose calibrated top value reaches `ASPECT_MIN_CONFIDENCE` and that value's Accuracy@1 among them (the
filter's precision on items that name the aspect; a query's presence probability, which the filter also
multiplies in, is left out).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from madr.data.schema import Catalog
from madr.modeling.batching import pad_labels
from madr.modeling.calibration import (
    AspectCalibration,
    correct_top,
    expected_calibration_error,
    fit_temperature,
    scaled_nll,
    top_confidence,
)
from madr.modeling.model import BiEncoder, objective_keys
from madr.recipes.aspects.evaluation import phrase_logits
from madr.serve_config import ASPECT_MIN_CONFIDENCE

Annotations = list[dict[str, list[str]]]


def value_labels(model: BiEncoder, aspect: str, annotations: Annotations) -> torch.Tensor:
    """[N, M] phrase value ids of each item's `aspect` annotations, padded with -1 (none: a row of -1)."""
    voc = model.vocabularies.get(aspect, "phrase")
    return pad_labels([voc.encode(a.get(aspect, [])) for a in annotations])


LogitsOf = Callable[[list[str], str], dict[str, torch.Tensor]]


def labelled_logits(model: BiEncoder, texts: dict[str, list[str]], annotations: dict[str, Annotations],
                    batch_size: int = 128, logits_of: LogitsOf | None = None,
                    ) -> dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]]:
    """{(side, objective key): (logits [N, V], labels [N, M])} over the items of `texts[side]` with an annotation of
    that aspect in the model's vocabularies. `logits_of(texts, side)` gives the phrase logits (default: `model`
    encodes the texts, `phrase_logits`; `madr.training.aspect_heads.FrozenVectors.phrase_logits` reuses vectors
    already computed). Raises when the model learns no aspects."""
    if not model.predicts_aspect_values:
        raise ValueError(f"model {model.config.name} predicts no aspect values to calibrate")
    aspect_of = {k: a for k, a, g in objective_keys(model.config) if g == "phrase"}
    out = {}
    for side, side_texts in texts.items():
        if len(side_texts) != len(annotations[side]):
            raise ValueError(f"calibrate: {len(side_texts)} {side} texts but {len(annotations[side])} annotations")
        logits_by_key = (logits_of(side_texts, side) if logits_of is not None
                         else phrase_logits(model, side_texts, side, batch_size))
        for key, logits in logits_by_key.items():
            labels = value_labels(model, aspect_of[key], annotations[side])
            has = (labels >= 0).any(dim=1)
            if bool(has.any()):
                out[(side, key)] = (logits[has], labels[has])
    return out


def calibration_report(items: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]],
                       calibration: AspectCalibration) -> dict[str, dict[str, float]]:
    """Per "side/key": {items, temperature, accuracy@1, confidence / ece / nll (Eq. 3) before and after, and at the
    filter's confidence (module docstring) confident_share and confident_accuracy@1 (None when none reaches it)}."""
    report = {}
    for (side, key), (logits, labels) in items.items():
        t = calibration.temperature(side, key)
        _, right = correct_top(logits, labels)
        before, _ = top_confidence(logits)
        after, _ = top_confidence(logits, t)
        report[f"{side}/{key}"] = {
            "items": len(labels), "temperature": t, "accuracy@1": float(right.float().mean()),
            "confidence_before": float(before.mean()), "confidence_after": float(after.mean()),
            "ece_before": expected_calibration_error(before, right), "ece_after": expected_calibration_error(after, right),
            "nll_before": scaled_nll(logits, labels, 1.0), "nll_after": scaled_nll(logits, labels, t),
            **confident(after, right)}
    return report


def confident(confidence: torch.Tensor, right: torch.Tensor,
              threshold: float = ASPECT_MIN_CONFIDENCE) -> dict[str, float | None]:
    """The share of items whose top value's confidence reaches ``threshold``, and that value's Accuracy@1 among
    them (None when none does)."""
    sure = confidence >= threshold
    return {"confident_at": threshold, "confident_share": float(sure.float().mean()),
            "confident_accuracy@1": float(right[sure].float().mean()) if bool(sure.any()) else None}


def calibrate(model: BiEncoder, texts: dict[str, list[str]], annotations: dict[str, Annotations],
              fitted_on: str = "", batch_size: int = 128, logits_of: LogitsOf | None = None,
              ) -> tuple[AspectCalibration, dict[str, dict[str, float]]]:
    """Fit the temperature of every (side, aspect) with annotated items in `texts[side]` / `annotations[side]`;
    returns the calibration and its `calibration_report` on the same items (`logits_of`: see `labelled_logits`).
    Raises when the model learns no aspects or no item has an annotation in its vocabularies."""
    items = labelled_logits(model, texts, annotations, batch_size, logits_of)
    if not items:
        raise ValueError("calibrate: no query or document has an annotation in the model's vocabularies")
    temps: dict[str, dict[str, float]] = {}
    for (side, key), (logits, labels) in items.items():
        temps.setdefault(side, {})[key] = fit_temperature(logits, labels)
    calibration = AspectCalibration(temps, fitted_on)
    return calibration, calibration_report(items, calibration)


def dev_texts(catalog: Catalog, split: str = "dev") -> tuple[dict[str, list[str]], dict[str, Annotations]]:
    """The `split` search terms and the products they judged, with their aspect annotations, by side."""
    queries = list(catalog.queries_in(split))
    if not queries:
        raise ValueError(f"catalog has no queries in split {split!r} to calibrate on")
    qids = {q.query_id for q in queries}
    judged = {j.product_id for j in catalog.judgments if j.query_id in qids}
    products = [p for p in catalog.products if p.product_id in judged]
    return ({"query": [q.text for q in queries], "doc": [catalog.product_text(p) for p in products]},
            {"query": [q.aspects for q in queries], "doc": [p.aspects for p in products]})
