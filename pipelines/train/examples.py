"""Training rows of each stage, written once as Parquet files that Ray Data then streams to the workers.

The driver turns a catalog (`madr.data.schema`) into one table per stage, in a seeded order, split into
files of `rows_per_file` rows (a file is a Ray Data block, the unit handed to a worker):

* pretrain (Eq. 7 / Eq. 9): row i pairs the i-th product with a training query (both towers get MLM +
  aspect objectives); a held-out set of products (and the dev queries) is kept for validation;
* finetune (Eq. 8 / Eq. 10): one row per judged (train query, positive) with a hard negative, a lower-judged
  product of the same query when there is one (paper 001 Sec. 5.3.2), else a random product (relevance 0);
  rows come in rounds (the k-th positive of every query), so a batch rarely holds one query twice; with
  `train.finetune.negatives: mined`, the hard negative is one of BM25's top products for the query that is not
  judged relevant (`madr.training.negatives`), as in process;
* distill (paper 004 Sec. V-A): the training queries' texts.

Aspect annotations travel as JSON strings; `decode_batch` tokenises a batch of rows for the model inside
the worker (`madr.modeling.batching.make_batch`). Every row has an int64 `row_id` (its position in the table), so
the job can prove which rows a step consumed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from madr.data.schema import Catalog
from madr.modeling.batching import make_batch
from madr.modeling.model import BiEncoder
from madr.training.negatives import MinedNegatives, check_mined, hard_negative
from madr.training.stage_module import DistillBatch, FinetuneBatch, PretrainBatch

COLUMNS = {
    "pretrain": ("row_id", "query", "query_aspects", "doc", "doc_aspects"),
    "finetune": ("row_id", "query", "query_aspects", "positive", "positive_aspects", "negative",
                 "negative_aspects", "negative_relevance", "weight"),
    "distill": ("row_id", "text"),
}
DONE_FILE = "_DONE.json"


def holdout_products(catalog: Catalog, seed: int, fraction: float = 0.1, cap: int = 256) -> set[str]:
    """Product ids kept out of pretraining for the validation MLM / aspect loss."""
    ids = sorted(p.product_id for p in catalog.products)
    random.Random(seed).shuffle(ids)
    return set(ids[: min(cap, max(1, int(fraction * len(ids))))])


def pretrain_rows(catalog: Catalog, seed: int) -> Iterator[dict[str, Any]]:
    held = holdout_products(catalog, seed)
    products = [p for p in catalog.products if p.product_id not in held]
    queries = catalog.queries_in("train") or list(catalog.queries)
    rng = random.Random(seed)
    rng.shuffle(products)
    order = list(range(len(queries)))
    rng.shuffle(order)
    for i, p in enumerate(products):
        q = queries[order[i % len(order)]]
        yield {"query": q.text, "query_aspects": json.dumps(q.aspects), "doc": catalog.product_text(p),
               "doc_aspects": json.dumps(p.aspects)}


def finetune_rows(catalog: Catalog, seed: int, min_relevance: int = 3, max_relevance: int = 4,
                  mined: MinedNegatives | None = None, judged_share: float = 0.0) -> Iterator[dict]:
    """Fine-tuning rows (module docstring); with `mined` (`madr.training.negatives`), a query's hard negative is one
    of its mined products (relevance 0) instead (a share `judged_share` of them its judged lower ones when it has
    any), as `madr.training.loop.CatalogSampler` draws them. `weight` is the positive's judgment weight (1 for
    judged catalogs; a click log's inverse-propensity weight, `madr.clicks.judgments`)."""
    mined = dict(mined or {})
    check_mined(mined, {p.product_id for p in catalog.products})
    rng = random.Random(seed)
    by_id = catalog.product_by_id()
    products = sorted(by_id)
    judged: dict[str, list[tuple[str, int]]] = {}
    weight = {}
    for j in catalog.judgments:
        judged.setdefault(j.query_id, []).append((j.product_id, j.relevance))
        weight[j.query_id, j.product_id] = j.weight
    plans = []
    for q in catalog.queries_in("train"):
        pos = [p for p, r in judged.get(q.query_id, []) if r >= min_relevance]
        neg = [(p, r) for p, r in judged.get(q.query_id, []) if r < min_relevance]
        rng.shuffle(pos)
        if pos:
            plans.append((q, pos, neg))
    rounds = max((len(pos) for _, pos, _ in plans), default=0)
    for k in range(rounds):
        members = [plan for plan in plans if len(plan[1]) > k]
        rng.shuffle(members)
        for q, pos, neg in members:
            neg_id, rel = hard_negative(rng, mined.get(q.query_id, []), neg, products, judged_share)
            p, n = by_id[pos[k]], by_id[neg_id]
            yield {"query": q.text, "query_aspects": json.dumps(q.aspects),
                   "positive": catalog.product_text(p), "positive_aspects": json.dumps(p.aspects),
                   "negative": catalog.product_text(n), "negative_aspects": json.dumps(n.aspects),
                   "negative_relevance": rel / max_relevance, "weight": weight[q.query_id, pos[k]]}


def distill_rows(catalog: Catalog, seed: int) -> Iterator[dict[str, Any]]:
    texts = [q.text for q in catalog.queries_in("train")]
    random.Random(seed).shuffle(texts)
    for t in texts:
        yield {"text": t}


ROWS = {"pretrain": pretrain_rows, "finetune": finetune_rows, "distill": distill_rows}


def write_examples(kind: str, rows: Iterable[dict[str, Any]], out_dir: str | Path, rows_per_file: int = 256,
                   fingerprint: str = "") -> int:
    """Write `rows` as `part-00000.parquet`, ... under `out_dir`; returns the row count.

    A `_DONE.json` with `fingerprint` marks a finished write: a later call with the same fingerprint keeps
    the files (a resumed job must read exactly the rows the first attempt read)."""
    out = Path(out_dir)
    done = out / DONE_FILE
    if done.is_file() and json.loads(done.read_text()).get("fingerprint") == fingerprint:
        return int(json.loads(done.read_text())["rows"])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet"):
        old.unlink()
    buffer: list[dict[str, Any]] = []
    count = files = 0

    def flush() -> None:
        nonlocal files
        table = pa.Table.from_pylist(buffer)
        pq.write_table(table.select(list(COLUMNS[kind])), out / f"part-{files:05d}.parquet")
        files += 1
        buffer.clear()

    for row in rows:
        buffer.append({"row_id": count, **row})
        count += 1
        if len(buffer) == rows_per_file:
            flush()
    if buffer:
        flush()
    if count == 0:
        raise ValueError(f"{kind}: the catalog yields no training rows (no train queries / judgments?)")
    done.write_text(json.dumps({"fingerprint": fingerprint, "rows": count, "files": files}))
    return count


def _aspects(column: np.ndarray) -> list[dict[str, list[str]]]:
    return [json.loads(v) for v in column]


def decode_batch(kind: str, rows: dict[str, np.ndarray], model: BiEncoder, seed: int = 0) -> Any:
    """A numpy batch of stage rows -> the stage batch (tokenised, aspect labels from the model's vocabularies)."""
    missing = [c for c in COLUMNS[kind] if c not in rows and c != "weight"]  # rows written before weights: 1
    if missing:
        raise ValueError(f"{kind} batch lacks columns {missing} (got {sorted(rows)})")
    if kind == "pretrain":
        return PretrainBatch(make_batch(model, list(rows["query"]), "query", _aspects(rows["query_aspects"])),
                             make_batch(model, list(rows["doc"]), "doc", _aspects(rows["doc_aspects"])), seed)
    if kind == "finetune":
        return FinetuneBatch(
            make_batch(model, list(rows["query"]), "query", _aspects(rows["query_aspects"])),
            make_batch(model, list(rows["positive"]), "doc", _aspects(rows["positive_aspects"])),
            make_batch(model, list(rows["negative"]), "doc", _aspects(rows["negative_aspects"])),
            torch.as_tensor(np.asarray(rows["negative_relevance"], dtype=np.float32)),
            torch.as_tensor(np.asarray(rows["weight"], dtype=np.float32)) if "weight" in rows else None)
    enc = model.tokenize(list(rows["text"]), "query")
    return DistillBatch(enc["input_ids"], enc["attention_mask"])
