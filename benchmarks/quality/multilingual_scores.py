"""Scores and metrics of the multilingual multi-task benchmark (`benchmarks.quality.multilingual`) on the
held-out items: per item the click pair cosine, the NLI pair cosine and the cross-lingual top-1 hit of any
embedder (BM25 and random scores for the references); the table's columns from them; and the paired bootstrap
of two rows over the resampled items."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from benchmarks.common.stats import paired_bootstrap as bootstrap
from madr.data.records import ClickRecord, MultilingualData
from madr.metrics import roc_auc
from madr.recipes.multitask.baselines import bm25_scorer
from madr.recipes.multitask.data import doc_text
from madr.recipes.multitask.evaluation import click_ndcg

Embedder = Callable[[list[str], str], torch.Tensor]  # (texts, role) -> L2-normalised [N, d]


def _cos(emb: Embedder, a: list[str], a_role: str, b: list[str], b_role: str) -> np.ndarray:
    return (emb(a, a_role) * emb(b, b_role)).sum(-1).numpy()


def item_scores(emb: Embedder, data: MultilingualData, order: Sequence[str],
                click: Callable[[Sequence[ClickRecord]], np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per held-out item: click pair cosine, NLI pair cosine, cross-lingual top-1 hit (0/1).

    `click` scores the click pairs itself (a madr model: concatenated fields or field attention, Eq. 8-9);
    default: the cosine of `emb` on the query and the concatenated fields."""
    clicks, nli = data.clicks_eval, data.nli_eval
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    src, cand = emb([r.source for r in data.parallel_eval], "source"), emb(candidates, "target")
    best = (src @ cand.T).argmax(dim=1).numpy()
    click_scores = click(clicks) if click is not None else _cos(emb, [r.query for r in clicks], "query",
                                                                [doc_text(r, order) for r in clicks], "ad")
    return {"click": click_scores,
            "nli": _cos(emb, [r.hypothesis for r in nli], "hypothesis", [r.premise for r in nli], "premise"),
            "xling": np.array([candidates[b] == r.target for b, r in zip(best, data.parallel_eval, strict=True)],
                              dtype=np.float64)}


def bm25_scores(tokenizer, data: MultilingualData, order: Sequence[str]) -> dict[str, np.ndarray]:
    """Token BM25 on word pieces (paper 004 Sec. VI-D): click pairs (idf over the dev ads) and X -> English."""
    score = bm25_scorer(tokenizer)
    clicks = data.clicks_eval
    click = np.array([s[0] for s in score([r.query for r in clicks], [[doc_text(r, order)] for r in clicks])])
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    rows = score([r.source for r in data.parallel_eval], [candidates] * len(data.parallel_eval))
    hits = np.array([candidates[int(np.argmax(s))] == r.target for s, r in zip(rows, data.parallel_eval, strict=True)])
    return {"click": click, "xling": hits.astype(np.float64)}


def random_scores(data: MultilingualData, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_cand = len({r.target for r in data.parallel_eval})
    return {"click": rng.random(len(data.clicks_eval)),
            "xling": (rng.integers(0, n_cand, len(data.parallel_eval)) == 0).astype(np.float64)}


def metrics(scores: dict[str, np.ndarray], data: MultilingualData, ks: Sequence[int]) -> dict[str, float]:
    """Table columns from per-item scores (see the module docstring); only the parts a row has."""
    out: dict[str, float] = {}
    if "click" in scores:
        rel = np.array([bool(r.relevance) for r in data.clicks_eval])
        out["click_auc"] = roc_auc(scores["click"], rel)
        both = _both_label_rows(data)
        out.update(click_ndcg(scores["click"][both], [data.clicks_eval[i] for i in both], ks))
    if "nli" in scores:
        out.update(nli_metrics(scores["nli"], data))
    if "xling" in scores:
        langs = np.array([r.source_lang for r in data.parallel_eval])
        per = {f"xling_top1_{lang}": float(scores["xling"][langs == lang].mean()) for lang in sorted(set(langs))}
        out.update({"xling_top1": float(np.mean(list(per.values()))), **per})
    return out


def _both_label_rows(data: MultilingualData) -> list[int]:
    labels: dict[str, set[int]] = {}
    for r in data.clicks_eval:
        labels.setdefault(r.query_id, set()).add(int(r.relevance or 0))
    return [i for i, r in enumerate(data.clicks_eval) if len(labels[r.query_id]) == 2]


def nli_metrics(scores: np.ndarray, data: MultilingualData) -> dict[str, float]:
    labels = np.array([r.label for r in data.nli_eval])
    lang = np.array([r.language for r in data.nli_eval])
    ent, neu = labels == "entailment", labels == "neutral"
    out = {"nli_auc_all3": roc_auc(scores, ent)}
    for key, rows in (("en", lang == "en"), ("xx", lang != "en")):
        keep = rows & (ent | neu)
        out[f"nli_auc_{key}"] = roc_auc(scores[keep], ent[keep])
        out[f"nli_auc_{key}_3way"] = roc_auc(scores[rows], ent[rows])
    return out


def paired_bootstrap(a: dict[str, np.ndarray], b: dict[str, np.ndarray], data: MultilingualData,
                     draws: int, seed: int) -> dict[str, dict[str, float]]:
    """a - b on each headline metric; 95% interval and two-sided p from resampling held-out items (paired)."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, part in (("click_auc", "click"), ("nli_auc_en", "nli"), ("nli_auc_xx", "nli"),
                      ("nli_auc_all3", "nli"), ("xling_top1", "xling")):
        n = len(a[part])
        diff = metrics({part: a[part]}, data, [5])[key] - metrics({part: b[part]}, data, [5])[key]

        def resampled(idx: np.ndarray, key: str = key, part: str = part) -> float:
            return _metric_on(key, part, a[part], idx, data) - _metric_on(key, part, b[part], idx, data)

        out[key] = {"diff": float(diff), **bootstrap(resampled, n, draws, rng), "n": n}
    return out


def _metric_on(key: str, part: str, scores: np.ndarray, idx: np.ndarray, data: MultilingualData) -> float:
    """`key` on the resampled items `idx` (top-1: mean hit; AUCs on the resampled pairs)."""
    if part == "xling":
        return float(scores[idx].mean())
    records = data.clicks_eval if part == "click" else data.nli_eval
    s = scores[idx]
    if part == "click":
        return roc_auc(s, np.array([bool(records[i].relevance) for i in idx]))
    labels = np.array([records[i].label for i in idx])
    lang = np.array([records[i].language for i in idx])
    ent = labels == "entailment"
    if key == "nli_auc_all3":
        return roc_auc(s, ent)
    rows = (lang == "en") if key == "nli_auc_en" else (lang != "en")
    keep = rows & (ent | (labels == "neutral"))
    return roc_auc(s[keep], ent[keep])
