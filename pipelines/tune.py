"""The tune stage: the index's dense + BM25 fusion chosen on the dev queries and written into its manifest.

`python -m pipelines.tune --config EXPERIMENT.yaml` reads the experiment's index (`<output_dir>/index`), encodes
the `tune.split` queries with the index's model once, takes every shard's dense and BM25 candidates once, and
scores every (lam, normalisation) of the grid on them with `madr.search.fusion_tuning.tune_fusion` (the fusion
the index serves). The best point is written into the manifest's `lexical` record (`fusion_lambda`,
`normalisation`), so the evaluate stage and `/search` use it when a request sets neither, with no hand edit.
The grid is reported in `<output_dir>/tune/fusion.json` and plotted (`fusion.png`: the metric against lam, one
curve per normalisation).

An index with aspect data (an aspect model's products' calibrated top-k values, `madr.index.aspects`) then gets the
aspect-match score's weight chosen the same way: the dev queries' aspect values are computed once, every
`tune.aspect_weights` point re-scores the chosen fusion's candidate pool (`tune_aspect_weight`; 0 is always on the
grid, so the stage can answer that the aspects do not help; a weight > 0 needs a paired per-query gain over 0 with
p below `tune.aspect_max_p`), and the chosen weight is written into the manifest's `aspects` record
(`record_aspect_weight`) and reported in `<output_dir>/tune/aspects.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from madr.config import ExperimentConfig
from madr.layout import RunLayout
from madr.search.fusion_tuning import (
    AspectChoice,
    FusionChoice,
    as_arrays,
    lambda_grid,
    tune_aspect_weight,
    tune_fusion,
)
from madr.search.params import SearchParams
from pipelines.runtime import experiment_main

BATCH = 256


def tune_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.output_dir) / "tune"


def candidate_lists(cfg: ExperimentConfig, texts: list[str], k: int, manifest_path: Path,
                    ) -> tuple[list, list, Any, Any]:
    """(dense candidates per shard, BM25 candidates per shard, the opened index, its model) of `texts` over the
    index of `manifest_path`, in batches."""
    from madr.index import Manifest, encode_queries
    from madr.modeling.model import BiEncoder
    from madr.search.sharded import ShardedIndex

    manifest = Manifest.load(manifest_path)
    if not manifest.has_lexical:
        raise ValueError(f"{manifest_path}: the index has no BM25 part (index.lexical: bm25): nothing to fuse")
    model = BiEncoder.load(manifest.model_dir).eval()
    index = ShardedIndex.open(manifest_path, mmap=True)
    params = SearchParams(k=k, candidates=cfg.tune.candidates)
    dense: list[list] = [[] for _ in index.shards]
    bm25: list[list] = [[] for _ in index.shards]
    for start in range(0, len(texts), BATCH):
        batch = texts[start:start + BATCH]
        vectors, _ = encode_queries(model, batch)
        terms = index.query_terms(model.tokenizer, batch)
        for s, shard in enumerate(index.shards):
            d, b = shard.candidates(vectors, terms, params)
            dense[s].append(d)
            bm25[s].append(b)
    return [_stack(parts) for parts in dense], [_stack(parts) for parts in bm25], index, model


def _stack(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def run_tune(cfg: ExperimentConfig, log=print, manifest_path: Path | None = None,
             report_dir: Path | None = None) -> FusionChoice:
    """Choose the fusion on the dev queries, write it into the manifest (module docstring); returns the choice.
    `manifest_path` / `report_dir`: another index than the experiment's (the baseline stage's) and where its
    report goes."""
    from madr.index.manifest import record_aspect_weight, record_fusion
    from pipelines.evaluate.job import to_run
    from pipelines.evaluate.searcher import DocKeys
    from pipelines.jobs.experiment import split_inputs

    manifest_path = manifest_path or RunLayout.of(cfg).manifest
    queries, qrels = split_inputs(cfg, cfg.tune.split)
    ids, texts = queries.column("query_id").to_pylist(), queries.column("text").to_pylist()
    k = cfg.eval.top_k
    log(f"[tune] {len(ids)} {cfg.tune.split} queries, {len(qrels)} judged; grid step {cfg.tune.lambda_step}, "
        f"normalisations {cfg.tune.normalisations}, by {cfg.tune.metric}")
    dense, bm25, index, model = candidate_lists(cfg, texts, k, manifest_path)
    keys = DocKeys(manifest_path, "product_id")

    def as_run(fused: tuple[np.ndarray, np.ndarray]) -> dict:
        scores, top = fused
        return to_run({q: (top[i], scores[i]) for i, q in enumerate(ids)}, keys)

    choice = tune_fusion(dense, bm25, as_run, qrels, cfg.tune.metric, lambda_grid(cfg.tune.lambda_step),
                         cfg.tune.normalisations, k, cfg.tune.candidates, metrics=cfg.eval.retrieval_metrics,
                         relevance_threshold=cfg.eval.relevance_threshold, gains=cfg.eval.gains)
    record_fusion(manifest_path, choice.lam, choice.normalisation)
    write_report(choice, report_dir or tune_dir(cfg), cfg.tune.normalisations)
    log(f"[tune] chose lam {choice.lam:g} ({choice.lam:g} dense + {1 - choice.lam:g} BM25), "
        f"{choice.normalisation}: dev {choice.metric} {choice.value:.4f} -> {manifest_path}")
    if index.aspects is not None:
        aspect = choose_aspect_weight(cfg, model, texts, dense, bm25, choice, index, as_run, qrels, k)
        record_aspect_weight(manifest_path, aspect.aspect_weight)
        out = report_dir or tune_dir(cfg)
        (out / "aspects.json").write_text(json.dumps(aspect.to_dict(), indent=1))
        p = "" if aspect.p_value is None else f"; best {aspect.best_weight:g}, p {aspect.p_value:.3g} vs 0"
        log(f"[tune] chose aspect_weight {aspect.aspect_weight:g}: dev {aspect.metric} {aspect.value:.4f} "
            f"(0: {aspect.grid[0.0][aspect.metric]:.4f}{p}; needs p < {aspect.max_p:g}) -> {manifest_path}")
    return choice


def choose_aspect_weight(cfg: ExperimentConfig, model: Any, texts: list[str], dense: list, bm25: list,
                         choice: FusionChoice, index: Any, as_run: Any, qrels: dict, k: int) -> AspectChoice:
    """The aspect-match weight of `tune.aspect_weights` best on the dev queries (`model`: the index's), over the
    chosen fusion's whole candidate pool (`madr.search.sharded.candidate_pool`), the queries' aspect values
    computed once."""
    from madr.modeling.aspect_distributions import encode_aspects
    from madr.search.sharded import candidate_pool, fuse_candidates

    queries = encode_aspects(model, texts, "query", int(index.manifest.aspects["k"]))
    params = SearchParams(k=k, candidates=cfg.tune.candidates, lam=choice.lam, normalisation=choice.normalisation)
    base = fuse_candidates(dense, bm25, choice.lam, params.replace(k=candidate_pool(params, fused=True)))
    return tune_aspect_weight(base, queries, index.aspects, as_run, qrels, cfg.tune.metric, cfg.tune.aspect_weights,
                              k, metrics=cfg.eval.retrieval_metrics, relevance_threshold=cfg.eval.relevance_threshold,
                              gains=cfg.eval.gains, max_p=cfg.tune.aspect_max_p)


def write_report(choice: FusionChoice, out: Path, normalisations: list[str]) -> Path:
    """`fusion.json` (the choice and the grid) and `fusion.png` (the metric against lam per normalisation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "fusion.json").write_text(json.dumps(choice.to_dict(), indent=1))
    fig, ax = plt.subplots(figsize=(6, 4))
    for norm in normalisations:
        lams, values = as_arrays(choice.grid, norm, choice.metric)
        ax.plot(lams, values, marker="o", label=norm)
    ax.axvline(choice.lam, color="grey", linestyle=":")
    ax.set_xlabel("lam (dense weight; 0 = BM25 only, 1 = dense only)")
    ax.set_ylabel(f"dev {choice.metric}")
    ax.set_title(f"fusion chosen: lam {choice.lam:g}, {choice.normalisation}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fusion.png", dpi=100)
    plt.close(fig)
    return out / "fusion.png"


def main(argv: list[str] | None = None) -> int:
    return experiment_main(argv, "python -m pipelines.tune", __doc__, run_tune)


if __name__ == "__main__":
    sys.exit(main())
