"""Rows of a public dataset's Parquet file, with the errors naming the file (shared by the real-data loaders)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def read_rows(path: str | Path, columns: Sequence[str]) -> list[dict[str, Any]]:
    """`columns` of every row of `path` as dicts; a missing file or column is an error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found")
    table = pq.read_table(path)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; has {table.column_names}")
    return table.select(list(columns)).to_pylist()


def text_field(path: str | Path, i: int, row: dict[str, Any], name: str, required: bool = True) -> str:
    """Row `i`'s field `name` as stripped text; a non-text value, or an empty one when `required`, is an
    error naming the file, the row and the field."""
    value = row[name]
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{path}: row {i}: field {name!r} is a {type(value).__name__} ({value!r}), expected text")
    text = (value or "").strip()
    if required and not text:
        raise ValueError(f"{path}: row {i}: field {name!r} is empty")
    return text
