"""Home Depot catalog and title annotator (madr.data.sources.homedepot): rules on hand-written titles, the catalog
built from the real file, and the annotator's accuracy on the hand-checked held-out sample."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.data.schema import Catalog
from madr.data.sources.homedepot import (
    TitleAnnotator,
    annotator_accuracy,
    esci_label,
    finish_of,
    homedepot_catalog,
    read_gold,
    relevance_grade,
    singular,
)

GOLD_DIR = Path(__file__).resolve().parents[3] / "benchmarks" / "data"
TITLES = [
    "Hampton Bay 36 in. Brown Ceiling Fan with Light Kit",
    "Hampton Bay Lugano 52 in. Ceiling Fan in Brushed Nickel",
    "Hampton Bay 3-Light Vanity Light in Oil Rubbed Bronze",
    "KOHLER Devonshire 4 in. Bathroom Faucet in Polished Chrome",
    "KOHLER Devonshire Toilet Seat in White",
    "KOHLER Cimarron 2-piece Toilet in Biscuit",
    "KOHLER Memoirs Pedestal Sink in White",
    "KOHLER 12 in. Grab Bar in Brushed Nickel",
    "KOHLER Purist Wall-Mount Faucet in Polished Chrome",
    "Pentek 155263 RFFE20-BB 20 in. Water Filter",
    "New York Wire 36 in. x 84 in. Charcoal Fiberglass Insect Screen FCS8558-M",
    "4 in. x 10 ft. Corex Drain Pipe",
    "Rust-Oleum 12 oz. Gloss White Spray Paint (6-Pack)",
    "Merola Tile Abadia 6 in. x 6 in. Porcelain Floor Tile",
    "Merola Tile Hudson 12 in. x 12 in. Wall Tiles",
    "Merola Tile Metro Hex Floor and Wall Tile",
    "Children&#39;s Toilet Seat in White",
]


@pytest.fixture(scope="module")
def annotator() -> TitleAnnotator:
    return TitleAnnotator.fit(TITLES, min_brand_count=3)


def test_brand_is_the_frequent_leading_words_and_stops_at_numbers(annotator) -> None:
    assert annotator.annotate(TITLES[0])["brand"] == ["hampton bay"]
    assert annotator.annotate(TITLES[3])["brand"] == ["kohler"]  # "KOHLER Devonshire" is a product line
    assert annotator.annotate(TITLES[13])["brand"] == ["merola tile"]
    assert annotator.annotate(TITLES[9])["brand"] == ["pentek"]  # rare prefix: first word only
    assert annotator.annotate(TITLES[11])["brand"] == []  # starts with a size


def test_color_is_the_finish_or_a_colour_phrase(annotator) -> None:
    assert finish_of("Faucet in Polished Chrome with Drain") == "polished chrome"
    assert finish_of("Spray Paint and Primer in One (6-Pack)") is None  # " in One" is no finish
    assert finish_of("Cabinet 24 in. x 36 in.") is None
    assert annotator.annotate(TITLES[1])["color"] == ["brushed nickel"]
    assert annotator.annotate(TITLES[0])["color"] == ["brown"]  # no " in ": the colour word of the title
    assert annotator.annotate(TITLES[10])["color"] == ["charcoal"]
    assert annotator.annotate(TITLES[9])["color"] == []


def test_category_is_the_head_noun(annotator) -> None:
    heads = [annotator.annotate(t)["category"] for t in TITLES]
    assert heads[0] == ["fan"]  # cut at " with "
    assert heads[2] == ["light"]  # cut at " in <finish>"
    assert heads[9] == ["filter"]
    assert heads[10] == ["screen"]  # the trailing model number is skipped
    assert heads[12] == ["paint"]  # the colour inside the head is removed, the "(6-Pack)" cut
    assert heads[14] == ["tile"]  # singular
    assert annotator.annotate(TITLES[16]) == {"category": ["seat"], "brand": ["children's"], "color": ["white"]}
    assert singular("batteries") == "battery" and singular("glass") == "glass"


def test_query_lexicon_finds_brands_colours_and_the_head_category(annotator) -> None:
    from madr.data.schema import Product

    products = [Product(str(i), t, "", annotator.annotate(t)) for i, t in enumerate(TITLES)]
    lexicon = annotator.query_lexicon(products, min_count=1, min_brand_count=1)
    found = lexicon.annotate("kohler white bathroom faucets")
    assert found == {"category": ["faucet"], "brand": ["kohler"], "color": ["white"]}
    assert lexicon.annotate("hampton bay brushed nickel ceiling fan light")["brand"] == ["hampton bay"]
    assert lexicon.annotate("something else entirely") == {"category": [], "brand": [], "color": []}


def test_grades_and_esci_labels() -> None:
    assert [relevance_grade(r) for r in (1.0, 1.33, 1.67, 2.0, 2.33, 2.67, 3.0)] == [0, 1, 1, 2, 3, 3, 4]
    assert [esci_label(g) for g in range(5)] == ["I", "I", "S", "E", "E"]


def _write_rows(path: Path, rows: list[tuple]) -> Path:
    cols = list(zip(*rows, strict=True))
    pq.write_table(pa.table({"id": list(range(len(rows))), "product_uid": list(cols[0]),
                             "product_title": list(cols[1]), "search_term": list(cols[2]),
                             "relevance": list(cols[3])}), path)
    return path


def test_catalog_from_a_small_file(tmp_path: Path) -> None:
    rows = [(100 + i % 6, TITLES[i % 6], f"term {i % 10}", 1.0 + (i % 7) / 3) for i in range(40)]
    rows.append((100, TITLES[0], "term 0", 3.0))  # a repeated (term, product) pair is averaged
    catalog = homedepot_catalog(_write_rows(tmp_path / "hd.parquet", rows), seed=1, fractions=(0.6, 0.2, 0.2))
    assert len(catalog.products) == 6 and len(catalog.queries) == 10
    assert sorted(q.split for q in catalog.queries).count("train") == 6
    pairs = [(j.query_id, j.product_id) for j in catalog.judgments]
    assert len(pairs) == len(set(pairs)) == len({(r[2], r[0]) for r in rows})
    out = tmp_path / "catalog"
    catalog.write(out)
    assert Catalog.read(out).aspect_names == ["category", "brand", "color"]
    sampled = homedepot_catalog(tmp_path / "hd.parquet", seed=1, max_queries=4)
    assert len(sampled.queries) == 4 and len(sampled.products) == 6
    with pytest.raises(ValueError, match="fractions"):
        homedepot_catalog(tmp_path / "hd.parquet", fractions=(0.5, 0.5, 0.5))


def test_missing_column_and_bad_gold_name_the_file(tmp_path: Path) -> None:
    pq.write_table(pa.table({"product_uid": [1], "search_term": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet.*product_title"):
        homedepot_catalog(tmp_path / "bad.parquet")
    gold = tmp_path / "gold.tsv"
    gold.write_text("# comment\nproduct_uid\tbrand\tcategory\tcolor\n1\tAcme\tfan\t-\n2\tAcme\t\twhite\n")
    with pytest.raises(ValueError, match=r"gold\.tsv: row 1: field 'category'"):
        read_gold(gold)


# -- real data -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(shared_data: Path) -> tuple[Catalog, dict[str, str]]:
    path = shared_data / "product_search" / "homedepot_relevance_dev.parquet"
    catalog = homedepot_catalog(path)
    return catalog, {p.product_id: p.title for p in catalog.products}


def test_real_catalog_sizes_and_split_by_term(real) -> None:
    catalog, _ = real
    assert len(catalog.products) == 40941
    assert len(catalog.queries) == 8256  # 8,257 raw terms; two differ only in whitespace / case
    assert len({q.text for q in catalog.queries}) == len(catalog.queries)
    splits = {s: sum(q.split == s for q in catalog.queries) for s in ("train", "dev", "test")}
    assert splits["train"] > 5000 and splits["test"] > 1500
    assert sum(bool(p.aspects["category"]) for p in catalog.products) > 0.95 * len(catalog.products)


@pytest.mark.parametrize("name, floors", [
    ("homedepot_annotator_gold.tsv", {"brand": 0.85, "category": 0.9, "color": 0.8}),
    ("homedepot_annotator_heldout.tsv", {"brand": 0.75, "category": 0.85, "color": 0.8}),
])
def test_annotator_accuracy_on_the_hand_checked_samples(real, name: str, floors: dict[str, float]) -> None:
    catalog, titles = real
    annotator = TitleAnnotator.fit(titles.values())
    scores = annotator_accuracy(annotator, titles, read_gold(GOLD_DIR / name))
    print(name, scores)
    for aspect, floor in floors.items():
        assert scores[aspect]["accuracy"] >= floor, (aspect, scores[aspect])
