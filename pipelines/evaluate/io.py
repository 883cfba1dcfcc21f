"""Small tables of the evaluation and mining jobs: queries and qrels / positives (Parquet or JSONL), and the
public layouts the evaluation also reads: a BEIR directory's split, BEIR TSV or TREC qrels files.

Queries: ``query_id`` + ``text``; qrels: ``query_id``, ``doc_id`` (an index id, or a display key such as a
product id when the job maps ids through the index's docs table) and ``relevance`` (optional: 1).
Errors name the file, the row (JSONL: line number, Parquet: 0-based row) and the field.
BEIR and TREC inputs are validated like every ingested source (`madr.data.beir`, `madr.data.trec`): bad
lines and judgments naming unknown queries (or, with a BEIR corpus, unknown documents) are counted and
written to a quarantine directory (file, line, field, reason), not raised.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from madr.data.beir import read_beir
from madr.data.line_files import write_quarantine
from madr.data.quarantine import IngestSummary, check_files_have_good_rows
from madr.data.trec import qrels_of, unknown_id
from madr.data.trec import read_qrels as read_text_qrels
from madr.metrics import Qrels

TABLE_SUFFIXES = (".parquet", ".jsonl", ".json", ".ndjson")  # other qrels files are BEIR TSV or TREC text


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


def is_text_qrels(path: str) -> bool:
    """A qrels file in a text layout (BEIR TSV or TREC): a file whose name is not a Parquet / JSONL one."""
    if "://" not in path and Path(path).is_dir():
        return False
    name = PurePosixPath(path.split("://", 1)[-1]).name
    return not name.endswith(TABLE_SUFFIXES)


def read_text_qrels_for(path: str, queries: pa.Table, quarantine_dir: str) -> tuple[Qrels, IngestSummary]:
    """A BEIR TSV or TREC qrels file whose judgments must name queries of ``queries``; the others are
    quarantined (their documents are not checked: a judged document missing from the index counts as
    a relevant document never retrieved, as trec_eval counts it)."""
    known = set(queries.column("query_id").to_pylist())

    def check(query_id: str, doc_id: str, relevance: int, f: Any) -> dict[str, Any]:
        if query_id not in known:
            raise unknown_id("query-id" if "query-id" in f.row else "qid", "query", query_id, "the queries file")
        return {"query_id": query_id, "doc_id": doc_id, "relevance": relevance}

    result = read_text_qrels(path, check, source="qrels")
    summary = write_quarantine(quarantine_dir, [result], "qrels")
    check_files_have_good_rows(summary, quarantine_dir)
    return qrels_of(result), summary


def read_beir_split(directory: str, split: str, quarantine_dir: str,
                    qrels: str | None = None) -> tuple[pa.Table, Qrels, IngestSummary]:
    """The judged queries (query_id, text) and the qrels of one split of a BEIR directory (``qrels``: a BEIR
    TSV or TREC file instead of ``qrels/<split>.tsv``); what validation rejected goes to ``quarantine_dir``."""
    read = read_beir(directory, qrels={split: qrels} if qrels else None, splits=[split])
    summary = read.write_quarantine(quarantine_dir)
    judged = read.catalog.queries_in(split)
    table = pa.table({"query_id": pa.array([q.query_id for q in judged], pa.string()),
                      "text": pa.array([q.text for q in judged], pa.string())})
    return table, {q: {d: float(r) for d, r in docs.items()} for q, docs in read.catalog.qrels(split).items()}, summary
