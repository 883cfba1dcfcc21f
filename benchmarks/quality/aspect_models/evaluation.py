"""The product-search benchmark's evaluation (`benchmarks.quality.homedepot_hybrid`): the catalog (Home Depot,
written once under the output dir) and the evaluated queries over the corpus; each retriever's top lists on a split
(encoded in length order, exact top-k over the whole corpus, BM25 on word pieces) with the scores of the judged
products, cached as .npz under a fingerprint; their fusions (`madr.search.score_fusion`) with weights tuned on dev;
per-query metrics and aspect Accuracy@1."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from madr.config import ExperimentConfig, config_hash
from madr.data.schema import Catalog
from madr.metrics import aspect_accuracy_at_1, evaluate, query_means
from madr.modeling.batching import model_device
from madr.modeling.model import BiEncoder, objective_keys
from madr.recipes.aspects.experiment import load_catalog
from madr.search.score_fusion import (
    fuse_candidates,
    fusion_candidates,
    normalise,
    reciprocal_rank_fusion,
    weighted_fusion,
)
from madr.search.sparse.bm25 import BM25Index


def catalog_for(home: dict | None, cfg: ExperimentConfig) -> Catalog:
    """The Home Depot catalog (written once per `homedepot:` settings under the output dir), else `data:`."""
    if home is not None:
        from madr.data.sources import homedepot

        code = hashlib.sha256(Path(homedepot.__file__).read_bytes()).hexdigest()  # a changed annotator: rewrite
        where = Path(cfg.output_dir) / f"catalog-{config_hash({**home, 'code': code})}"
        if not (where / "judgments.parquet").is_file():
            t0 = time.perf_counter()
            args = {k: v for k, v in home.items() if k != "path"}
            if "fractions" in args:
                args["fractions"] = tuple(args["fractions"])
            homedepot.write_homedepot_catalog(Path(home["path"]), where, **args)
            print(f"wrote catalog {where} ({time.perf_counter() - t0:.0f} s)", flush=True)
        cfg.data.catalog_dir = str(where)
    return load_catalog(cfg)


@dataclass
class EvalSet:
    """The evaluated test queries (>= 1 relevant product), the whole corpus, and what the metrics need."""

    product_ids: list[str]
    doc_texts: list[str]
    doc_aspects: list[dict[str, list[str]]]
    query_ids: list[str]
    query_texts: list[str]
    query_aspects: list[dict[str, list[str]]]
    qrels: dict[str, dict[str, float]]
    judged: list[np.ndarray]  # per query: corpus rows of its judged products (qrels order)

    @classmethod
    def of(cls, catalog: Catalog, split: str, threshold: float, corpus_size: int | None = None,
           seed: int = 0) -> EvalSet:
        """`corpus_size` (None: all) keeps the queries' judged products and a seeded sample of the others."""
        qrels_all = catalog.qrels(split)
        queries = [q for q in catalog.queries_in(split)
                   if any(r >= threshold for r in qrels_all.get(q.query_id, {}).values())]
        if not queries:
            raise SystemExit(f"no {split} query has a product of relevance >= {threshold}")
        qrels = {q.query_id: {pid: float(r) for pid, r in qrels_all[q.query_id].items()} for q in queries}
        products = list(catalog.products)
        if corpus_size is not None and corpus_size < len(products):
            judged = {pid for docs in qrels.values() for pid in docs}
            others = [p for p in products if p.product_id not in judged]
            rng = np.random.default_rng(seed)
            keep = judged | {others[i].product_id for i in rng.choice(
                len(others), max(0, min(len(others), corpus_size - len(judged))), replace=False)}
            products = [p for p in products if p.product_id in keep]
        row = {p.product_id: i for i, p in enumerate(products)}
        return cls([p.product_id for p in products], [catalog.product_text(p) for p in products],
                   [p.aspects for p in products], [q.query_id for q in queries], [q.text for q in queries],
                   [q.aspects for q in queries], qrels,
                   [np.array([row[pid] for pid in qrels[q.query_id]], dtype=np.int64) for q in queries])


@dataclass
class Encoded:
    """Texts as a model encodes them, in input order."""

    vectors: torch.Tensor  # [N, d] search vectors, L2-normalised for cosine models
    preds: dict[str, np.ndarray]  # aspect -> [N] top-1 phrase value, for the aspects the model predicts


@torch.no_grad()
def encode(model: BiEncoder, texts: list[str], side: str, batch_size: int, desc: str) -> Encoded:
    """`texts` as `model` encodes them, in batches of similar word-piece length (little padding): search vectors
    and the top-1 phrase value of each predicted aspect."""
    model.eval()
    device = model_device(model)
    max_len = model.config.max_query_length if side == "query" else model.config.max_doc_length
    lengths = [len(x) for x in model.tokenizer(model.config.prefixed(texts, side), add_special_tokens=True,
                                               truncation=True, max_length=max_len)["input_ids"]]
    keys = {k: aspect for k, aspect, g in objective_keys(model.config) if g == "phrase"}
    order = np.argsort(lengths, kind="stable")
    emb = torch.empty(len(texts), model.embedding_dim)
    preds = {aspect: np.zeros(len(texts), dtype=np.int64) for aspect in keys.values()}
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, leave=False, mininterval=5):
        idx = order[start:start + batch_size]
        enc = model.tokenize([texts[i] for i in idx], side)
        out = model.encode(enc["input_ids"].to(device), enc["attention_mask"].to(device), side)
        e = out.embedding.float().cpu()
        emb[torch.from_numpy(idx)] = F.normalize(e, dim=-1) if model.config.similarity == "cosine" else e
        for k, aspect in keys.items():
            preds[aspect][idx] = out.aspect_logits[k].argmax(-1).cpu().numpy()
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


def aspect_accuracy(vocabularies, preds: dict[str, Sequence[int]], items: list[dict], side: str) -> dict:
    """Accuracy@1 (`madr.metrics.aspect_accuracy_at_1`) of the predicted phrase values ({aspect: value per item})
    over the items with an annotation in the vocabulary."""
    out = {}
    for aspect, pred in preds.items():
        gold = [set(vocabularies.get(aspect, "phrase").encode(a.get(aspect, []))) for a in items]
        if any(gold):
            out[f"{side}_acc@1_{aspect}"] = aspect_accuracy_at_1(np.asarray(pred).tolist(), gold)
    return out


def search_depth(cfg: ExperimentConfig) -> int:
    """Documents retrieved per query: `eval.top_k`, at least the largest cutoff of the retrieval metrics."""
    return max([cfg.eval.top_k, *[int(m.split("@")[1]) for m in cfg.eval.retrieval_metrics if "@" in m]])


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
            doc_preds = {a: p[rows] for a, p in docs.preds.items()}
            aspects[name] = {**aspect_accuracy(model.vocabularies, q.preds, ev.query_aspects, "query"),
                             **aspect_accuracy(model.vocabularies, doc_preds, ev.doc_aspects, "doc")}
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
