"""Held-out evaluation of an encoder (step 5 of `madr.recipes.multitask.experiment`): click ROC AUC of the
query-document cosine and NDCG of the shown documents re-ranked by the model, NLI ROC AUC of the cosine,
cross-lingual top-1 retrieval."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from madr.data.records import ClickRecord, MultilingualData, NLIRecord, ParallelRecord
from madr.metrics import evaluate, roc_auc
from madr.modeling.model import BiEncoder
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.data import doc_text


def _embed(model: BiEncoder, texts: Sequence[str], side: str, batch_size: int) -> torch.Tensor:
    """L2-normalised embeddings (cosine is the score of every evaluation here)."""
    return F.normalize(model.encode_texts(list(texts), side, batch_size), dim=-1)


def click_ndcg(scores: np.ndarray, records: Sequence[ClickRecord], ks: Sequence[int], per_query: bool = False
               ) -> dict[str, float] | dict[str, dict[str, float]]:
    """NDCG@k (exp2 gains) of every held-out query's shown documents ranked by `scores` (one per record);
    `per_query`: {ndcg@k: {query id: value}} instead of the means."""
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, float]] = {}
    for i, (r, s) in enumerate(zip(records, scores, strict=True)):
        if r.relevance is None:
            raise ValueError(f"click record {i} (query {r.query_id!r}, doc {r.doc_id!r}) has no relevance to judge")
        run.setdefault(r.query_id, {})[r.doc_id] = float(s)
        qrels.setdefault(r.query_id, {})[r.doc_id] = float(r.relevance)
    values = evaluate(run, qrels, [f"ndcg@{k}" for k in ks], per_query=per_query).values()
    return {f"ndcg@{k}": v for k, v in zip(ks, values, strict=True)}


def ranked_click_rows(records: Sequence[ClickRecord]) -> list[int]:
    """The records of the queries whose shown documents differ in relevance: the only ones a ranking can change."""
    grades: dict[str, set[int]] = {}
    for r in records:
        grades.setdefault(r.query_id, set()).add(int(r.relevance))
    return [i for i, r in enumerate(records) if len(grades[r.query_id]) > 1]


def click_metrics(scores: np.ndarray, records: Sequence[ClickRecord], ks: Sequence[int]) -> dict[str, float]:
    """`click_auc`: ROC AUC of the pair scores, relevant (relevance > 0) against not, over every held-out pair
    (the click columns of paper 004 Table III on XGLUE QADSM / QAM, whose queries mostly show one document);
    `ndcg@k` over the queries whose shown documents differ in relevance, the only ones a ranking can change
    (`click_queries_ranked` counts them)."""
    relevance = [r.relevance for r in records]
    if None in relevance:
        i = relevance.index(None)
        raise ValueError(f"click record {i} (query {records[i].query_id!r}, doc {records[i].doc_id!r}) has no "
                         "relevance to judge")
    ranked = ranked_click_rows(records)
    out = {"click_auc": roc_auc(scores, np.array(relevance) > 0),
           "click_queries_ranked": float(len({records[i].query_id for i in ranked}))}
    if ranked:
        out.update(click_ndcg(np.asarray(scores)[ranked], [records[i] for i in ranked], ks))
    return out


def nli_auc(scores: np.ndarray, records: Sequence[NLIRecord]) -> dict[str, float]:
    """ROC AUC of entailment vs neutral for English and the other languages, and vs everything else."""
    labels = np.array([r.label for r in records])
    english = np.array([r.language == "en" for r in records])
    ent, neu = labels == "entailment", labels == "neutral"
    out = {}
    for name, rows in (("nli_auc_en", english), ("nli_auc_xx", ~english)):
        keep = rows & (ent | neu)
        out[name] = roc_auc(scores[keep], ent[keep]) if keep.any() else math.nan
    out["nli_auc_all3"] = roc_auc(scores, ent)
    return out


def retrieval_top1(scores: np.ndarray, records: Sequence[ParallelRecord], candidates: Sequence[str]) -> dict[str, float]:
    """Top-1 accuracy per source language and its mean: `scores [N, C]` of sources against `candidates`."""
    best = scores.argmax(axis=1)
    hit = np.array([candidates[b] == r.target for b, r in zip(best, records, strict=True)])
    langs = sorted({r.source_lang for r in records})
    per = {f"xling_top1_{lang}": float(hit[[r.source_lang == lang for r in records]].mean()) for lang in langs}
    return {"xling_top1": float(np.mean(list(per.values()))), **per}


def click_doc_vectors(model: BiEncoder, records: Sequence[ClickRecord], order: Sequence[str],
                      batch_size: int) -> torch.Tensor:
    """L2-normalised document vectors of the click records [N, d]: each record's `order` fields concatenated, or,
    for a model with field attention, those fields attended by the record's query (paper 004 Sec. IV, Eq. 8-9)."""
    if model.field_attention is None:
        return _embed(model, [doc_text(r, order) for r in records], "doc", batch_size)
    fields = [[r.fields.get(name) or "" for name in order] for r in records]
    return F.normalize(model.encode_field_documents([r.query for r in records], fields, batch_size).embedding, dim=-1)


def click_pair_scores(model: BiEncoder, records: Sequence[ClickRecord], order: Sequence[str],
                      batch_size: int, query_vectors: np.ndarray | None = None,
                      doc_vectors: torch.Tensor | None = None) -> np.ndarray:
    """Cosine of each click record's query and document [N] (the document as `click_doc_vectors` encodes it);
    `query_vectors` [N, d]: the queries as another tower encoded them (a served one), else the model's;
    `doc_vectors`: `click_doc_vectors`' output when already computed."""
    q = (_embed(model, [r.query for r in records], "query", batch_size) if query_vectors is None
         else F.normalize(torch.from_numpy(np.asarray(query_vectors, np.float32)), dim=-1))
    d = click_doc_vectors(model, records, order, batch_size) if doc_vectors is None else doc_vectors
    return (q * d).sum(-1).numpy()


def encoder_metrics(model: BiEncoder, data: MultilingualData, cfg: MultiTaskExperimentConfig) -> dict[str, float]:
    """Every held-out metric of an encoder (see the module docstring for which side each text takes)."""
    bs, order = cfg.eval.batch_size, cfg.tasks.click.field_order
    clicks = data.clicks_eval
    out = click_metrics(click_pair_scores(model, clicks, order, bs), clicks, cfg.eval.ndcg_at)
    h = _embed(model, [r.hypothesis for r in data.nli_eval], "query", bs)
    p = _embed(model, [r.premise for r in data.nli_eval], "doc", bs)
    out.update(nli_auc((h * p).sum(-1).numpy(), data.nli_eval))
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    s = _embed(model, [r.source for r in data.parallel_eval], "query", bs)
    t = _embed(model, candidates, "doc", bs)
    out.update(retrieval_top1((s @ t.T).numpy(), data.parallel_eval, candidates))
    return out
