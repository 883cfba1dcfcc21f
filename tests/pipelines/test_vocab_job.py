"""Aspect vocabularies with Ray Data aggregations equal the in-process builder; corpus statistics
(paper 000 Table 3 / paper 001 Table 2) on a hand-computed example."""

from __future__ import annotations

import pyarrow as pa
import pytest

from madr.modeling.aspect_vocabulary import build_vocabularies
from pipelines.data.stats import aspect_stats
from pipelines.data.vocab_job import build_vocabularies_ray


def annotation_table(annotations, aspects) -> pa.Table:
    return pa.table({a: pa.array([ann.get(a, []) for ann in annotations], pa.list_(pa.string())) for a in aspects})


@pytest.fixture(scope="module")
def tokenizer_dir(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab_tok")
    tokenizer.save_pretrained(str(path))
    return path


def test_ray_vocabularies_equal_the_in_process_ones(ray_local, catalog, tokenizer, tokenizer_dir):
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    aspects = catalog.aspect_names
    annotations = [p.aspects for p in catalog.products] + [q.aspects for q in catalog.queries]
    table = annotation_table(annotations, aspects)
    ds = ray_local.data.from_arrow([table.slice(0, 250), table.slice(250, 200), table.slice(450)])  # 3 blocks
    for min_freq, max_size in ((1, None), (2, 7)):
        expected = build_vocabularies(annotations, aspects, ["phrase", "word", "token"], tokenize=tokenizer.tokenize,
                                      min_freq=min_freq, max_size=max_size)
        got = build_vocabularies_ray(ds, aspects, ["phrase", "word", "token"], tokenizer_dir, min_freq, max_size)
        assert got.to_dict() == expected.to_dict(), f"min_freq={min_freq}, max_size={max_size}: vocabularies differ"
        assert len(got.get("color", "phrase")) > 0, "the fixture has colour values"
        in_process = build_vocabularies_ray(table, aspects, ["phrase", "word", "token"], tokenizer_dir, min_freq,
                                            max_size)  # a table: the same batch function, without Ray Data
        assert in_process.to_dict() == expected.to_dict()
    # phrase + word only need no tokenizer; the token granularity does
    words = build_vocabularies_ray(ds, aspects, ["word"])
    assert words.to_dict() == build_vocabularies(annotations, aspects, ["word"]).to_dict()
    with pytest.raises(ValueError, match="needs a tokenizer"):
        build_vocabularies_ray(ds, aspects, ["token"])


def test_stats_hand_computed(ray_local):
    items = pa.table({"product_id": ["p1", "p2", "p3", "p4", "p1"],
                      "brand": [["Acme"], [], None, ["  "], ["Acme"]],
                      "color": [["Red", "Dark Red"], ["red"], ["Blue"], [], ["Red", "Dark Red"]]})
    queries = pa.table({"brand": [["acme"], [], [], []], "color": [[], [], ["blue"], []]})
    ds_items = ray_local.data.from_arrow(items)  # p1 appears twice: counted once by key
    vocabs = build_vocabularies_ray(ray_local.data.from_arrow(items.slice(0, 4)), ["brand", "color"],
                                    ["phrase", "word"])
    stats = aspect_stats({"item": ds_items, "query": ray_local.data.from_arrow(queries)}, ["brand", "color"], vocabs,
                         keys={"item": "product_id"})
    # items: brand non-empty for p1 only (p4's value is blank) -> 1/4; colour for p1, p2, p3 -> 3/4
    # queries: brand 1/4, colour 1/4. Vocabularies: brand {acme}; colour phrases {red, dark red, blue},
    # words {red, dark, blue}.
    assert stats.documents == {"item": 4, "query": 4}, stats.documents
    assert stats.coverage == {"item": {"brand": 0.25, "color": 0.75}, "query": {"brand": 0.25, "color": 0.25}}
    assert stats.vocab_sizes == {"brand": {"phrase": 1, "word": 1}, "color": {"phrase": 3, "word": 3}}
    here = aspect_stats({"item": items, "query": queries}, ["brand", "color"], vocabs, keys={"item": "product_id"})
    assert (here.documents, here.coverage) == (stats.documents, stats.coverage)  # tables, in this process
    table = stats.format()
    assert "75.0%" in table and "(3, 3)" in table, table
