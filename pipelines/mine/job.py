"""Hard-negative mining: search the index with the training queries, drop the known positives, and sample
negatives from a rank range (the "hard negatives" of the in-batch softmax loss with negatives).

Per query: the top ``rank_max`` documents of the index (the same sharded dense / hybrid search as
evaluation, ``pipelines.evaluate.searcher``), ranks 1-based in that list; the candidates are the results
with ``rank_min <= rank <= rank_max`` that are not positives of the query; ``num_negatives`` of them are
drawn uniformly without replacement with a generator seeded by (``seed``, the query id), so the choice
does not depend on batching or on the number of actors. Queries with fewer candidates keep all of them.

Output (Parquet, one row per query that has a positive), read by fine-tuning with ``train.finetune.negatives:
index`` (``madr.training.negatives.read_index_negatives``: ``query_id`` and ``negative_keys``):

| column | type | meaning |
|---|---|---|
| ``query_id`` | string | the query's id |
| ``query`` | string | the query text |
| ``positive_ids`` | list<int64> | index ids of the known positives |
| ``negative_ids`` | list<int64> | sampled hard negatives (index ids), by rank ascending |
| ``negative_ranks`` | list<int32> | their 1-based ranks in the search results |
| ``negative_scores`` | list<float32> | their search scores |
| ``positive_keys`` / ``negative_keys`` | list<string> | with ``doc_key``: the same documents by display key |
| ``positive_texts`` / ``negative_texts`` | list<string> | with ``text_column``: the documents' text from the docs table |
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from madr.index.manifest import atomic_write
from madr.search.spec import SearchSpec
from pipelines.evaluate.io import read_qrels, read_queries
from pipelines.evaluate.searcher import DocKeys, collect, search_dataset


@dataclass
class MineConfig:
    """Inputs, the rank range and the sample size (module docstring)."""

    queries: str = ""
    positives: str = ""  # qrels-like: query_id, doc_id (index id or doc_key value), relevance (optional)
    run: SearchSpec = field(default_factory=SearchSpec)  # the index, its model and the search settings
    output: str = "negatives.parquet"
    doc_key: str | None = None
    positives_doc_column: str = "doc_id"
    min_relevance: float = 1.0  # a judged doc with at least this relevance is a positive (1: any qrels file;
    # paper 000's 0-4 grades: 2, as configs/encode.yaml and the main job, which passes eval.relevance_threshold)
    rank_min: int = 10
    rank_max: int = 100
    num_negatives: int = 8
    seed: int = 0
    text_column: str | None = None  # docs-table column to copy as the documents' text
    search_actors: int = 1
    batch_size: int = 256

    def __post_init__(self) -> None:
        if isinstance(self.run, dict):
            self.run = SearchSpec(**self.run)
        if not 1 <= self.rank_min <= self.rank_max:
            raise ValueError(f"mine: need 1 <= rank_min <= rank_max, got {self.rank_min}, {self.rank_max}")
        if self.num_negatives < 1:
            raise ValueError(f"mine: num_negatives must be >= 1, got {self.num_negatives}")


def query_rng(seed: int, query_id: str) -> np.random.Generator:
    """A generator that depends only on (seed, query id)."""
    digest = int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, digest])


def sample_negatives(ids: np.ndarray, scores: np.ndarray, positives: set[int], cfg: MineConfig,
                     query_id: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, ranks, scores) of the sampled negatives of one query, by rank ascending."""
    ranks = np.arange(1, ids.size + 1)
    ok = (ids >= 0) & (ranks >= cfg.rank_min) & (ranks <= cfg.rank_max)
    ok &= ~np.isin(ids, np.fromiter(positives, np.int64, len(positives)))
    cand = np.flatnonzero(ok)
    if cand.size > cfg.num_negatives:
        cand = np.sort(query_rng(cfg.seed, query_id).choice(cand, cfg.num_negatives, replace=False))
    return ids[cand], ranks[cand].astype(np.int32), scores[cand].astype(np.float32)


def _positive_ids(cfg: MineConfig, keys: DocKeys) -> dict[str, set[int]]:
    qrels = read_qrels(cfg.positives, cfg.positives_doc_column)
    out: dict[str, set[int]] = {}
    for qid, docs in qrels.items():
        for key, rel in docs.items():
            if rel < cfg.min_relevance:
                continue
            doc = keys.id_of(key)
            if doc is None:
                raise ValueError(f"{cfg.positives}: query {qid!r}, field {cfg.positives_doc_column!r}: document "
                                 f"{key!r} is not in the index")
            out.setdefault(qid, set()).add(doc)
    return out


def _texts(cfg: MineConfig) -> Any:
    if cfg.text_column is None:
        return None
    from madr.index import DocStore, Manifest

    m = Manifest.load(cfg.run.index)
    if not m.docs_path:
        raise ValueError(f"{cfg.run.index}: the index has no docs table for text_column {cfg.text_column!r}")
    base = Path(cfg.run.index)
    base = base if base.is_dir() else base.parent
    return DocStore.open(base / m.docs_path, columns=[cfg.text_column])


def run_mine(cfg: MineConfig, log=print) -> Path:
    """Mine hard negatives (Ray must be initialised); returns the output path."""
    queries = read_queries(cfg.queries)
    keys = DocKeys(cfg.run.index, cfg.doc_key)
    positives = _positive_ids(cfg, keys)
    queries = queries.filter(pa.array([q in positives for q in queries.column("query_id").to_pylist()]))
    if queries.num_rows == 0:
        raise ValueError(f"{cfg.positives}: no query of {cfg.queries} has a positive (relevance >= {cfg.min_relevance})")
    log(f"mining {cfg.num_negatives} negatives from ranks {cfg.rank_min}..{cfg.rank_max} for {queries.num_rows} queries")
    results = collect(search_dataset(queries, cfg.run, cfg.rank_max, cfg.search_actors, cfg.batch_size))
    store = _texts(cfg)
    cols: dict[str, list[Any]] = {c: [] for c in ("query_id", "query", "positive_ids", "negative_ids",
                                                  "negative_ranks", "negative_scores")}
    if cfg.doc_key:
        cols.update(positive_keys=[], negative_keys=[])
    if store is not None:
        cols.update(positive_texts=[], negative_texts=[])
    for qid, text in zip(queries.column("query_id").to_pylist(), queries.column("text").to_pylist(), strict=True):
        ids, scores = results[qid]
        pos = sorted(positives[qid])
        neg, ranks, neg_scores = sample_negatives(ids, scores, positives[qid], cfg, qid)
        for name, value in (("query_id", qid), ("query", text), ("positive_ids", pos), ("negative_ids", neg.tolist()),
                            ("negative_ranks", ranks.tolist()), ("negative_scores", neg_scores.tolist())):
            cols[name].append(value)
        if cfg.doc_key:
            cols["positive_keys"].append(keys.keys(np.array(pos)))
            cols["negative_keys"].append(keys.keys(neg))
        if store is not None:
            cols["positive_texts"].append([r[cfg.text_column] for r in store.get(pos)])
            cols["negative_texts"].append([r[cfg.text_column] for r in store.get(neg)])
    table = pa.table({"query_id": pa.array(cols.pop("query_id"), pa.string()),
                      "query": pa.array(cols.pop("query"), pa.string()),
                      "positive_ids": pa.array(cols.pop("positive_ids"), pa.list_(pa.int64())),
                      "negative_ids": pa.array(cols.pop("negative_ids"), pa.list_(pa.int64())),
                      "negative_ranks": pa.array(cols.pop("negative_ranks"), pa.list_(pa.int32())),
                      "negative_scores": pa.array(cols.pop("negative_scores"), pa.list_(pa.float32())),
                      **{k: pa.array(v, pa.list_(pa.string())) for k, v in cols.items()}})
    out = Path(cfg.output)
    atomic_write(out, lambda tmp: pq.write_table(table, tmp))
    counts = [len(n) for n in table.column("negative_ids").to_pylist()]
    log(f"{table.num_rows} queries, {sum(counts)} negatives ({min(counts)}..{max(counts)} per query) -> {out}")
    return out
