"""Synthetic catalog: determinism, rates of the world, judgments consistent with the grading rules."""

from __future__ import annotations

from collections import Counter

import pytest

from madr.data.schema import Catalog
from madr.data.synthetic.catalog import (
    CATEGORIES,
    ESCI_BY_RELEVANCE,
    generate_catalog,
    grade,
    parallel_phrases,
)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return generate_catalog(num_products=1000, num_queries=400, seed=3)


def test_deterministic_per_seed():
    a = generate_catalog(num_products=200, num_queries=60, seed=7)
    b = generate_catalog(num_products=200, num_queries=60, seed=7)
    c = generate_catalog(num_products=200, num_queries=60, seed=8)
    assert a == b, "same seed must give an identical catalog"
    assert [p.title for p in a.products] != [p.title for p in c.products], "another seed gives other products"
    assert [q.text for q in a.queries] != [q.text for q in c.queries], "another seed gives other queries"


def test_round_trips_through_parquet(tmp_path):
    a = generate_catalog(num_products=150, num_queries=40, seed=1, languages=["en", "de"])
    a.write(tmp_path)
    assert Catalog.read(tmp_path) == a


def test_world_shape(cat):
    assert 12 <= len(CATEGORIES) <= 20 and all(2 <= len(s) <= 4 for s in CATEGORIES.values())
    assert [p.product_id for p in cat.products[:2]] == ["P000000", "P000001"]
    assert cat.aspect_names == ["category", "brand", "color"]
    assert all(len(p.aspects["category"]) == 2 for p in cat.products), "category = [top, sub]"
    assert any(" " in p.aspects["category"][1] for p in cat.products), "multi-word category phrases"
    assert len({b for p in cat.products for b in p.aspects["brand"]}) >= 40, "~50 brands"
    assert any(len(p.aspects["color"]) == 2 for p in cat.products), "some products have two colours"


def test_missing_rates(cat):
    doc, query = cat.aspect_coverage("doc"), cat.aspect_coverage("query")
    assert abs((1 - doc["brand"]) - 0.10) < 0.04, f"~10% products without brand, got {1 - doc['brand']:.3f}"
    assert abs((1 - doc["color"]) - 0.15) < 0.05, f"~15% products without colour, got {1 - doc['color']:.3f}"
    assert query["category"] > 0.93, f"queries almost always name a category, got {query['category']:.3f}"
    assert abs(query["brand"] - 0.5) < 0.08, f"~50% of queries name a brand, got {query['brand']:.3f}"
    assert abs(query["color"] - 0.4) < 0.08, f"~40% of queries name a colour, got {query['color']:.3f}"


def test_aspects_visible_in_text(cat):
    def seen(items, text_of, aspect):
        have = [x for x in items if x.aspects[aspect]]
        return sum(all(v in text_of(x).lower() for v in x.aspects[aspect]) for x in have) / len(have)

    for aspect in ("brand", "color"):
        assert seen(cat.products, Catalog.product_text, aspect) > 0.85, f"product {aspect} mostly in the text"
    sub_in_query = sum(q.aspects["category"][-1] in q.text for q in cat.queries if q.aspects["category"])
    assert 0.5 < sub_in_query / len(cat.queries) < 0.95, (
        "queries sometimes use a synonym, not the value itself"
    )


def test_splits(cat):
    counts = Counter(q.split for q in cat.queries)
    assert counts == {"train": 280, "dev": 60, "test": 60}, f"70/15/15 split, got {counts}"
    assert len({q.text for q in cat.queries}) == len(cat.queries), "query texts are distinct"


def test_judgments(cat):
    per_query = Counter(j.query_id for j in cat.judgments)
    assert set(per_query) == {q.query_id for q in cat.queries}, "every query is judged"
    assert min(per_query.values()) >= 10 and max(per_query.values()) <= 20, "10-20 judgments per query"
    best = {}
    for j in cat.judgments:
        best[j.query_id] = max(best.get(j.query_id, 0), j.relevance)
        assert j.esci == ESCI_BY_RELEVANCE[j.relevance], (
            f"ESCI {j.esci} inconsistent with relevance {j.relevance}"
        )
    assert min(best.values()) >= 3, "every query has a product with relevance >= 3"
    assert {j.esci for j in cat.judgments} == {"E", "S", "C", "I"}, "all four ESCI labels occur"
    queries, products = cat.query_by_id(), cat.product_by_id()
    for j in cat.judgments[:500]:
        assert j.relevance == grade(queries[j.query_id].aspects, products[j.product_id].aspects)


def test_grade_rules():
    q = {"category": ["shoes", "running shoes"], "brand": ["north peak"], "color": ["black"]}
    p = {"category": ["shoes", "running shoes"], "brand": ["north peak"], "color": ["black"]}
    assert grade(q, p) == 4, "all mentioned aspects match, single colour"
    assert grade(q, {**p, "color": ["black", "white"]}) == 3, "match, but the product has another colour too"
    assert grade({**q, "category": ["shoes"]}, p) == 3, "match at top-category level only"
    assert grade(q, {**p, "brand": ["urban step"]}) == 2, "same category, wrong brand -> substitute"
    assert grade(q, {**p, "category": ["shoes", "hiking boots"]}) == 2, "same top, other subcategory"
    assert grade(q, {**p, "category": ["socks", "wool socks"]}) == 1, "socks complement shoes"
    assert grade(q, {**p, "category": ["toys", "board games"]}) == 0, "unrelated"
    assert grade({"category": [], "brand": ["north peak"], "color": []}, p) == 4, "brand-only query"


def test_languages():
    cat = generate_catalog(num_products=200, num_queries=120, seed=0, languages=["en", "de", "fr", "es"])
    assert set(Counter(q.language for q in cat.queries)) == {"en", "de", "fr", "es"}
    de = [
        q for q in cat.queries if q.language == "de" and q.aspects["category"] == ["shoes", "running shoes"]
    ]
    assert all("running" not in q.text for q in de), "German queries use the German category"
    assert all(q.aspects["category"][0] in CATEGORIES for q in cat.queries if q.aspects["category"]), (
        "annotations stay canonical English"
    )
    assert ("de", "laufschuhe", "running shoes") in parallel_phrases(["de"])
    with pytest.raises(ValueError, match="languages"):
        generate_catalog(num_products=10, num_queries=5, languages=["xx"])
