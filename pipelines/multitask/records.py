"""madr records <-> Arrow rows of the task schemas of `pipelines.data.sources` (`TASK_SCHEMAS`).

The data stage writes each task's records as Parquet in its normalised task schema (the one the readers of
`pipelines.data` produce); a train worker turns each mixed batch's numpy columns back into records for the
task's `make_batch` (paper 004 Sec. III: every batch holds one task's records). The multi-task recipe names
its tasks click / nli / translation; the translation task's rows are in the `parallel` schema.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from pipelines.data.sources import TASK_SCHEMAS, to_record

SCHEMA_OF = {"click": "click", "nli": "nli", "translation": "parallel"}


def records_table(records: Sequence[Any], task: str) -> pa.Table:
    """`records` (dataclasses of `madr.data.records`) as an Arrow table in `task`'s schema."""
    schema = TASK_SCHEMAS[SCHEMA_OF[task]]
    rows = []
    for r in records:
        row = dataclasses.asdict(r)
        for key in ("fields", "negatives"):
            if key in row:
                row[key] = list(row[key].items())
        rows.append({name: row.get(name) for name in schema.names})
    return pa.Table.from_pylist(rows, schema=schema)


def _plain(value: Any, kind: pa.DataType) -> Any:
    """A numpy cell -> the Python value the record field holds (null ints come back as NaN floats)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if pa.types.is_integer(kind) and value is not None:
        return int(value)
    return value


def columns_to_records(columns: Mapping[str, np.ndarray], task: str) -> list[Any]:
    """A batch's numpy columns (`Dataset.iter_batches(batch_format="numpy")`) -> `task`'s records."""
    schema = TASK_SCHEMAS[SCHEMA_OF[task]]
    n = len(next(iter(columns.values())))
    kinds = {name: schema.field(name).type for name in columns if name in schema.names}
    return [to_record({name: _plain(columns[name][i], kind) for name, kind in kinds.items()}, SCHEMA_OF[task])
            for i in range(n)]


def read_records(path: str, task: str) -> list[Any]:
    """The records of a Parquet file that `records_table(records, task)` wrote, in its row order."""
    import pyarrow.parquet as pq

    return [to_record(row, SCHEMA_OF[task]) for row in pq.read_table(path).to_pylist()]
