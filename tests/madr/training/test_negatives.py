"""BM25-mined hard negatives (`train.finetune.negatives: mined`): never a relevant product or its twin, BM25's
order, used by the in-process sampler and the Ray job's fine-tuning rows alike; bad settings refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from madr.config import StageConfig
from madr.index.lexical import word_pieces
from madr.search.sparse import BM25Index
from madr.training.loop import CatalogSampler, catalog_sampler
from madr.training.negatives import mine_negatives, relevant_products
from pipelines.train.examples import finetune_rows


@pytest.fixture(scope="module")
def mined(catalog, tokenizer):
    return mine_negatives(catalog, "train", tokenizer, depth=10)


def test_mined_negatives_are_bm25_top_minus_relevant(catalog, tokenizer, mined):
    relevant = relevant_products(catalog, 3)
    train = [q for q in catalog.queries_in("train") if relevant.get(q.query_id)]
    assert set(mined) == {q.query_id for q in train}
    texts = {p.product_id: catalog.product_text(p) for p in catalog.products}
    ids = list(texts)
    index = BM25Index().fit(word_pieces(tokenizer, list(texts.values())))
    for q in train[:40]:
        got = mined[q.query_id]
        assert 0 < len(got) <= 10 and len(set(got)) == len(got)
        assert not set(got) & relevant[q.query_id]
        assert not {texts[p] for p in got} & {texts[p] for p in relevant[q.query_id]}
        scores = index.index.score(
            index.encode_queries(word_pieces(tokenizer, [q.text])), np.array([[ids.index(p) for p in got]])
        )[0]
        assert np.all(np.diff(scores) <= 1e-6), scores  # best BM25 first
        # nothing left out scores above the last kept one, except relevant products and their twins
        top, rows = index.search(word_pieces(tokenizer, [q.text]), k=len(ids))
        above = {ids[r] for s, r in zip(top[0], rows[0], strict=True) if s > scores[-1] + 1e-6}
        assert above - set(got) <= {
            p
            for p in ids
            if p in relevant[q.query_id] or texts[p] in {texts[x] for x in relevant[q.query_id]}
        }


def test_sampler_draws_mined_negatives_with_relevance_zero(catalog, tokenizer, mined):
    stage = StageConfig(negatives="mined", mined_depth=10)
    sampler = catalog_sampler(catalog, stage, tokenizer, seed=0)
    assert sampler.mined == mined
    texts = {p.product_id: catalog.product_text(p) for p in catalog.products}
    by_query: dict[str, set[str]] = {}  # query text -> mined products (synthetic queries may share a text)
    for q in catalog.queries_in("train"):
        by_query.setdefault(q.text, set()).update(mined.get(q.query_id, []))
    examples = [
        e for e in sampler.finetune_batch(64) if by_query[e.query]
    ]  # others: judged (BM25 found none)
    assert len(examples) > 32
    assert all(e.negative in {texts[p] for p in by_query[e.query]} for e in examples)
    assert all(e.negative_relevance == 0 for e in examples)
    judged = catalog_sampler(catalog, dataclasses.replace(stage, negatives="judged"), tokenizer, seed=0)
    assert judged.mined == {} and any(e.negative_relevance > 0 for e in judged.finetune_batch(64))


def test_ray_rows_use_the_same_mined_negatives(catalog, mined):
    texts = {p.product_id: catalog.product_text(p) for p in catalog.products}
    by_query: dict[str, set[str]] = {}
    for q in catalog.queries_in("train"):
        by_query.setdefault(q.text, set()).update(texts[p] for p in mined.get(q.query_id, []))
    rows = [r for r in finetune_rows(catalog, seed=0, mined=mined) if by_query[r["query"]]]
    assert len(rows) > 32 and all(r["negative"] in by_query[r["query"]] for r in rows)
    assert all(r["negative_relevance"] == 0 for r in rows)


def test_bad_negative_settings_are_refused(catalog):
    with pytest.raises(ValueError, match="negatives"):
        StageConfig(negatives="bm25")
    with pytest.raises(ValueError, match="mined_depth"):
        StageConfig(mined_depth=-1)
    with pytest.raises(ValueError, match="not in the catalog"):
        CatalogSampler(catalog, mined={catalog.queries[0].query_id: ["no-such-product"]})


def test_index_negatives_file_errors_name_the_file_row_and_field(tmp_path, catalog, tokenizer):
    """`negatives: index` reads the mine stage's Parquet; a missing file says which stage writes it, a bad row
    names its row and field, and a file that names unknown products is refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from madr.training.negatives import read_index_negatives

    stage = StageConfig(negatives="index")
    with pytest.raises(FileNotFoundError, match="mine stage"):
        catalog_sampler(catalog, stage, tokenizer, seed=0, index_negatives=tmp_path / "none.parquet")
    with pytest.raises(ValueError, match="needs the mine stage's output"):
        catalog_sampler(catalog, stage, tokenizer, seed=0)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"query_id": ["a", "b"], "negative_ids": [[1], [2]]}), bad)
    with pytest.raises(ValueError, match=r"bad.parquet: no column 'negative_keys'"):
        read_index_negatives(bad)
    pq.write_table(pa.table({"query_id": ["a", "b"], "negative_keys": [["p1"], None]}), bad)
    with pytest.raises(ValueError, match=r"bad.parquet: row 1 \(query 'b'\): field 'negative_keys'"):
        read_index_negatives(bad)
    other = tmp_path / "other.parquet"
    q = catalog.queries_in("train")[0].query_id
    pq.write_table(pa.table({"query_id": [q], "negative_keys": [["not-a-product"]]}), other)
    with pytest.raises(ValueError, match="mined on another catalog"):
        catalog_sampler(catalog, stage, tokenizer, seed=0, index_negatives=other)
