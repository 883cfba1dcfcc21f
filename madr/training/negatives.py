"""Hard negatives for fine-tuning: mined with BM25 (`train.finetune.negatives: mined`) or read from the mine
stage's search of the model's own index (`negatives: index`, `read_index_negatives`).

Paper 001 Sec. 5.3.2 trains with "a hard negative sample for each query besides in-batch negatives"; the default
(`negatives: judged`) takes a lower-judged product of the query, else a random one, which is an easy negative
for most queries of a sparsely judged log. DPR (Karpukhin et al., EMNLP 2020, Sec. 3.2 / Table 3) showed that
negatives drawn from BM25's top list for the query, minus its positives, are the hard ones that teach a dense
retriever what lexical overlap alone gets wrong; a dense model fused with BM25 is ranked on exactly those
candidates. `mine_negatives` ranks the whole catalog with BM25 (`madr.search.sparse.BM25Index` over lower-cased
word pieces, as the served lexical index: `madr.index.lexical.word_pieces`) for each query of a split and keeps
the top `depth` products that are not judged relevant to it (relevance >= `min_relevance`) and whose text is not
the text of one of its relevant products (catalogs list the same title under several ids).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from madr.data.schema import Catalog
from madr.index.lexical import word_pieces
from madr.search.sparse import BM25Index

MinedNegatives = Mapping[str, Sequence[str]]  # query id -> product ids, best BM25 score first


def relevant_products(catalog: Catalog, min_relevance: int) -> dict[str, set[str]]:
    """Query id -> ids of the products judged relevant to it (relevance >= `min_relevance`)."""
    out: dict[str, set[str]] = {}
    for j in catalog.judgments:
        if j.relevance >= min_relevance:
            out.setdefault(j.query_id, set()).add(j.product_id)
    return out


def mine_negatives(
    catalog: Catalog, split: str, tokenizer: Any, depth: int = 30, min_relevance: int = 3
) -> dict[str, list[str]]:
    """The BM25-mined negatives of every `split` query that has a relevant product (module docstring): up to
    `depth` product ids per query, best first. `tokenizer` is a transformers tokenizer (its word pieces)."""
    if depth < 1:
        raise ValueError(f"mine_negatives: depth must be >= 1, got {depth}")
    relevant = relevant_products(catalog, min_relevance)
    queries = [q for q in catalog.queries_in(split) if relevant.get(q.query_id)]
    if not queries:
        return {}
    products = list(catalog.products)
    texts = [catalog.product_text(p) for p in products]
    text_of = {p.product_id: t for p, t in zip(products, texts, strict=True)}
    index = BM25Index().fit(word_pieces(tokenizer, texts))
    extra = max(len(r) for r in relevant.values())  # room for the positives (and their twins) at the top
    _, rows = index.search(
        word_pieces(tokenizer, [q.text for q in queries]), k=min(len(products), depth + 4 * extra)
    )
    out = {}
    for q, ranked in zip(queries, rows, strict=True):
        positives = relevant[q.query_id]
        twins = {text_of[p] for p in positives if p in text_of}
        kept = [products[r].product_id for r in ranked if r >= 0]
        out[q.query_id] = [p for p in kept if p not in positives and text_of[p] not in twins][:depth]
    return out


def hard_negative(
    rng: random.Random, mined: Sequence[str], judged: Sequence[tuple[str, int]], product_ids: Sequence[str],
    judged_share: float = 0.0,
) -> tuple[str, int]:
    """(product id, relevance) of one query's hard negative: one of its `mined` products (relevance 0) when it has
    any, else a lower-judged product of it (`judged`: (id, relevance) pairs; paper 001 Sec. 5.3.2), else a random
    product of `product_ids` (relevance 0). `judged_share` > 0: with that probability a query with both takes a
    judged one (a click log's skipped impressions, `madr.clicks.judgments`, beside BM25's). The in-process sampler
    and the Ray job's fine-tuning rows both draw with it."""
    if judged_share > 0 and mined and judged and rng.random() < judged_share:
        return rng.choice(judged)
    if mined:
        return rng.choice(mined), 0
    if judged:
        return rng.choice(judged)
    return rng.choice(product_ids), 0


def read_index_negatives(path: str | Path) -> dict[str, list[str]]:
    """Query id -> product ids (best rank first) of the mine stage's output (`pipelines/mine`: the index's results
    for each training query at ranks rank_min..rank_max, minus its positives; the ANCE-style second round: negatives
    the trained model itself ranks high). Reads `query_id` and `negative_keys` (the products' `doc_key`, which
    the pipeline sets to product_id). Errors name the file, the row and the field."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no mined negatives; `negatives: index` reads the mine stage's output: run "
                                f"the pipeline's encode and mine stages first (python -m pipelines.jobs pipeline "
                                f"--stages encode,mine), or use `negatives: mined` (BM25)")
    table = pq.read_table(path)
    missing = [c for c in ("query_id", "negative_keys") if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (has {table.column_names}); the mine stage writes it "
                         f"when its doc_key is set")
    out: dict[str, list[str]] = {}
    for row, (qid, keys) in enumerate(zip(table.column("query_id").to_pylist(),
                                          table.column("negative_keys").to_pylist(), strict=True)):
        if not isinstance(qid, str) or not qid:
            raise ValueError(f"{path}: row {row}: field 'query_id' is {qid!r}, not a query id")
        if keys is None or any(not isinstance(k, str) for k in keys):
            raise ValueError(f"{path}: row {row} (query {qid!r}): field 'negative_keys' must be a list of product "
                             f"ids, got {keys!r}")
        out[qid] = list(keys)
    return out


def check_mined(mined: MinedNegatives, known: set[str]) -> None:
    """Refuse mined negatives that name a product the catalog does not have (a list mined on another catalog)."""
    for qid, ids in mined.items():
        unknown = [p for p in ids if p not in known]
        if unknown:
            raise ValueError(
                f"mined negatives of query {qid!r} name {len(unknown)} product(s) not in the catalog, "
                f"e.g. {unknown[0]!r}: were they mined on another catalog?"
            )
