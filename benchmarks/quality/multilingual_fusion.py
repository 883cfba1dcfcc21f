"""BM25 + e5 fusion rows of the multilingual benchmarks (issue 27): what a search engineer would set up instead
of training, with one weight per task chosen on HELD-IN training items only.

Click pairs: each scorer's cosine / BM25 score is z-normalised over the scored set of pairs (the AUC compares
pairs of different queries, so a per-query normalisation would not do), fused `w * e5 + (1 - w) * bm25`.
Translation retrieval: per source, min-max over its candidate row (as `madr.search.score_fusion.normalise`
does for a ranked list), fused the same way; top-1 of the fused row. NLI gets no fused score (BM25 has none, as
in paper 004 Table III). The weight is the best of 0.0, 0.1, ..., 1.0 on a seeded sample of training clicks and
training translation pairs (never a held-out item).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.quality.multilingual_scores import Embedder
from madr.data.records import ClickRecord, MultilingualData, ParallelRecord
from madr.metrics import roc_auc
from madr.recipes.multitask.baselines import bm25_scorer
from madr.recipes.multitask.data import doc_text
from madr.search.score_fusion import normalise

GRID = tuple(round(0.1 * i, 1) for i in range(11))


def click_parts(e5: Embedder, bm25, records: Sequence[ClickRecord], order: Sequence[str]) -> np.ndarray:
    """[2, N]: z-normalised e5 cosine and BM25 score of each click pair."""
    queries, docs = [r.query for r in records], [doc_text(r, order) for r in records]
    cos = (e5(queries, "query") * e5(docs, "ad")).sum(-1).numpy()
    lexical = np.array([s[0] for s in bm25(queries, [[d] for d in docs])])
    return np.stack([normalise(cos, "zscore"), normalise(lexical, "zscore")])


def xling_parts(e5: Embedder, bm25, records: Sequence[ParallelRecord]) -> tuple[np.ndarray, np.ndarray]:
    """([2, N, C] per-source min-max e5 and BM25 rows over the candidates, [N] index of each right answer)."""
    candidates = list(dict.fromkeys(r.target for r in records))
    sources = [r.source for r in records]
    cos = (e5(sources, "source") @ e5(candidates, "target").T).numpy()
    lexical = np.stack(bm25(sources, [candidates] * len(sources)))
    position = {text: i for i, text in enumerate(candidates)}
    answer = np.array([position[r.target] for r in records])
    return np.stack([normalise(cos, "minmax"), normalise(lexical, "minmax")]), answer


def _fuse(parts: np.ndarray, w: float) -> np.ndarray:
    return w * parts[0] + (1.0 - w) * parts[1]


def click_auc(parts: np.ndarray, records: Sequence[ClickRecord], w: float) -> float:
    return roc_auc(_fuse(parts, w), np.array([bool(r.clicked) for r in records]))


def top1_hits(parts: np.ndarray, answer: np.ndarray, w: float) -> np.ndarray:
    return (_fuse(parts, w).argmax(axis=1) == answer).astype(np.float64)


def held_in_sample(data: MultilingualData, bench: dict, seed: int) -> tuple[list[ClickRecord], list[ParallelRecord]]:
    """A seeded sample of training clicks and of training translation pairs per language."""
    rng = random.Random(seed)
    clicks = list(data.clicks_train)
    clicks = rng.sample(clicks, min(len(clicks), int(bench["fusion_held_in_clicks"])))
    per_language: dict[str, list[ParallelRecord]] = {}
    for r in data.parallel_train:
        per_language.setdefault(r.source_lang, []).append(r)
    cap = int(bench["fusion_held_in_per_language"])
    pairs = [r for lang in sorted(per_language) for r in rng.sample(per_language[lang],
                                                                       min(cap, len(per_language[lang])))]
    return clicks, pairs


def fused_rows(e5: Embedder, tokenizer, data: MultilingualData, order: Sequence[str], bench: dict,
               seed: int) -> dict[str, Any]:
    """Weights tuned on held-in items, then the fused per-item scores of the held-out items
    (`benchmarks.quality.multilingual_scores.metrics` format: click scores and top-1 hits)."""
    bm25 = bm25_scorer(tokenizer)
    clicks, pairs = held_in_sample(data, bench, seed)
    tune_click = click_parts(e5, bm25, clicks, order)
    tune_xling, tune_answer = xling_parts(e5, bm25, pairs)
    click_curve = {w: click_auc(tune_click, clicks, w) for w in GRID}
    xling_curve = {w: float(top1_hits(tune_xling, tune_answer, w).mean()) for w in GRID}
    weights = {"click": max(click_curve, key=click_curve.get), "xling": max(xling_curve, key=xling_curve.get)}
    held_click = click_parts(e5, bm25, data.clicks_eval, order)
    held_xling, held_answer = xling_parts(e5, bm25, data.parallel_eval)
    scores = {"click": _fuse(held_click, weights["click"]),
              "xling": top1_hits(held_xling, held_answer, weights["xling"])}
    return {"scores": scores, "weights": weights,
            "held_in": {"clicks": len(clicks), "translation_pairs": len(pairs),
                        "click_auc_by_weight": click_curve, "xling_top1_by_weight": xling_curve}}
