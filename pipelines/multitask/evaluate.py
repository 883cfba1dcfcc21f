"""Evaluate stage: held-out metrics of the untrained, trained and served encoders, and cross-lingual top-1
through the built index, in a Ray task; `metrics.json` beside the model.

* `encoder_metrics` (`madr.recipes.multitask.evaluation`, paper 004 Table III columns): click NDCG@k of the
  held-out queries' shown documents, NLI ROC AUC (entailment vs neutral, English / other languages, and
  3-way), cross-lingual top-1 among the held-out English candidates (exact cosine, in process);
* through the index: each held-out non-English sentence is encoded by the served query tower and searched in
  the FAISS shards of the encode stage (`madr.search.sharded.ShardedIndex`, top `index.top_k`); top-1 accuracy
  per source language and their mean (`index_xling_top1`, the quantity `xling_top1` measures, now served by
  the index: equal for a Flat index up to ties), and recall@k;
* the served query tower (`served_tower`, when the config's `serve:` asks Serve for another backend or precision
  than fp32 torch, e.g. the recipe's int8 onnxruntime tower): the tower `build_query_encoder` builds for the app,
  scored on the held-out click pairs (its query vectors against the fp32 document tower's) and through the index,
  each paired with the fp32 query tower on the same items: click AUC by a paired bootstrap over the pairs, NDCG and
  top-1 per query / sentence (`madr.significance`: `paired_auc_bootstrap`, `paired_tests`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from madr.data.records import ClickRecord, MultilingualData, ParallelRecord

METRICS_FILE = "metrics.json"


def gold_rows(records: list[ParallelRecord], candidates: list[str]) -> np.ndarray:
    """Each held-out sentence's target as its row among the index's candidates [Q]."""
    position = {text: i for i, text in enumerate(candidates)}
    return np.array([position[r.target] for r in records])


def index_top1(ids: np.ndarray, records: list[ParallelRecord], candidates: list[str]) -> dict[str, float]:
    """Top-1 accuracy per source language and its mean, and recall@k, from the index's ids [Q, k]."""
    gold = gold_rows(records, candidates)
    top1 = ids[:, 0] == gold
    langs = sorted({r.source_lang for r in records})
    per = {f"index_xling_top1_{lang}": float(top1[[r.source_lang == lang for r in records]].mean()) for lang in langs}
    recall = float((ids == gold[:, None]).any(axis=1).mean())
    return {"index_xling_top1": float(np.mean(list(per.values()))), **per, f"index_recall@{ids.shape[1]}": recall}


def _evaluate(recipe: dict[str, Any], models: dict[str, str], served: str, manifest: str, data: MultilingualData,
              top_k: int, threads: int, serve: dict[str, Any]) -> dict[str, Any]:
    import torch

    from madr.config import from_dict
    from madr.index.encode import encode_queries
    from madr.modeling.model import BiEncoder
    from madr.recipes.multitask.config import MultiTaskExperimentConfig
    from madr.recipes.multitask.evaluation import encoder_metrics
    from madr.search.params import SearchParams
    from madr.search.sharded import ShardedIndex
    from pipelines.multitask.encode import candidates

    torch.set_num_threads(threads)
    cfg = from_dict(MultiTaskExperimentConfig, recipe)
    rows = {name: encoder_metrics(BiEncoder.load(path).eval(), data, cfg) for name, path in models.items()}
    model = BiEncoder.load(served).eval()
    index = ShardedIndex.open(manifest)
    params = SearchParams(k=min(top_k, index.ntotal))
    queries, _ = encode_queries(model, [r.source for r in data.parallel_eval], cfg.eval.batch_size)
    _, ids = index.search(queries, params)
    out = {"rows": rows, "index": {"manifest": manifest, "documents": int(index.ntotal),
                                   "shards": int(index.num_shards),
                                   **index_top1(ids, data.parallel_eval, candidates(data))}}
    backend, precision = serve.get("encoder_backend", "torch"), serve.get("encoder_precision", "fp32")
    if (backend, precision) != ("torch", "fp32"):
        out["served_tower"] = served_tower(model, index, params, ids, data, cfg, backend, precision, threads)
    return out


def served_tower(model: Any, index: Any, params: Any, fp32_ids: np.ndarray, data: MultilingualData, cfg: Any,
                 backend: str, precision: str, threads: int) -> dict[str, Any]:
    """The Serve app's query tower (`backend`, `precision`) against the fp32 one: click metrics of the held-out
    pairs and top-1 through the index, each with its paired difference (see the module docstring)."""
    from madr.recipes.multitask.evaluation import click_doc_vectors, click_metrics, click_pair_scores
    from madr.search.query_encoder import build_query_encoder
    from madr.significance import paired_auc_bootstrap, paired_tests
    from pipelines.multitask.encode import candidates

    encoder = build_query_encoder(model, backend=backend, precision=precision, threads=threads)
    clicks, order, ks = data.clicks_eval, cfg.tasks.click.field_order, cfg.eval.ndcg_at
    docs = click_doc_vectors(model, clicks, order, cfg.eval.batch_size)  # one document side for both towers
    fp32 = click_pair_scores(model, clicks, order, cfg.eval.batch_size, doc_vectors=docs)
    vectors = encoder.encode([r.query for r in clicks], cfg.eval.batch_size)[0]
    tower = click_pair_scores(model, clicks, order, cfg.eval.batch_size, query_vectors=vectors, doc_vectors=docs)
    ids = index.search(encoder.encode([r.source for r in data.parallel_eval], cfg.eval.batch_size)[0], params)[1]
    target = candidates(data)
    gold = gold_rows(data.parallel_eval, target)
    hit = {name: dict(enumerate((found[:, 0] == gold).astype(float).tolist()))
           for name, found in (("tower", ids), ("fp32", fp32_ids))}
    per_query = {name: click_ndcg_per_query(s, clicks, ks) for name, s in (("tower", tower), ("fp32", fp32))}
    return {"encoder_backend": backend, "encoder_precision": precision,
            "click": click_metrics(tower, clicks, ks),
            "click_auc_minus_fp32": paired_auc_bootstrap(tower, fp32, np.array([r.relevance > 0 for r in clicks])),
            **{f"ndcg@{k}_minus_fp32": paired_tests(per_query["tower"][f"ndcg@{k}"], per_query["fp32"][f"ndcg@{k}"])
               for k in ks},
            "index": index_top1(ids, data.parallel_eval, target),
            "index_top1_minus_fp32": paired_tests(hit["tower"], hit["fp32"])}


def click_ndcg_per_query(scores: np.ndarray, records: list[ClickRecord], ks: list[int]) -> dict[str, dict[str, float]]:
    """{ndcg@k: {query id: value}} over the queries whose shown documents differ in relevance (`click_metrics`'
    NDCG, per query)."""
    from madr.recipes.multitask.evaluation import click_ndcg, ranked_click_rows

    ranked = ranked_click_rows(records)
    if not ranked:
        return {f"ndcg@{k}": {} for k in ks}
    return click_ndcg(scores[ranked], [records[i] for i in ranked], ks, per_query=True)


def run_evaluation(recipe: Any, models: dict[str, str], served: str, manifest: str, data: MultilingualData,
                   top_k: int, output_dir: Path, extra: dict[str, Any], cpus: float = 1.0,
                   threads: int = 1, serve: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the evaluation task (`cpus` reserved, `threads` torch threads) and write
    `metrics.json` (its result plus `extra`) under `output_dir`; `serve`: the config's `serve:` section (its
    `encoder_backend` / `encoder_precision` pick the served query tower scored beside the fp32 one)."""
    import ray

    task = ray.remote(num_cpus=cpus)(_evaluate)
    result = ray.get(task.remote(recipe.to_dict(), models, served, manifest, data, top_k, threads, serve or {}))
    result.update(extra)
    (output_dir / METRICS_FILE).write_text(json.dumps(result, indent=1, default=float))
    return result
