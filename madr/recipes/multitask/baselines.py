"""Training-free rows of the Table III comparison (`madr.recipes.multitask.experiment`): random scores, the
logged old-ranker order, token-level BM25 on the tokenizer's word pieces and minimum edit distance
(paper 004 Sec. VI-D); like the paper, they get no NLI AUC."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from madr.data.records import ClickRecord, MultilingualData
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.data import doc_text
from madr.recipes.multitask.evaluation import click_metrics, retrieval_top1
from madr.search.edit_distance import edit_distance_scores
from madr.search.sparse import BM25Index

PairScorer = Callable[[list[str], list[list[str]]], list[np.ndarray]]


def _group_clicks(records: Sequence[ClickRecord]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.query_id, []).append(i)
    return list(groups.values())


def bm25_scorer(tokenizer: PreTrainedTokenizerBase) -> PairScorer:
    """Token-level BM25 (paper 004 Sec. VI-D): word pieces of the model's tokenizer, idf over all candidates."""

    def score(queries: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
        corpus = list(dict.fromkeys(c for group in candidates for c in group))
        row = {text: i for i, text in enumerate(corpus)}
        index = BM25Index().fit([tokenizer.tokenize(t) for t in corpus])
        qs = index.encode_queries([tokenizer.tokenize(q) for q in queries])
        width = max(len(g) for g in candidates)
        ids = np.full((len(queries), width), -1, dtype=np.int64)
        for i, group in enumerate(candidates):
            ids[i, :len(group)] = [row[c] for c in group]
        scores = index.index.score(qs, ids)
        return [np.nan_to_num(scores[i, :len(g)], neginf=0.0).astype(np.float64) for i, g in enumerate(candidates)]

    return score


def _edit_distance_scorer(queries: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
    """Minimum edit distance (paper 004 Sec. VI-D): character-level similarity 1 - d / max length."""
    return [edit_distance_scores(q, group, level="char") for q, group in zip(queries, candidates, strict=True)]


def _random_scorer(seed: int) -> PairScorer:
    rng = np.random.default_rng(seed)
    return lambda queries, candidates: [rng.random(len(g)) for g in candidates]


def _baseline_row(scorer: PairScorer, data: MultilingualData, cfg: MultiTaskExperimentConfig) -> dict[str, float]:
    groups = _group_clicks(data.clicks_eval)
    order = cfg.tasks.click.field_order
    per_query = scorer([data.clicks_eval[g[0]].query for g in groups],
                       [[doc_text(data.clicks_eval[i], order) for i in g] for g in groups])
    scores = np.empty(len(data.clicks_eval))
    for g, s in zip(groups, per_query, strict=True):
        scores[g] = s
    out = click_metrics(scores, data.clicks_eval, cfg.eval.ndcg_at)
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    sources = [r.source for r in data.parallel_eval]
    out.update(retrieval_top1(np.stack(scorer(sources, [candidates] * len(sources))), data.parallel_eval, candidates))
    return out


def baseline_rows(data: MultilingualData, tokenizer: PreTrainedTokenizerBase,
                  cfg: MultiTaskExperimentConfig) -> dict[str, dict[str, float]]:
    """Training-free rows of Table III: random, the logged old ranker, token BM25, minimum edit distance."""
    rows = {"Random scores": _baseline_row(_random_scorer(cfg.seed), data, cfg)}
    position = np.array([-(r.position or 0) for r in data.clicks_eval], dtype=np.float64)
    rows["Old ranker (logged order)"] = click_metrics(position, data.clicks_eval, cfg.eval.ndcg_at)
    rows["Token BM25 (word pieces)"] = _baseline_row(bm25_scorer(tokenizer), data, cfg)
    rows["Minimum edit distance"] = _baseline_row(_edit_distance_scorer, data, cfg)
    return rows
