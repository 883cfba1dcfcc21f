"""Catalog schema: parquet round trip, validation errors naming file / row / field, helpers."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.data.schema import Catalog, Judgment, Product, Query


def tiny_catalog() -> Catalog:
    products = [
        Product(
            "P1",
            "North Peak running shoes black",
            "Light shoes.",
            {"category": ["shoes", "running shoes"], "brand": ["north peak"], "color": ["black"]},
        ),
        Product("P2", "Wool socks", "", {"category": ["socks"], "brand": [], "color": []}),
        Product("P3", "Red kettle", "Boils water.", {"category": ["kitchen"], "brand": [], "color": ["red"]}),
    ]
    queries = [
        Query(
            "Q1",
            "black sneakers",
            {"category": ["shoes", "running shoes"], "brand": [], "color": ["black"]},
            "train",
        ),
        Query("Q2", "kettle", {"category": ["kitchen"], "brand": [], "color": []}, "test", "de"),
    ]
    judgments = [
        Judgment("Q1", "P1", 4, "E"),
        Judgment("Q1", "P2", 1, "C"),
        Judgment("Q1", "P3", 0, "I"),
        Judgment("Q2", "P3", 3, "E"),
        Judgment("Q2", "P1", 0, "I"),
    ]
    return Catalog(products, queries, judgments, ["category", "brand", "color"])


def test_round_trip(tmp_path):
    cat = tiny_catalog()
    cat.write(tmp_path)
    back = Catalog.read(tmp_path)
    assert back == cat, "read(write(c)) must equal c, aspects, languages and empty lists included"
    assert back.aspect_names == ["category", "brand", "color"], (
        "aspect names inferred from list<string> columns"
    )
    only = Catalog.read(tmp_path, aspect_names=["brand"])
    assert only.products[0].aspects == {"brand": ["north peak"]}, "aspect_names selects the aspect columns"


def test_on_disk_layout(tmp_path):
    tiny_catalog().write(tmp_path)
    schema = pq.read_schema(tmp_path / "products.parquet")
    assert schema.field("color").type == pa.list_(pa.string()), "one list<string> column per aspect"
    assert pq.read_table(tmp_path / "products.parquet").column("color").to_pylist()[1] == [], "missing = []"
    assert pa.types.is_integer(pq.read_schema(tmp_path / "judgments.parquet").field("relevance").type)


def _rewrite(path, column, values, dtype=None):
    table = pq.read_table(path)
    i = table.schema.get_field_index(column)
    arr = pa.array(values, dtype if dtype is not None else table.schema.field(column).type)
    pq.write_table(table.set_column(i, pa.field(column, arr.type), arr), path)


@pytest.mark.parametrize(
    "file, column, values, dtype, expected",
    [
        (
            "products.parquet",
            "title",
            ["a", "  ", "c"],
            None,
            ["products.parquet", "row 1", "'title'", "empty"],
        ),
        (
            "queries.parquet",
            "text",
            ["black sneakers", ""],
            None,
            ["queries.parquet", "row 1", "'text'", "empty"],
        ),
        ("queries.parquet", "split", ["train", "valid"], None, ["queries.parquet", "row 1", "'split'"]),
        (
            "judgments.parquet",
            "relevance",
            [4, 1, 0, 7, 0],
            None,
            ["judgments.parquet", "row 3", "'relevance'"],
        ),
        (
            "judgments.parquet",
            "esci",
            ["E", "X", "I", "E", "I"],
            None,
            ["judgments.parquet", "row 1", "'esci'"],
        ),
        (
            "judgments.parquet",
            "product_id",
            ["P1", "P2", "P3", "P3", "P9"],
            None,
            ["judgments.parquet", "row 4", "'product_id'", "P9"],
        ),
        (
            "judgments.parquet",
            "query_id",
            ["Q1", "Q1", "Q5", "Q2", "Q2"],
            None,
            ["judgments.parquet", "row 2", "'query_id'", "Q5"],
        ),
        (
            "products.parquet",
            "product_id",
            ["P1", "P2", "P1"],
            None,
            ["products.parquet", "row 2", "duplicate"],
        ),
        (
            "products.parquet",
            "color",
            [["black"], None, [""]],
            None,
            ["products.parquet", "row 2", "'color'"],
        ),
        (
            "judgments.parquet",
            "relevance",
            [4.0, 1.0, 0.0, 3.0, 0.0],
            pa.float64(),
            ["judgments.parquet", "'relevance'", "double", "integer"],
        ),
        (
            "products.parquet",
            "brand",
            ["x", "y", "z"],
            pa.string(),
            ["products.parquet", "'brand'", "list<string>"],
        ),
    ],
)
def test_validation_names_file_row_field(tmp_path, file, column, values, dtype, expected):
    tiny_catalog().write(tmp_path)
    _rewrite(tmp_path / file, column, values, dtype)
    with pytest.raises(ValueError) as err:
        Catalog.read(tmp_path, aspect_names=["category", "brand", "color"])
    for part in expected:
        assert part in str(err.value), f"error {err.value!r} should mention {part!r}"


def test_missing_column_and_file(tmp_path):
    tiny_catalog().write(tmp_path)
    table = pq.read_table(tmp_path / "queries.parquet")
    pq.write_table(table.drop_columns(["brand"]), tmp_path / "queries.parquet")
    with pytest.raises(ValueError, match=r"queries\.parquet.*missing column 'brand'"):
        Catalog.read(tmp_path)
    (tmp_path / "judgments.parquet").unlink()
    with pytest.raises(ValueError, match="judgments.parquet"):
        Catalog.read(tmp_path, aspect_names=["category"])


def test_write_refuses_invalid(tmp_path):
    cat = tiny_catalog()
    cat.judgments.append(Judgment("Q2", "P3", 2, "S"))
    with pytest.raises(ValueError, match=r"judgments\.parquet: row 5: field 'product_id': duplicate"):
        cat.write(tmp_path)
    assert not (tmp_path / "products.parquet").exists(), "nothing is written for an invalid catalog"


def test_helpers():
    cat = tiny_catalog()
    assert cat.qrels("train") == {"Q1": {"P1": 4, "P2": 1, "P3": 0}}, "qrels keep every judgment, 0 included"
    assert cat.qrels("dev") == {}
    assert [q.query_id for q in cat.queries_in("test")] == ["Q2"]
    pairs = cat.positives("train")
    assert [(q.query_id, p.product_id) for q, p in pairs] == [("Q1", "P1")], "relevance >= 3 only"
    assert [(q.query_id, p.product_id) for q, p in cat.positives("train", min_relevance=1)] == [
        ("Q1", "P1"),
        ("Q1", "P2"),
    ]
    assert Catalog.product_text(cat.products[0]) == "North Peak running shoes black Light shoes."
    assert Catalog.product_text(cat.products[1]) == "Wool socks", "no trailing space for an empty description"
    assert cat.aspect_coverage("doc") == {"category": 1.0, "brand": 1 / 3, "color": 2 / 3}
    with pytest.raises(ValueError, match="split"):
        cat.queries_in("validation")
