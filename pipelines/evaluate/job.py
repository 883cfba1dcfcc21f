"""The evaluation job: queries + qrels -> search every model's sharded index -> metrics table + plot.

For each run (``SearchSpec``: an index manifest and its model) the queries are searched on a Ray actor
pool (``pipelines.evaluate.searcher``), or in this process with every CPU of a one-node cluster
(``executor: auto``, ``search_threads``), index ids are mapped to the qrels' doc keys, and every metric of
``madr.metrics.evaluate`` is computed (Recall@k, NDCG@k, MRR@k, MAP, P@k, Hit@k, R-Prec, AUC, with the
conventions of that module). Results go to ``results.csv`` and ``results.md`` (one row per run), and each
run's ranking to a TREC run file ``<run name>.trec`` (``qid Q0 docid rank score tag``, tag = the run name)
beside ``qrels.trec``, the judgments it was scored against: ``trec_eval qrels.trec NAME.trec``, ranx or
pyserini reproduce the table from them (doc ids are the qrels' doc keys). With several runs, the first (the
model) is compared with each other (its references) per query, every metric: both means, the difference and the
paired tests of `madr.significance` (``comparisons.csv`` / ``.md``), so a difference comes with its p.

Inputs: ``queries`` + ``qrels`` files (Parquet / JSONL tables; qrels may also be a BEIR TSV or TREC file), or
``beir`` (a BEIR directory, local or a pyarrow filesystem URI) and its ``split``, whose judged queries are
searched (``qrels`` then replaces ``qrels/<split>.tsv``). BEIR / TREC lines that fail validation are counted
and written to ``<output>/quarantine`` (``madr.data.quarantine`` layout), never dropped silently.

The recall-vs-latency sweep runs in the driver process, one search setting at a time over all queries
(queries encoded once, so the time is search only): ``nprobe`` for IVF indexes, ``efSearch`` for HNSW;
each point is (ms per query, Recall@k). It is written to ``sweep.csv`` and plotted to
``recall_latency.png`` (matplotlib, Agg backend).
"""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from madr.data.trec import write_qrels, write_run
from madr.evaluate_config import EvaluateConfig
from madr.metrics import Qrels, Run, evaluate, query_means
from madr.significance import paired_tests
from pipelines.evaluate.io import (
    is_text_qrels,
    read_beir_split,
    read_qrels,
    read_queries,
    read_text_qrels_for,
)
from pipelines.evaluate.searcher import (
    DocKeys,
    SearchSpec,
    collect,
    encoder_key,
    opened,
    query_encoder,
    query_vectors,
    resolve_model_dir,
    search_dataset,
    search_local,
    search_params,
)


def to_run(results: dict[str, tuple[np.ndarray, np.ndarray]], keys: DocKeys) -> Run:
    """Search results (ids, scores per query) -> a ``madr.metrics`` run over doc keys (padding dropped)."""
    run: Run = {}
    for qid, (ids, scores) in results.items():
        live = ids >= 0
        run[qid] = dict(zip(keys.keys(ids[live]), scores[live].astype(float).tolist(), strict=True))
    return run


def _metrics(run: Run, qrels: Qrels, cfg: EvaluateConfig, names: list[str]) -> dict[str, float]:
    return evaluate(run, qrels, names, relevance_threshold=cfg.relevance_threshold, gains=cfg.gains)


def compare_to_first(per_query: dict[str, dict[str, dict[str, float]]], draws: int = 10000) -> list[dict[str, Any]]:
    """{run: {metric: {query: value}}} (runs in order) -> one row per other run and metric: the first run against
    it over the same queries, with the paired tests of `madr.significance`."""
    names = list(per_query)
    rows = []
    for other in names[1:]:
        for metric, first in per_query[names[0]].items():
            both = first.keys() & per_query[other][metric].keys()  # AUC: the queries with both classes
            ours = {q: first[q] for q in both}
            theirs = {q: per_query[other][metric][q] for q in both}
            test = paired_tests(ours, theirs, draws)
            rows.append({"run": names[0], "reference": other, "metric": metric,
                         "run_mean": float(np.mean(list(ours.values()))) if both else float("nan"),
                         "reference_mean": float(np.mean(list(theirs.values()))) if both else float("nan"),
                         **test})
    return rows


def _sweep_param(index: Any) -> tuple[str | None, list[int]]:
    from madr.index.build import hnsw_of, ivf_of

    shard = index.shards[0].index
    ivf = ivf_of(shard)
    if ivf is not None:
        return "nprobe", [v for v in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if v <= ivf.nlist]
    if hnsw_of(shard) is not None:
        return "ef_search", [16, 32, 64, 128, 256, 512]
    return None, [0]


def sweep_key(spec: SearchSpec) -> tuple:
    """What a run's ``sweep`` depends on: its index, its model and its search settings, less what the sweep leaves
    out (it times the index's own search without BM25 or aspect-match fusion: the aspect-match weight, and lam unless
    the index is a hybrid one with sparse shards). Runs that differ only there share one sweep."""
    from madr.index import Manifest

    search = spec.search.replace(aspect_weight=0.0, **({} if Manifest.load(spec.index).has_sparse else {"lam": None}))
    return spec.index, spec.model_dir, spec.encoder_backend, spec.encoder_precision, search


def sweep(spec: SearchSpec, queries: Any, qrels: Qrels, keys: DocKeys, cfg: EvaluateConfig,
          threads: int = 1) -> list[dict[str, Any]]:
    """(setting, ms/query, metric) points of one run's dense search, timed in this process (search only: the
    index's own knob, `nprobe` or `ef_search`; no BM25 or aspect-match fusion); the queries are encoded as the run
    encoded them, in its batches and with the `threads` torch threads its search had (`query_vectors`: the run's
    own vectors when it searched in this process), so the vectors are the table's."""
    import torch

    from madr.search.sparse.vectors import SparseBatch

    model_dir = resolve_model_dir(spec)
    model, index = opened(model_dir, str(spec.index))
    encoder = query_encoder(model, spec.encoder_backend, spec.encoder_precision)
    param, values = _sweep_param(index)
    if cfg.sweep and param:
        values = list(cfg.sweep)
    texts, qids = queries.column("text").to_pylist(), queries.column("query_id").to_pylist()
    if not texts:
        return []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            parts = [query_vectors(model, encoder, encoder_key(model_dir, spec), texts[at:at + cfg.batch_size])
                     for at in range(0, len(texts), cfg.batch_size)]
    finally:
        torch.set_num_threads(before)
    dense = np.concatenate([d for d, _ in parts])
    sparse = None if parts[0][1] is None else SparseBatch.concat([s for _, s in parts])
    params = search_params(spec, cfg.k, sparse is not None and index.has_sparse).replace(aspect_weight=0.0)
    points = []
    for v in values:
        kw = {param: v} if param else {}
        start = time.perf_counter()
        scores, ids = index.search(dense, params.replace(**kw), sparse=sparse if index.has_sparse else None)
        ms = 1000 * (time.perf_counter() - start) / max(len(texts), 1)
        run = to_run({q: (i, s) for q, i, s in zip(qids, ids, scores, strict=True)}, keys)
        value = _metrics(run, qrels, cfg, [cfg.sweep_metric])[cfg.sweep_metric]
        points.append({"run": spec.name, "param": param or "-", "value": v, "ms_per_query": ms,
                       cfg.sweep_metric: value})
    return points


def write_table(rows: list[dict[str, Any]], out: Path, name: str) -> None:
    """``name``.csv and ``name``.md of the rows (same columns in every row)."""
    cols = list(rows[0])
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def plot(points: list[dict[str, Any]], metric: str, path: Path) -> Path | None:
    """Recall (``metric``) vs ms/query, one line per run; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(p["run"] for p in points):
        pts = [p for p in points if p["run"] == name]
        ax.plot([p["ms_per_query"] for p in pts], [p[metric] for p in pts], marker="o", label=name)
        for p in pts:
            if p["param"] != "-":
                ax.annotate(str(p["value"]), (p["ms_per_query"], p[metric]), fontsize=7)
    ax.set_xlabel("search latency (ms / query, batched)")
    ax.set_ylabel(metric)
    ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"{metric} vs latency (labels: nprobe / efSearch)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_inputs(cfg: EvaluateConfig, out: Path, log=print) -> tuple[Any, Qrels, dict[str, Any] | None]:
    """(queries table, qrels, the validation summary of BEIR / TREC inputs or None) of ``cfg``."""
    quarantine_dir = str(out / "quarantine")
    summary = None
    if cfg.beir:
        queries, qrels, summary = read_beir_split(cfg.beir, cfg.split, quarantine_dir, cfg.qrels or None)
    elif is_text_qrels(cfg.qrels):
        queries = read_queries(cfg.queries)
        qrels, summary = read_text_qrels_for(cfg.qrels, queries, quarantine_dir)
    else:
        queries = read_queries(cfg.queries)
        qrels = read_qrels(cfg.qrels, cfg.qrels_doc_column)
        missing = sorted(set(qrels) - set(queries.column("query_id").to_pylist()))
        if missing:
            raise ValueError(f"{cfg.qrels}: {len(missing)} judged queries are not in {cfg.queries}, "
                             f"e.g. {missing[:3]}")
    if summary is not None:
        log(f"{summary.format()}\nquarantine -> {quarantine_dir}")
    return queries, qrels, None if summary is None else summary.to_dict()


def write_trec_run(run: Run, path: Path, tag: str, log=print) -> str | None:
    """The TREC run file of one run; None (and a logged reason) when a doc key cannot be written in it."""
    try:
        return str(write_run(path, run, tag))
    except ValueError as err:
        log(f"  no TREC run file for {tag}: {err}")
        return None


def search_threads(cfg: EvaluateConfig, queries: int, local: bool) -> int | None:
    """The torch threads with which this process searches the ``queries``, or None where a Ray actor pool does:
    1 for ``local`` runs and queries that fit one batch (as an actor would), every CPU of a one-node Ray cluster
    with ``executor: auto`` (`pipelines.resources.single_node_cpus`)."""
    if local or queries <= cfg.batch_size:
        return 1
    if cfg.executor == "auto":
        from pipelines.resources import single_node_cpus

        return single_node_cpus()
    return None


def run_evaluate(cfg: EvaluateConfig, log=print, local: bool = False) -> dict[str, Any]:
    """Evaluate every run of ``cfg`` (Ray must be initialised, unless ``local``: the searches run in this
    process, as they do when the queries fit in one batch, ``cfg.batch_size``); returns {"results": rows,
    "sweep": points, "comparisons": the first run against each other one, "run_files": {name: TREC run file}, "validation": summary of BEIR / TREC inputs or None, ...}."""
    if not cfg.runs:
        raise ValueError("evaluate: no runs given (each run names an index manifest)")
    out = Path(cfg.output)
    out.mkdir(parents=True, exist_ok=True)
    queries, qrels, validation = load_inputs(cfg, out, log)
    try:
        write_qrels(out / "qrels.trec", qrels)
    except ValueError as err:
        log(f"no TREC qrels file: {err}")
    rows, points, run_files, per_query, swept = [], [], {}, {}, {}
    threads = search_threads(cfg, queries.num_rows, local)
    for spec in cfg.runs:
        where = f" on {cfg.search_actors} Ray actor(s)" if threads is None else " in this process" + (
            f" ({threads} torch threads)" if threads > 1 else "")
        log(f"run {spec.name}: searching {queries.num_rows} queries in {spec.index}{where}")
        keys = DocKeys(spec.index, cfg.doc_key)
        searched = search_dataset(queries, spec, cfg.k, cfg.search_actors, cfg.batch_size) if threads is None \
            else search_local(queries, spec, cfg.k, cfg.batch_size, threads)
        results = collect(searched)
        run = to_run(results, keys)
        per_query[spec.name] = evaluate(run, qrels, cfg.metrics, relevance_threshold=cfg.relevance_threshold,
                                        gains=cfg.gains, per_query=True)
        values = query_means(per_query[spec.name])
        rows.append({"run": spec.name, "index": str(spec.index), "queries": len(qrels), **values})
        log("  " + ", ".join(f"{k}={v:.4f}" for k, v in values.items()))
        run_files[spec.name] = write_trec_run(run, out / f"{spec.name}.trec", spec.name, log)
        key = sweep_key(spec)
        if key in swept:  # the same dense search as an earlier run's: its points stand for this run's too
            log(f"  sweep: as run {swept[key]}'s (same index, model and dense search)")
        else:
            swept[key] = spec.name
            points.extend(sweep(spec, queries, qrels, keys, cfg, threads or 1))
    write_table(rows, out, "results")
    write_table(points, out, "sweep")
    comparisons = compare_to_first(per_query) if len(per_query) > 1 else []
    if comparisons:
        write_table(comparisons, out, "comparisons")
        for c in comparisons:
            log(f"  {c['run']} vs {c['reference']}: {c['metric']} {c['diff']:+.4f} (p {c['p_randomisation']:.4f})")
    png = plot(points, cfg.sweep_metric, out / "recall_latency.png") if cfg.plot else None
    log(f"results -> {out / 'results.csv'}, {out / 'results.md'}; plot -> {png}")
    return {"results": rows, "sweep": points, "comparisons": comparisons, "plot": png, "run_files": run_files,
            "validation": validation, "config": dataclasses.asdict(cfg)}
