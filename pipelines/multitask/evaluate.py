"""Evaluate stage: held-out metrics of the untrained, trained and served encoders, and cross-lingual top-1
through the built index, in a Ray task; `metrics.json` beside the model.

* `encoder_metrics` (`madr.recipes.multitask.evaluation`, paper 004 Table III columns): click NDCG@k of the
  held-out queries' shown documents, NLI ROC AUC (entailment vs neutral, English / other languages, and
  3-way), cross-lingual top-1 among the held-out English candidates (exact cosine, in process);
* through the index: each held-out non-English sentence is encoded by the served query tower and searched in
  the FAISS shards of the encode stage (`madr.search.sharded.ShardedIndex`, top `index.top_k`); top-1 accuracy
  per source language and their mean (`index_xling_top1`, the quantity `xling_top1` measures, now served by
  the index: equal for a Flat index up to ties), and recall@k.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from madr.data.records import MultilingualData, ParallelRecord

METRICS_FILE = "metrics.json"


def index_top1(ids: np.ndarray, records: list[ParallelRecord], candidates: list[str]) -> dict[str, float]:
    """Top-1 accuracy per source language and its mean, and recall@k, from the index's ids [Q, k]."""
    position = {text: i for i, text in enumerate(candidates)}
    gold = np.array([position[r.target] for r in records])
    top1 = ids[:, 0] == gold
    langs = sorted({r.source_lang for r in records})
    per = {f"index_xling_top1_{lang}": float(top1[[r.source_lang == lang for r in records]].mean()) for lang in langs}
    recall = float((ids == gold[:, None]).any(axis=1).mean())
    return {"index_xling_top1": float(np.mean(list(per.values()))), **per, f"index_recall@{ids.shape[1]}": recall}


def _evaluate(recipe: dict[str, Any], models: dict[str, str], served: str, manifest: str, data: MultilingualData,
              top_k: int, threads: int) -> dict[str, Any]:
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
    queries, _ = encode_queries(model, [r.source for r in data.parallel_eval], cfg.eval.batch_size)
    _, ids = index.search(queries, SearchParams(k=min(top_k, index.ntotal)))
    return {"rows": rows, "index": {"manifest": manifest, "documents": int(index.ntotal),
                                    "shards": int(index.num_shards),
                                    **index_top1(ids, data.parallel_eval, candidates(data))}}


def run_evaluation(recipe: Any, models: dict[str, str], served: str, manifest: str, data: MultilingualData,
                   top_k: int, output_dir: Path, extra: dict[str, Any], cpus: float = 1.0,
                   threads: int = 1) -> dict[str, Any]:
    """Run the evaluation task (`cpus` reserved, `threads` torch threads) and write
    `metrics.json` (its result plus `extra`) under `output_dir`."""
    import ray

    task = ray.remote(num_cpus=cpus)(_evaluate)
    result = ray.get(task.remote(recipe.to_dict(), models, served, manifest, data, top_k, threads))
    result.update(extra)
    (output_dir / METRICS_FILE).write_text(json.dumps(result, indent=1, default=float))
    return result
