"""Each retriever's top lists on a split (and scores of the judged products), cached as .npz under a fingerprint,
fused (`madr.search.score_fusion`) and scored for `benchmarks.quality.homedepot_hybrid`."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from benchmarks.quality.aspect_models.data import EvalSet
from benchmarks.quality.aspect_models.evaluation import (
    Lists,
    aspect_accuracy,
    dense_lists,
    encode,
    top_run,
)
from madr.config import ExperimentConfig
from madr.metrics import evaluate, query_means
from madr.modeling.model import BiEncoder
from madr.search.score_fusion import (
    fuse_candidates,
    fusion_candidates,
    normalise,
    reciprocal_rank_fusion,
    weighted_fusion,
)


def model_lists(model: BiEncoder, splits: dict[str, EvalSet], k: int, bs: int, label: str,
                aspects: dict[str, dict[str, float]] | None = None) -> dict[str, Lists]:
    """Exact top-k lists of `model` per split, every split's products encoded once (their sorted union);
    `aspects` (when given) receives each split's Accuracy@1."""
    texts = sorted({t for ev in splits.values() for t in ev.doc_texts})
    row = {t: i for i, t in enumerate(texts)}
    docs = encode(model, texts, "doc", bs, f"{label}: corpus")
    out = {}
    for name, ev in splits.items():
        rows = np.array([row[t] for t in ev.doc_texts])
        q = encode(model, ev.query_texts, "query", bs, f"{label}: {name} queries")
        out[name] = dense_lists(q.vectors, docs.vectors[torch.from_numpy(rows)], ev, k)
        if aspects is not None and docs.preds:
            aspects[name] = {**aspect_accuracy(model, q.preds, ev.query_aspects, "query"),
                             **aspect_accuracy(model, {a: p[rows] for a, p in docs.preds.items()}, ev.doc_aspects,
                                               "doc")}
    return out


def fingerprint(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def corpus_key(splits: dict[str, EvalSet]) -> str:
    """What the lists depend on in the data: each split's queries and corpus."""
    return fingerprint({n: [ev.query_ids, ev.product_ids] for n, ev in splits.items()})


def cached_lists(path: Path, key: str, compute: Callable[[], dict[str, Lists]]) -> tuple[dict[str, Lists], float]:
    """(`compute()`, seconds) once per `key`, kept in `path` (.npz) and reused while the key matches (0 s)."""
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) == key:
                names = json.loads(str(z["splits"]))
                return {n: Lists(z[f"{n}_scores"], z[f"{n}_ids"], z[f"{n}_judged"]) for n in names}, 0.0
    t0 = time.perf_counter()
    lists = compute()
    arrays = {f"{n}_{f}": getattr(v, f) for n, v in lists.items() for f in ("scores", "ids", "judged")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, key=key, splits=json.dumps(list(lists)), **arrays)
    tmp.replace(path)
    return lists, time.perf_counter() - t0


def fuse(parts: Sequence[Lists], weights: Sequence[float], k: int, normalisation: str = "minmax") -> Lists:
    """Weighted sum of per-query normalised scores over the top lists' union, and over the judged products."""
    scores, ids = weighted_fusion([p.topk for p in parts], weights, k, normalisation=normalisation)
    judged = np.zeros(parts[0].judged.shape)
    for w, p in zip(weights, parts, strict=True):
        judged += w * np.nan_to_num(normalise(np.where(np.isnan(p.judged), -np.inf, p.judged), normalisation),
                                    neginf=0.0)
    return Lists(scores, ids, np.where(np.isnan(parts[0].judged), np.nan, judged))


def rrf(parts: Sequence[Lists], k: int, rrf_k: int = 60) -> Lists:
    """Reciprocal rank fusion of the top lists; on the judged products, of their ranks among the judged."""
    scores, ids = reciprocal_rank_fusion([p.topk for p in parts], k, rrf_k)
    judged = np.zeros(parts[0].judged.shape)
    for p in parts:
        key = np.where(np.isnan(p.judged), -np.inf, p.judged)
        ranks = np.argsort(np.argsort(-key, axis=1, kind="stable"), axis=1) + 1
        judged += 1.0 / (rrf_k + ranks)
    return Lists(scores, ids, np.where(np.isnan(parts[0].judged), np.nan, judged))


def weight_grid(n: int, step: float) -> list[tuple[float, ...]]:
    """Every weight vector of `n` non-negative multiples of `step` that sum to 1."""
    units = round(1 / step)

    def split(left: int, parts: int) -> list[tuple[int, ...]]:
        if parts == 1:
            return [(left,)]
        return [(i, *rest) for i in range(left + 1) for rest in split(left - i, parts - 1)]

    return [tuple(u / units for u in w) for w in split(units, n)]


def tune_weights(parts: Sequence[Lists], ev: EvalSet, cfg: ExperimentConfig, metric: str, step: float,
                 k: int, normalisations: Sequence[str] = ("minmax",)
                 ) -> tuple[tuple[str, tuple[float, ...]], dict[tuple[str, tuple[float, ...]], float]]:
    """The normalisation (of `normalisations`) and fusion weights (grid of `weight_grid`) with the best mean
    retrieval `metric` on `ev` (the dev split); ties go to the first in order (normalisations, then grid).
    Returns ((normalisation, weights), {(normalisation, weights): mean metric})."""
    seen = {}
    cutoff = metric.partition("@")[2]
    depth = min(k, int(cutoff)) if cutoff.isdigit() else k  # metric@n reads the top n only
    for norm in normalisations:
        candidates = fusion_candidates([p.topk for p in parts], norm)  # = weighted_fusion, once per normalisation
        for w in weight_grid(len(parts), step):
            run = top_run(*fuse_candidates(candidates, w, depth), ev)  # retrieval metrics only: no judged scores
            per_q = evaluate(run, ev.qrels, [metric], relevance_threshold=cfg.eval.relevance_threshold,
                             gains=cfg.eval.gains, per_query=True)
            seen[norm, w] = query_means(per_q)[metric]
    best = max(seen, key=lambda nw: seen[nw])
    return best, seen
