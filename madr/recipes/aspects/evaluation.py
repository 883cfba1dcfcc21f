"""Offline evaluation of a bi-encoder on a catalog split (paper 000 Sec. 8.3, paper 001 Sec. 5.2).

- retrieval: every query searches the whole product corpus (exact top-k here; the sharded FAISS
  searcher gives the same ranking for Flat indexes) -> Recall@k, MRR@k, ...
- re-ranking: each query's judged products are scored and ranked -> NDCG@k with gain 2^rel - 1, AUC.
- aspects: Accuracy@1 of the top predicted value per aspect against the annotations (Table 5).
"""

from __future__ import annotations

import torch

from madr.config import EvalConfig
from madr.data.schema import Catalog
from madr.metrics import aspect_accuracy_at_1, evaluate
from madr.modeling.model import BiEncoder, objective_keys


def search(model: BiEncoder, query_emb: torch.Tensor, doc_emb: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k (scores, indices) by the model's similarity."""
    scores = model.similarity(query_emb, doc_emb)
    return torch.topk(scores, min(k, doc_emb.shape[0]), dim=1)


@torch.no_grad()
def ranked_run(model: BiEncoder, catalog: Catalog, split: str, top_k: int
               ) -> tuple[dict[str, dict[str, float]], torch.Tensor, torch.Tensor]:
    """(the top `top_k` products of every `split` query by exact search over the whole catalog {query id:
    {product id: score}}, the query vectors, the product vectors in catalog order)."""
    queries = list(catalog.queries_in(split))
    if not queries:
        raise ValueError(f"catalog has no queries in split {split!r}")
    products = list(catalog.products)
    doc_emb = model.encode_texts([catalog.product_text(p) for p in products], "doc")
    q_emb = model.encode_texts([q.text for q in queries], "query")
    top_scores, top_idx = search(model, q_emb, doc_emb, top_k)
    run = {q.query_id: {products[int(i)].product_id: float(s) for s, i in zip(srow, irow, strict=True)}
           for q, srow, irow in zip(queries, top_scores, top_idx, strict=True)}
    return run, q_emb, doc_emb


@torch.no_grad()
def evaluate_model(model: BiEncoder, catalog: Catalog, cfg: EvalConfig) -> dict[str, float]:
    run, q_emb, doc_emb = ranked_run(model, catalog, cfg.split, cfg.top_k)
    queries, products = list(catalog.queries_in(cfg.split)), list(catalog.products)
    qrels = catalog.qrels(cfg.split)
    results = evaluate(run, qrels, cfg.retrieval_metrics, relevance_threshold=cfg.relevance_threshold,
                       gains=cfg.gains)
    pid_index = {p.product_id: i for i, p in enumerate(products)}
    full = model.similarity(q_emb, doc_emb)
    rerank = {q.query_id: {pid: float(full[qi, pid_index[pid]]) for pid in qrels.get(q.query_id, {})}
              for qi, q in enumerate(queries)}
    rr = evaluate(rerank, qrels, cfg.rerank_metrics, relevance_threshold=cfg.relevance_threshold, gains=cfg.gains)
    results.update({f"rerank_{k}": v for k, v in rr.items()})
    results.update(aspect_accuracy(model, catalog, [q.text for q in queries], [q.aspects for q in queries], "query"))
    results.update(aspect_accuracy(model, catalog, [catalog.product_text(p) for p in products],
                                   [p.aspects for p in products], "doc"))
    return results


@torch.no_grad()
def phrase_logits(model: BiEncoder, texts: list[str], side: str, batch_size: int = 128) -> dict[str, torch.Tensor]:
    """{objective key: [N, V] logits} of the phrase-granularity value predictions of `texts` (Eq. 3's scores)."""
    keys = [k for k, _, g in objective_keys(model.config) if g == "phrase"]
    was_training = model.training
    model.eval()
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for i in range(0, len(texts), batch_size):
        enc = model.tokenize(texts[i:i + batch_size], side)
        out = model.encode(enc["input_ids"], enc["attention_mask"], side)
        for k in keys:
            parts[k].append(out.aspect_logits[k].float().cpu())
    model.train(was_training)
    return {k: torch.cat(v) if v else torch.empty(0, 0) for k, v in parts.items()}


def aspect_accuracy(model: BiEncoder, catalog: Catalog, texts: list[str], annotations: list[dict[str, list[str]]],
                    side: str, batch_size: int = 128) -> dict[str, float]:
    """Accuracy@1 per aspect at phrase granularity (only for models that learn aspects)."""
    aspect_of = {k: a for k, a, g in objective_keys(model.config) if g == "phrase"}
    if not aspect_of:
        return {}
    results = {}
    for k, logits in phrase_logits(model, texts, side, batch_size).items():
        voc = model.vocabularies.get(aspect_of[k], "phrase")
        gold = [set(voc.encode(ann.get(aspect_of[k], []))) for ann in annotations]
        if any(gold):
            results[f"{side}_acc@1_{aspect_of[k]}"] = aspect_accuracy_at_1(logits.argmax(-1).tolist(), gold)
    return results
