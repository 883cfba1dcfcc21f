"""Reading file parts in Ray read tasks: `RawFileDatasource` runs one read task per `FilePart`
(`pipelines.data.file_parts`); the task cuts its part into raw blocks of `rows_per_block` rows with `_file`
and `_row` (JSONL/TSV: the raw line bytes; Parquet: the file's columns) and passes each through an optional
`transform` in the same task (`pipelines.data.readers.IngestBlock`: validation, tokenisation).

Row numbers stay exact while streaming because a read task reads its part sequentially and counts lines
itself: JSONL/TSV rows are 1-based line numbers (the TSV header is line 1, as `sed -n Np` counts), Parquet
rows 0-based indices (a part knows its first row from the plan).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from pipelines.data.file_parts import BOM, CHUNK_BYTES, FilePart

ORIGIN_COLUMNS = ("_file", "_row")


def _origin(display: str, first_row: int, n: int) -> dict[str, pa.Array]:
    return {"_file": pa.array([display] * n, pa.string()),
            "_row": pa.array(np.arange(first_row, first_row + n, dtype=np.int64))}


def _read_lines(part: FilePart, rows_per_block: int) -> Iterator[pa.Table]:
    fs = part.filesystem
    if part.end is None:
        stream = fs.open_input_stream(part.path)  # decompresses .gz/.bz2/.zst by extension
        remaining = None
    else:
        stream = fs.open_input_file(part.path)
        stream.seek(part.start)
        remaining = part.end - part.start
    row, carry, pending, skip = part.first_row, b"", [], part.skip_header
    at_file_start = part.start == 0

    def block(lines: list[bytes]) -> pa.Table:
        return pa.table({**_origin(part.display, row, len(lines)), "_line": pa.array(lines, pa.binary())})

    with stream:
        while True:
            size = CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining)
            chunk = stream.read(size) if size > 0 else b""
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
            if at_file_start:  # editors on Windows write a BOM: it is not part of the first row
                chunk, at_file_start = chunk.removeprefix(BOM), False
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            pending.extend(lines)
            if skip and pending:
                pending.pop(0)
                row, skip = row + 1, False
            while len(pending) >= rows_per_block:
                yield block(pending[:rows_per_block])
                row += rows_per_block
                pending = pending[rows_per_block:]
    if carry:
        pending.append(carry)  # a last line without a trailing newline
    if skip and pending:
        pending.pop(0)
        row += 1
    if pending:
        yield block(pending)


def _read_parquet(part: FilePart, rows_per_block: int) -> Iterator[pa.Table]:
    pf = pq.ParquetFile(part.filesystem.open_input_file(part.path))
    row = part.first_row
    for batch in pf.iter_batches(batch_size=rows_per_block, row_groups=part.row_groups):
        table = pa.Table.from_batches([batch])
        for name, column in _origin(part.display, row, table.num_rows).items():
            table = table.append_column(name, column)
        row += table.num_rows
        yield table


BlockTransform = Callable[[pa.Table], pa.Table]


def read_part(part: FilePart, rows_per_block: int, transform: BlockTransform | None = None) -> Iterator[pa.Table]:
    reader = _read_parquet if part.fmt == "parquet" else _read_lines
    for raw in reader(part, rows_per_block):
        yield raw if transform is None else transform(raw)


class RawFileDatasource(Datasource):
    """One read task per `FilePart`; blocks of raw rows with `_file` and `_row` (their exact origin), or,
    with `transform`, what it makes of each raw block (run in the read task itself)."""

    def __init__(self, parts: Sequence[FilePart], rows_per_block: int = 10_000,
                 transform: BlockTransform | None = None) -> None:
        super().__init__()
        if rows_per_block < 1:
            raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
        self.parts = list(parts)
        self.rows_per_block = rows_per_block
        self.transform = transform

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(p.size for p in self.parts)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        return [ReadTask(partial(read_part, part, self.rows_per_block, self.transform),
                         BlockMetadata(num_rows=None, size_bytes=part.size, exec_stats=None,
                                       input_files=[part.display]))
                for part in self.parts]

    def get_name(self) -> str:
        return "ReadRawFiles"
