"""Small tables of the evaluation and mining jobs: queries and qrels / positives (Parquet or JSONL).

Queries: ``query_id`` + ``text``; qrels: ``query_id``, ``doc_id`` (an index id, or a display key such as a
product id when the job maps ids through the index's docs table) and ``relevance`` (optional: 1).
Errors name the file, the row (JSONL: line number, Parquet: 0-based row) and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from madr.metrics import Qrels


def read_table(path: str | Path, required: list[str]) -> pa.Table:
    """A Parquet file / directory or a JSONL file as an Arrow table with the ``required`` columns."""
    path = Path(path)
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        rows = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: row {n}: not valid JSON ({e})") from None
                missing = [c for c in required if c not in rows[-1]]
                if missing:
                    raise ValueError(f"{path}: row {n}, field {missing[0]!r}: missing")
        table = pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in required})
    else:
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid) as e:
            raise ValueError(f"{path}: cannot read ({e})") from None
        missing = [c for c in required if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: no column(s) {missing} (columns: {table.column_names})")
    for c in required:
        col = table.column(c)
        if col.null_count:
            row = col.to_pylist().index(None)
            raise ValueError(f"{path}: row {row}, field {c!r}: missing value")
    return table


def read_queries(path: str | Path, id_column: str = "query_id", text_column: str = "text") -> pa.Table:
    """(query_id: string, text: string) in file order; duplicate query ids are an error."""
    t = read_table(path, [id_column, text_column])
    ids = [str(x) for x in t.column(id_column).to_pylist()]
    seen: set[str] = set()
    for row, qid in enumerate(ids):
        if qid in seen:
            raise ValueError(f"{path}: row {row}, field {id_column!r}: duplicate query id {qid!r}")
        seen.add(qid)
    return pa.table({"query_id": ids, "text": [str(x) for x in t.column(text_column).to_pylist()]})


def read_qrels(path: str | Path, doc_column: str = "doc_id", relevance_column: str = "relevance") -> Qrels:
    """query id -> doc key (string) -> relevance."""
    t = read_table(path, ["query_id", doc_column])
    rels = t.column(relevance_column).to_pylist() if relevance_column in t.column_names else [1.0] * t.num_rows
    qrels: Qrels = {}
    for row, (q, d, r) in enumerate(zip(t.column("query_id").to_pylist(), t.column(doc_column).to_pylist(), rels,
                                        strict=True)):
        if r is None:
            raise ValueError(f"{path}: row {row}, field {relevance_column!r}: missing value")
        qrels.setdefault(str(q), {})[str(d)] = float(r)
    return qrels
