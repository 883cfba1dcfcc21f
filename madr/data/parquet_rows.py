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
