"""Scoring of the multi-aspect product-search rows: encode the corpus and the queries in length order, exact
top-k over the whole corpus and the judged-products re-ranking run, BM25 on word pieces, per-query metrics and
aspect Accuracy@1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from benchmarks.quality.aspect_models.data import EvalSet
from madr.config import ExperimentConfig
from madr.metrics import aspect_accuracy_at_1, evaluate
from madr.modeling.batching import model_device
from madr.modeling.model import BiEncoder, objective_keys
from madr.search.sparse.bm25 import BM25Index


@dataclass
class Encoded:
    """Texts as a model encodes them, in input order."""

    vectors: torch.Tensor  # [N, d] search vectors, L2-normalised for cosine models
    preds: dict[str, np.ndarray]  # aspect key -> [N] top-1 phrase value, for the aspects the model predicts


@torch.no_grad()
def encode(model: BiEncoder, texts: list[str], side: str, batch_size: int, desc: str) -> Encoded:
    """`texts` as `model` encodes them, in batches of similar word-piece length (little padding): search vectors
    and the top-1 phrase value of each predicted aspect."""
    model.eval()
    device = model_device(model)
    max_len = model.config.max_query_length if side == "query" else model.config.max_doc_length
    lengths = [len(x) for x in model.tokenizer(model.config.prefixed(texts, side), add_special_tokens=True,
                                               truncation=True, max_length=max_len)["input_ids"]]
    keys = [k for k, _, g in objective_keys(model.config) if g == "phrase"]
    order = np.argsort(lengths, kind="stable")
    emb = torch.empty(len(texts), model.embedding_dim)
    preds = {k: np.zeros(len(texts), dtype=np.int64) for k in keys}
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, leave=False, mininterval=5):
        idx = order[start:start + batch_size]
        enc = model.tokenize([texts[i] for i in idx], side)
        out = model.encode(enc["input_ids"].to(device), enc["attention_mask"].to(device), side)
        e = out.embedding.float().cpu()
        emb[torch.from_numpy(idx)] = F.normalize(e, dim=-1) if model.config.similarity == "cosine" else e
        for k in keys:
            preds[k][idx] = out.aspect_logits[k].argmax(-1).cpu().numpy()
    return Encoded(emb, preds)


@dataclass
class Lists:
    """One retriever's answers on one split (module docstring)."""

    scores: np.ndarray  # [Q, k] float32, -inf padded
    ids: np.ndarray  # [Q, k] int64 corpus rows of the split's EvalSet, -1 padded
    judged: np.ndarray  # [Q, J] float64 scores of the judged products, NaN padded

    @property
    def topk(self) -> tuple[np.ndarray, np.ndarray]:
        return self.scores, self.ids


def judged_matrix(ev: EvalSet) -> np.ndarray:
    """[Q, J] corpus rows of each query's judged products, -1 padded."""
    out = np.full((len(ev.judged), max(len(j) for j in ev.judged)), -1, dtype=np.int64)
    for i, j in enumerate(ev.judged):
        out[i, :len(j)] = j
    return out


def dense_lists(q: torch.Tensor, d: torch.Tensor, ev: EvalSet, k: int, chunk: int = 256) -> Lists:
    """Exact inner-product top-k of query vectors `q` over the split's corpus vectors `d`, and the judged."""
    scores, ids = [], []
    jm = judged_matrix(ev)
    judged = np.full(jm.shape, np.nan)
    for s in range(0, len(q), chunk):
        sim = q[s:s + chunk] @ d.T
        top_s, top_i = torch.topk(sim, min(k, sim.shape[1]), dim=1)
        scores.append(top_s.numpy())
        ids.append(top_i.numpy())
        rows = torch.from_numpy(np.maximum(jm[s:s + chunk], 0))
        got = torch.gather(sim, 1, rows).double().numpy()
        judged[s:s + chunk] = np.where(jm[s:s + chunk] >= 0, got, np.nan)
    return Lists(np.concatenate(scores).astype(np.float32), np.concatenate(ids).astype(np.int64), judged)


def served_pieces(tokenizer) -> Callable[[str], list[str]]:
    """`tokenizer`'s word pieces of the lower-cased text, as an index with `index.lexical: bm25` holds them."""
    return lambda text: tokenizer.tokenize(text.lower())


def bm25_lists(tokenize: Callable[[str], list[str]], ev: EvalSet, k: int) -> Lists:
    """BM25 (`madr.search.sparse.BM25Index`, Anserini k1 / b) over the word pieces of the split's corpus."""
    index = BM25Index().fit([tokenize(t) for t in ev.doc_texts])
    qs = [tokenize(t) for t in ev.query_texts]
    scores, ids = index.search(qs, k=k)
    jm = judged_matrix(ev)
    js = np.nan_to_num(index.index.score(index.encode_queries(qs), jm), neginf=0.0)
    return Lists(np.asarray(scores, np.float32), np.asarray(ids, np.int64), np.where(jm >= 0, js, np.nan))


def top_run(scores: np.ndarray, ids: np.ndarray, ev: EvalSet) -> dict[str, dict[str, float]]:
    """Top lists ([Q, k] scores and corpus rows, -1 padded) as {query id: {product id: score}}."""
    return {qid: {ev.product_ids[i]: float(s) for s, i in zip(srow, irow, strict=True) if i >= 0}
            for qid, srow, irow in zip(ev.query_ids, scores, ids, strict=True)}


def metrics_of(lists: Lists, ev: EvalSet, cfg: ExperimentConfig) -> dict[str, dict[str, float]]:
    """{metric: {query id: value}}: retrieval metrics over the top list, re-ranking ones over the judged."""
    e = cfg.eval
    rerank = {qid: {ev.product_ids[i]: float(s) for i, s in zip(j, lists.judged[qi, :len(j)], strict=True)}
              for qi, (qid, j) in enumerate(zip(ev.query_ids, ev.judged, strict=True))}
    out = evaluate(top_run(lists.scores, lists.ids, ev), ev.qrels, e.retrieval_metrics,
                   relevance_threshold=e.relevance_threshold, gains=e.gains, per_query=True)
    out.update(evaluate(rerank, ev.qrels, e.rerank_metrics, relevance_threshold=e.relevance_threshold,
                        gains=e.gains, per_query=True))
    return out


def aspect_accuracy(model: BiEncoder, preds: dict[str, np.ndarray], aspects: list[dict], side: str) -> dict:
    """Accuracy@1 (`madr.metrics.aspect_accuracy_at_1`) of the top phrase value per aspect over the items with an
    annotation in the vocabulary."""
    out = {}
    for key, aspect, _ in [x for x in objective_keys(model.config) if x[2] == "phrase"]:
        voc = model.vocabularies.get(aspect, "phrase")
        gold = [set(voc.encode(a.get(aspect, []))) for a in aspects]
        if any(gold):
            out[f"{side}_acc@1_{aspect}"] = aspect_accuracy_at_1(preds[key].tolist(), gold)
    return out


def majority_accuracy(vocabularies, aspects: list[str], train: list[dict], items: list[dict], side: str) -> dict:
    """The chance row of aspect Accuracy@1: the phrase value most frequent in `train`, scored on `items`."""
    out = {}
    for aspect in aspects:
        voc = vocabularies.get(aspect, "phrase")
        most = int(np.bincount([i for a in train for i in voc.encode(a.get(aspect, []))], minlength=1).argmax())
        gold = [set(voc.encode(a.get(aspect, []))) for a in items]
        if any(gold):
            out[f"{side}_acc@1_{aspect}"] = aspect_accuracy_at_1([most] * len(gold), gold)
    return out


def search_depth(cfg: ExperimentConfig) -> int:
    """Documents retrieved per query: `eval.top_k`, at least the largest cutoff of the retrieval metrics."""
    return max([cfg.eval.top_k, *[int(m.split("@")[1]) for m in cfg.eval.retrieval_metrics if "@" in m]])
