"""The catalog schema shared by real and synthetic data: products, queries, graded judgments, aspects.

Paper 000 Sec. 8.1 / paper 001 Sec. 5.1: queries and items are annotated with multi-valued aspects
(category, brand, color); relevance is graded (paper 000: 0-4 with NDCG gain 2^rel - 1) or ESCI-labelled
(paper 001, MA-Amazon: Exact / Substitute / Complement / Irrelevant). Both are stored.

On disk a catalog is a directory of three parquet files:

- `products.parquet`: product_id, title, description (string) + one `list<string>` column per aspect;
- `queries.parquet`: query_id, text, split (train/dev/test), language (optional, default "en") + the same
  aspect columns (an empty list when the query does not mention the aspect);
- `judgments.parquet`: query_id, product_id (string), relevance (integer 0-4), esci (E/S/C/I).

`Catalog.read` checks columns and types, then every row; errors are `ValueError`s naming the file, the
row (0-based) and the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SPLITS = ("train", "dev", "test")
ESCI_LABELS = ("E", "S", "C", "I")
MIN_RELEVANCE, MAX_RELEVANCE = 0, 4
PRODUCTS_FILE, QUERIES_FILE, JUDGMENTS_FILE = "products.parquet", "queries.parquet", "judgments.parquet"
PRODUCT_COLUMNS = ("product_id", "title", "description")
QUERY_COLUMNS = ("query_id", "text", "split")
JUDGMENT_COLUMNS = ("query_id", "product_id", "relevance", "esci")
RESERVED_COLUMNS = frozenset(PRODUCT_COLUMNS + QUERY_COLUMNS + JUDGMENT_COLUMNS + ("language",))

Aspects = dict[str, list[str]]


@dataclass
class Product:
    product_id: str
    title: str
    description: str
    aspects: Aspects = field(default_factory=dict)


@dataclass
class Query:
    query_id: str
    text: str
    aspects: Aspects
    split: str
    language: str = "en"


@dataclass
class Judgment:
    query_id: str
    product_id: str
    relevance: int
    esci: str
    weight: float = 1.0  # a training weight (a click log's inverse-propensity weight); judged catalogs: 1


def _err(source: str, row: int, name: str, problem: str) -> ValueError:
    return ValueError(f"{source}: row {row}: field {name!r}: {problem}")


def _check_text(source: str, row: int, name: str, value: object, allow_empty: bool = False) -> None:
    if not isinstance(value, str):
        raise _err(source, row, name, f"must be a string, got {type(value).__name__} {value!r}")
    if not allow_empty and not value.strip():
        raise _err(source, row, name, "is empty")


def _check_aspects(source: str, row: int, aspects: object, names: Sequence[str]) -> None:
    if not isinstance(aspects, dict):
        raise _err(source, row, "aspects", f"must be a dict, got {type(aspects).__name__}")
    for name in names:
        values = aspects.get(name, [])
        if isinstance(values, str) or not isinstance(values, list | tuple):
            raise _err(
                source, row, name, f"must be a list of strings, got {type(values).__name__} {values!r}"
            )
        for v in values:
            if not isinstance(v, str) or not v.strip():
                raise _err(source, row, name, f"has an empty or non-string value {v!r}")


def _check_unique(source: str, row: int, name: str, value: str, seen: set[str]) -> None:
    if value in seen:
        raise _err(source, row, name, f"duplicate id {value!r}")
    seen.add(value)


# -- arrow columns ---------------------------------------------------------------------------------
def _is_string(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or getattr(pa.types, "is_string_view", lambda _: False)(t)
    )


def _is_string_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_string(t.value_type)


_TYPE_CHECKS = {"string": _is_string, "integer": pa.types.is_integer, "list<string>": _is_string_list,
                "float": pa.types.is_floating}


def _write_rows(path: Path, rows: Sequence[Any], columns: dict[str, pa.DataType],
                aspect_names: Sequence[str] = ()) -> None:
    """One parquet file of `rows`: a column per attribute named in `columns` (with its type), then a
    list<string> column per aspect of the rows' `aspects` (empty where a row has none)."""
    data = {name: pa.array([getattr(r, name) for r in rows], dtype) for name, dtype in columns.items()}
    data.update({a: pa.array([list(r.aspects.get(a, [])) for r in rows], pa.list_(pa.string()))
                 for a in aspect_names})
    pq.write_table(pa.table(data), path)


def _read_table(path: Path) -> pa.Table:
    """The parquet file `path`; a missing or unreadable file is a ValueError naming it."""
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path}: not a readable parquet file ({err})") from err


def _read_columns(
    path: Path, table: pa.Table, columns: dict[str, str], optional: dict[str, str] | None = None
) -> dict[str, list]:
    """`columns` (name -> "string" | "integer" | "list<string>") of `table` (read from `path`, which the
    errors name) as Python lists."""
    wanted = dict(columns)
    for name, kind in (optional or {}).items():
        if name in table.schema.names:
            wanted[name] = kind
    out = {}
    for name, kind in wanted.items():
        if name not in table.schema.names:
            raise ValueError(
                f"{path}: missing column {name!r} (field {name!r}, expected {kind}); "
                f"columns are {table.schema.names}"
            )
        dtype = table.schema.field(name).type
        if not _TYPE_CHECKS[kind](dtype):
            raise ValueError(f"{path}: column {name!r} (field {name!r}) has type {dtype}, expected {kind}")
        values = table.column(name).to_pylist()
        for row, v in enumerate(values):
            if v is None and kind != "list<string>":
                raise _err(str(path), row, name, "is null")
        out[name] = [[] if v is None else v for v in values] if kind == "list<string>" else values
    return out


def _infer_aspect_names(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if f.name not in RESERVED_COLUMNS and _is_string_list(f.type)]


@dataclass(repr=False)
class Catalog:
    """Products, queries (with their split), graded judgments and the names of the annotated aspects."""

    products: list[Product]
    queries: list[Query]
    judgments: list[Judgment]
    aspect_names: list[str]

    def __repr__(self) -> str:
        return (
            f"Catalog({len(self.products)} products, {len(self.queries)} queries, "
            f"{len(self.judgments)} judgments, aspects={self.aspect_names})"
        )

    # -- validation ------------------------------------------------------------------------------
    def validate(self, sources: dict[str, str] | None = None) -> Catalog:
        """Check every row; `sources` names the products / queries / judgments in error messages."""
        src = {
            "products": PRODUCTS_FILE,
            "queries": QUERIES_FILE,
            "judgments": JUDGMENTS_FILE,
            **(sources or {}),
        }
        self._validate_aspect_names()
        pids: set[str] = set()
        for row, p in enumerate(self.products):
            _check_text(src["products"], row, "product_id", p.product_id)
            _check_unique(src["products"], row, "product_id", p.product_id, pids)
            _check_text(src["products"], row, "title", p.title)
            _check_text(src["products"], row, "description", p.description, allow_empty=True)
            _check_aspects(src["products"], row, p.aspects, self.aspect_names)
        qids: set[str] = set()
        for row, q in enumerate(self.queries):
            _check_text(src["queries"], row, "query_id", q.query_id)
            _check_unique(src["queries"], row, "query_id", q.query_id, qids)
            _check_text(src["queries"], row, "text", q.text)
            if q.split not in SPLITS:
                raise _err(src["queries"], row, "split", f"{q.split!r} is not one of {SPLITS}")
            _check_text(src["queries"], row, "language", q.language)
            _check_aspects(src["queries"], row, q.aspects, self.aspect_names)
        pairs: set[tuple[str, str]] = set()
        for row, j in enumerate(self.judgments):
            self._validate_judgment(src["judgments"], row, j, qids, pids, pairs)
        return self

    def _validate_aspect_names(self) -> None:
        names = list(self.aspect_names)
        bad = [a for a in names if not isinstance(a, str) or not a or a in RESERVED_COLUMNS]
        if bad or len(set(names)) != len(names):
            raise ValueError(
                f"aspect_names must be unique, non-empty and not one of {sorted(RESERVED_COLUMNS)}; "
                f"got {names}"
            )

    @staticmethod
    def _validate_judgment(
        source: str, row: int, j: Judgment, qids: set[str], pids: set[str], pairs: set[tuple[str, str]]
    ) -> None:
        if j.query_id not in qids:
            raise _err(source, row, "query_id", f"unknown query id {j.query_id!r}")
        if j.product_id not in pids:
            raise _err(source, row, "product_id", f"unknown product id {j.product_id!r}")
        if isinstance(j.relevance, bool) or not isinstance(j.relevance, int):
            raise _err(source, row, "relevance", f"must be an integer, got {j.relevance!r}")
        if not MIN_RELEVANCE <= j.relevance <= MAX_RELEVANCE:
            raise _err(source, row, "relevance", f"{j.relevance} outside [{MIN_RELEVANCE}, {MAX_RELEVANCE}]")
        if not (isinstance(j.weight, float | int) and math.isfinite(j.weight) and j.weight > 0):
            raise _err(source, row, "weight", f"must be a finite number > 0, got {j.weight!r}")
        if j.esci not in ESCI_LABELS:
            raise _err(source, row, "esci", f"unknown ESCI label {j.esci!r}, expected one of {ESCI_LABELS}")
        if (j.query_id, j.product_id) in pairs:
            raise _err(
                source, row, "product_id", f"duplicate judgment for ({j.query_id!r}, {j.product_id!r})"
            )
        pairs.add((j.query_id, j.product_id))

    # -- disk ------------------------------------------------------------------------------------
    def write(self, directory: str | Path) -> Path:
        """Validate, then write the three parquet files into `directory` (created if needed)."""
        self.validate()
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        text = pa.string()
        _write_rows(out / PRODUCTS_FILE, self.products, {"product_id": text, "title": text, "description": text},
                    self.aspect_names)
        _write_rows(out / QUERIES_FILE, self.queries, {"query_id": text, "text": text, "split": text,
                                                       "language": text}, self.aspect_names)
        columns = {"query_id": text, "product_id": text, "relevance": pa.int8(), "esci": text}
        if any(j.weight != 1.0 for j in self.judgments):  # the optional column: judged catalogs stay as they were
            columns["weight"] = pa.float32()
        _write_rows(out / JUDGMENTS_FILE, self.judgments, columns)
        return out

    @classmethod
    def read(cls, directory: str | Path, aspect_names: Sequence[str] | None = None) -> Catalog:
        """Read and validate a catalog directory; `aspect_names=None` takes every `list<string>` column of
        products.parquet (other than the reserved ones) as an aspect."""
        d = Path(directory)
        if not d.is_dir():
            raise ValueError(f"{d}: catalog directory not found")
        files = {"products": d / PRODUCTS_FILE, "queries": d / QUERIES_FILE, "judgments": d / JUDGMENTS_FILE}
        product_table = _read_table(files["products"])
        names = list(aspect_names) if aspect_names is not None else _infer_aspect_names(product_table.schema)
        asp = dict.fromkeys(names, "list<string>")
        pc = _read_columns(
            files["products"], product_table,
            {"product_id": "string", "title": "string", "description": "string", **asp},
        )
        qc = _read_columns(
            files["queries"], _read_table(files["queries"]),
            {"query_id": "string", "text": "string", "split": "string", **asp},
            optional={"language": "string"},
        )
        jc = _read_columns(
            files["judgments"], _read_table(files["judgments"]),
            {"query_id": "string", "product_id": "string", "relevance": "integer", "esci": "string"},
            optional={"weight": "float"},
        )
        products = [
            Product(pid, t, desc, {a: list(pc[a][i]) for a in names})
            for i, (pid, t, desc) in enumerate(
                zip(pc["product_id"], pc["title"], pc["description"], strict=True)
            )
        ]
        languages = qc.get("language", ["en"] * len(qc["query_id"]))
        queries = [
            Query(qid, text, {a: list(qc[a][i]) for a in names}, split, lang)
            for i, (qid, text, split, lang) in enumerate(
                zip(qc["query_id"], qc["text"], qc["split"], languages, strict=True)
            )
        ]
        weights = jc.get("weight", [1.0] * len(jc["query_id"]))
        judgments = [
            Judgment(*row)
            for row in zip(jc["query_id"], jc["product_id"], jc["relevance"], jc["esci"], weights, strict=True)
        ]
        return cls(products, queries, judgments, names).validate({k: str(v) for k, v in files.items()})

    # -- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def product_text(p: Product) -> str:
        """The document text the towers encode: title + " " + description."""
        return f"{p.title} {p.description}".strip()

    def product_by_id(self) -> dict[str, Product]:
        return {p.product_id: p for p in self.products}

    def query_by_id(self) -> dict[str, Query]:
        return {q.query_id: q for q in self.queries}

    def queries_in(self, split: str) -> list[Query]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [q for q in self.queries if q.split == split]

    def qrels(self, split: str) -> dict[str, dict[str, int]]:
        """{query_id: {product_id: relevance}} for the judged queries of `split` (relevance 0 included)."""
        ids = {q.query_id for q in self.queries_in(split)}
        out: dict[str, dict[str, int]] = {}
        for j in self.judgments:
            if j.query_id in ids:
                out.setdefault(j.query_id, {})[j.product_id] = j.relevance
        return out

    def positives(self, split: str, min_relevance: int = 3) -> list[tuple[Query, Product]]:
        """(query, product) training pairs of `split` with relevance >= `min_relevance`, in judgment order."""
        queries = {q.query_id: q for q in self.queries_in(split)}
        products = self.product_by_id()
        return [
            (queries[j.query_id], products[j.product_id])
            for j in self.judgments
            if j.query_id in queries and j.relevance >= min_relevance
        ]

    def aspect_coverage(self, side: str) -> dict[str, float]:
        """Per aspect, the fraction of products (`side="doc"`) or queries (`side="query"`) annotated."""
        if side not in ("query", "doc"):
            raise ValueError(f"side must be 'query' or 'doc', got {side!r}")
        items = self.queries if side == "query" else self.products
        n = max(len(items), 1)
        return {a: sum(1 for x in items if x.aspects.get(a)) / n for a in self.aspect_names}
