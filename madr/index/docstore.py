"""Display fields of indexed documents by global id: the ``docs.parquet`` an index manifest names.

The table has an int64 ``doc_id`` column (the ids of the FAISS / sparse shards) and any display columns
(title, text, external id, ...). ``DocStore`` reads it once, sorts by id, and answers batched look-ups
with a binary search; unknown ids and padding (-1) give None.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ID_COLUMN = "doc_id"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class DocStore:
    """In-memory id -> row look-up over a Parquet table with a unique int ``doc_id`` column."""

    def __init__(self, table: pa.Table, source: str = "<table>") -> None:
        if ID_COLUMN not in table.column_names:
            raise ValueError(f"{source}: no {ID_COLUMN!r} column (columns: {table.column_names})")
        ids = table.column(ID_COLUMN)
        if not pa.types.is_integer(ids.type):
            raise ValueError(f"{source}: column {ID_COLUMN!r} must be integers, got {ids.type}")
        if ids.null_count:
            row = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{source}: row {row}, field {ID_COLUMN!r}: null id")
        arr = ids.to_numpy().astype(np.int64)
        order = np.argsort(arr, kind="stable")
        sorted_ids = arr[order]
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if dup.size:
            raise ValueError(f"{source}: row {int(order[dup[0] + 1])}, field {ID_COLUMN!r}: duplicate id "
                             f"{int(sorted_ids[dup[0]])}")
        self.table, self.source = table, source
        self._ids, self._rows = sorted_ids, order

    @classmethod
    def open(cls, parquet_path: str | Path, columns: Sequence[str] | None = None) -> DocStore:
        """Read ``parquet_path`` (a file or a directory of files; optionally only ``columns``, ``doc_id`` is
        always read) into one contiguous chunk per column."""
        cols = None if columns is None else list(dict.fromkeys([ID_COLUMN, *columns]))
        try:
            table = pq.read_table(parquet_path, columns=cols)
        except (OSError, pa.ArrowInvalid) as e:
            raise ValueError(f"{parquet_path}: cannot read the document table ({e})") from None
        # one chunk per column: ``take`` of a few rows from a many-chunk table (one chunk per row group or
        # per shard file) costs a pass over the chunk list per call; a single chunk makes it a direct lookup
        return cls(table.combine_chunks(), str(parquet_path))

    def __len__(self) -> int:
        return int(self._ids.size)

    def rows_of(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Table rows of ``ids`` (-1 where the id is unknown or padding, or outside int64)."""
        if not isinstance(ids, np.ndarray):
            ids = [i if _INT64_MIN <= i <= _INT64_MAX else -1 for i in (int(i) for i in ids)]
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self._ids.size == 0:
            return np.full(ids.shape, -1, np.int64)
        pos = np.minimum(np.searchsorted(self._ids, ids), self._ids.size - 1)
        found = self._ids[pos] == ids
        return np.where(found, self._rows[pos], -1)

    def get(self, ids: Sequence[int] | np.ndarray) -> list[dict[str, Any] | None]:
        """One dict of the row's columns per id (in order), None for unknown ids and -1."""
        rows = self.rows_of(ids)
        found = rows >= 0
        picked = self.table.take(pa.array(rows[found])).to_pylist() if found.any() else []
        it = iter(picked)
        return [next(it) if f else None for f in found]
