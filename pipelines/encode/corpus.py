"""The corpus side of the encode job: plan the input into pieces and shards, and read a piece.

Planning (driver, cheap): list the input files (local paths or pyarrow-filesystem URIs, directories
expanded, sorted), count each file's rows (Parquet: footer metadata; JSONL: one pass counting newlines
that also records the byte offset of every ``rows_per_read``-th line), and cut every file into pieces
of at most ``rows_per_read`` rows. Pieces are numbered in input order; contiguous runs of pieces form
the shards (balanced by rows). The plan is therefore a pure function of the input files and the
configuration, so a re-run finds the same shards and can skip the complete ones without reading them.

Reading (Ray read task): one piece -> an Arrow table with ``_shard``, ``_pos`` (global row position),
``_piece``, ``doc_id`` (int64), ``text`` (the text columns joined by a space) and the display columns. A bad row
raises a ValueError naming the file, the row (JSONL: 1-based line number; Parquet: 0-based row index)
and the field.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from madr.data.quarantine import resolve

_EXTENSIONS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of one file (JSONL: ``byte_start``/``byte_end`` locate them), the shard they
    belong to and the global position of their first row."""

    index: int
    uri: str
    fmt: str
    start: int
    stop: int
    shard: int
    first_pos: int
    byte_start: int = 0
    byte_end: int = -1

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass
class CorpusPlan:
    """Pieces in input order, their shard assignment and per-shard row counts."""

    pieces: list[Piece]
    shard_rows: list[int]
    files: list[dict[str, Any]]

    @property
    def num_rows(self) -> int:
        return sum(self.shard_rows)

    @property
    def num_shards(self) -> int:
        return len(self.shard_rows)

    def pieces_of(self, shards: Sequence[int]) -> list[Piece]:
        wanted = set(shards)
        return [p for p in self.pieces if p.shard in wanted]

    def fingerprint(self) -> str:
        """A hash of the files (uri, size, rows) and the cut: changes whenever the plan would."""
        blob = json.dumps({"files": self.files, "pieces": [asdict(p) for p in self.pieces]}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def detect_format(uri: str, given: str | None) -> str:
    if given:
        return given
    fmt = _EXTENSIONS.get(os.path.splitext(uri.lower())[1])
    if fmt is None:
        raise ValueError(f"{uri}: unknown corpus format (use .parquet or .jsonl, or set format)")
    return fmt


def list_files(inputs: Sequence[str], fmt: str | None = None) -> list[tuple[str, str]]:
    """(uri, format) of every input file; directories give their .parquet/.jsonl files, sorted."""
    out: list[tuple[str, str]] = []
    for uri in inputs:
        fs, path = resolve(uri)
        info = fs.get_file_info(path)
        prefix = uri.split("://", 1)[0] + "://" if "://" in uri else ""
        if info.type == pafs.FileType.NotFound:
            raise ValueError(f"{uri}: no such file or directory")
        if info.type == pafs.FileType.File:
            out.append((uri, detect_format(uri, fmt)))
            continue
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File
                       and not os.path.basename(i.path).startswith((".", "_"))
                       and (fmt or _EXTENSIONS.get(os.path.splitext(i.path.lower())[1])))
        if not files:
            raise ValueError(f"{uri}: directory holds no .parquet / .jsonl files")
        out.extend((prefix + f, detect_format(f, fmt)) for f in files)
    return out


def _parquet_rows(uri: str) -> int:
    fs, path = resolve(uri)
    with fs.open_input_file(path) as f:
        return pq.ParquetFile(f).metadata.num_rows


def _jsonl_offsets(uri: str, step: int) -> tuple[int, list[int], int]:
    """(rows, byte offset of rows 0, step, 2*step, ..., file size). A final line without a newline counts."""
    fs, path = resolve(uri)
    offsets, rows, pos, last = [0], 0, 0, b"\n"
    with fs.open_input_stream(path) as f:
        while chunk := f.read(_CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
            line_no = rows + np.arange(1, nl.size + 1)  # rows completed after each newline
            offsets.extend((pos + nl[line_no % step == 0] + 1).tolist())
            rows += nl.size
            pos += len(chunk)
            last = chunk[-1:]
    if pos and last != b"\n":
        rows += 1
    if offsets[-1] == pos and len(offsets) > 1 and rows % step == 0:
        offsets.pop()  # the file ends exactly at a piece boundary
    return rows, offsets + [pos], pos


def _file_pieces(uri: str, fmt: str, step: int) -> tuple[list[tuple[int, int, int, int]], dict[str, Any]]:
    """[(start, stop, byte_start, byte_end)] of one file and its fingerprint entry."""
    if fmt == "parquet":
        rows = _parquet_rows(uri)
        cuts = [(s, min(s + step, rows), 0, -1) for s in range(0, rows, step)]
        return cuts, {"uri": uri, "rows": rows}
    rows, offsets, size = _jsonl_offsets(uri, step)
    cuts = [(i * step, min((i + 1) * step, rows), offsets[i], offsets[i + 1]) for i in range((rows + step - 1) // step)]
    return cuts, {"uri": uri, "rows": rows, "bytes": size}


def plan_corpus(inputs: Sequence[str], num_shards: int | None = None, max_docs_per_shard: int | None = None,
                rows_per_read: int = 4096, fmt: str | None = None) -> CorpusPlan:
    """Cut the corpus into pieces and contiguous, row-balanced shards (module docstring)."""
    cuts: list[tuple[str, str, int, int, int, int]] = []
    files = []
    for uri, f in list_files(inputs, fmt):
        pieces, entry = _file_pieces(uri, f, rows_per_read)
        files.append(entry)
        cuts.extend((uri, f, *p) for p in pieces)
    total = sum(c[3] - c[2] for c in cuts)
    if total == 0:
        raise ValueError(f"the corpus {list(inputs)} has no rows")
    if num_shards is None:
        num_shards = -(-total // max_docs_per_shard)
    if num_shards > len(cuts):
        raise ValueError(f"{num_shards} shards but the corpus has only {len(cuts)} pieces of <= {rows_per_read} "
                         f"rows; lower num_shards or rows_per_read")
    sizes = np.array([c[3] - c[2] for c in cuts])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    shard_of = np.minimum(((starts + sizes / 2) * num_shards // total).astype(int), num_shards - 1)
    shard_of = _every_shard_used(shard_of, num_shards)
    pieces = [Piece(i, uri, f, s, e, int(sh), int(pos), b0, b1)
              for i, ((uri, f, s, e, b0, b1), sh, pos) in enumerate(zip(cuts, shard_of, starts, strict=True))]
    shard_rows = np.bincount(shard_of, weights=sizes, minlength=num_shards).astype(int).tolist()
    return CorpusPlan(pieces, shard_rows, files)


def _every_shard_used(shard_of: np.ndarray, n: int) -> np.ndarray:
    """Make the (non-decreasing) assignment use every shard: with few, uneven pieces spread them evenly."""
    if np.unique(shard_of).size == n:
        return shard_of
    return (np.arange(shard_of.size) * n // shard_of.size).astype(int)


# ---- reading ---------------------------------------------------------------------------------------------

def _read_parquet_piece(piece: Piece, columns: list[str]) -> pa.Table:
    fs, path = resolve(piece.uri)
    with fs.open_input_file(path) as f:
        pf = pq.ParquetFile(f)
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise ValueError(f"{piece.uri}: no column(s) {missing} (columns: {pf.schema_arrow.names})")
        meta, groups, first, row = pf.metadata, [], None, 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if row < piece.stop and row + n > piece.start:
                groups.append(g)
                first = row if first is None else first
            row += n
        table = pf.read_row_groups(groups, columns=columns)
    return table.slice(piece.start - first, piece.rows)


def _read_jsonl_piece(piece: Piece, columns: list[str]) -> pa.Table:
    fs, path = resolve(piece.uri)
    with fs.open_input_file(path) as f:
        f.seek(piece.byte_start)
        data = f.read(piece.byte_end - piece.byte_start)
    try:
        table = pajson.read_json(io.BytesIO(data))
        if table.num_rows != piece.rows:
            raise pa.ArrowInvalid("row count differs")
    except pa.ArrowInvalid:
        table = _parse_lines(piece, data)
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        row = piece.start + 1
        raise ValueError(f"{piece.uri}: row {row}: no field(s) {missing} (fields: {table.column_names})")
    return table.select(columns)


def _parse_lines(piece: Piece, data: bytes) -> pa.Table:
    """Line-by-line parse, to name the first bad line (1-based line number)."""
    rows = []
    for i, line in enumerate(data.split(b"\n")[: piece.rows]):
        where = f"{piece.uri}: row {piece.start + i + 1}"
        if not line.strip():
            raise ValueError(f"{where}: empty line")
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{where}: not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: a JSON object is expected, got {type(obj).__name__}")
        rows.append(obj)
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise _type_clash(piece, rows) or ValueError(f"{piece.uri}: rows {piece.start + 1}-{piece.stop}: "
                                                     f"inconsistent field types ({e})") from None


def _type_clash(piece: Piece, rows: list[dict[str, Any]]) -> ValueError | None:
    """The first row whose field has another JSON type than the field's first value."""
    first: dict[str, type] = {}
    for i, row in enumerate(rows):
        for name, value in row.items():
            if value is None:
                continue
            kind = first.setdefault(name, type(value))
            if type(value) is not kind and {type(value), kind} != {int, float}:
                return ValueError(f"{piece.uri}: row {piece.start + i + 1}, field {name!r}: value {value!r} is a "
                                  f"{type(value).__name__}, earlier rows have {kind.__name__}")
    return None


def _row_label(piece: Piece, i: int) -> str:
    return f"row {piece.start + i + (1 if piece.fmt == 'jsonl' else 0)}"


def _ids(piece: Piece, column: pa.ChunkedArray, name: str) -> pa.Array:
    if not pa.types.is_integer(column.type):
        raise ValueError(f"{piece.uri}: {_row_label(piece, 0)}, field {name!r}: ids must be integers, "
                         f"got type {column.type}")
    if column.null_count:
        i = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{piece.uri}: {_row_label(piece, i)}, field {name!r}: missing id")
    ids = column.cast(pa.int64()).to_numpy()
    if ids.size and ids.min() < 0:
        i = int(np.flatnonzero(ids < 0)[0])
        raise ValueError(f"{piece.uri}: {_row_label(piece, i)}, field {name!r}: id {int(ids[i])} is negative")
    return pa.array(ids, pa.int64())


def _text(piece: Piece, table: pa.Table, columns: list[str]) -> pa.Array:
    parts = []
    for c in columns:
        col = table.column(c)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)):
            raise ValueError(f"{piece.uri}: {_row_label(piece, 0)}, field {c!r}: text must be a string, "
                             f"got type {col.type}")
        parts.append(col.cast(pa.string()))
    empty = np.ones(table.num_rows, bool)
    for p in parts:
        empty &= p.is_null().to_numpy(zero_copy_only=False)
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(f"{piece.uri}: {_row_label(piece, i)}, field {columns[0]!r}: no text in any of {columns}")
    filled = [pc.fill_null(p, "") for p in parts]
    joined = filled[0] if len(filled) == 1 else pc.binary_join_element_wise(*filled, " ")
    return pc.utf8_trim_whitespace(joined).combine_chunks()


def read_piece(piece: Piece, id_column: str, text_columns: list[str], docs_columns: list[str]) -> pa.Table:
    """One piece as ``_shard, _pos, doc_id, text, <docs columns>`` (module docstring)."""
    columns = list(dict.fromkeys([id_column, *text_columns, *docs_columns]))
    table = (_read_parquet_piece if piece.fmt == "parquet" else _read_jsonl_piece)(piece, columns)
    if table.num_rows != piece.rows:
        raise ValueError(f"{piece.uri}: expected rows {piece.start}-{piece.stop} ({piece.rows}), read "
                         f"{table.num_rows}; the file changed since the job was planned")
    out = {"_shard": pa.array(np.full(piece.rows, piece.shard, np.int32)),
           "_piece": pa.array(np.full(piece.rows, piece.index, np.int32)),
           "_pos": pa.array(np.arange(piece.first_pos, piece.first_pos + piece.rows, dtype=np.int64)),
           "doc_id": _ids(piece, table.column(id_column), id_column),
           "text": _text(piece, table, text_columns)}
    for c in docs_columns:
        out[f"doc.{c}"] = table.column(c).combine_chunks()
    return pa.table(out)
