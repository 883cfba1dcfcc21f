"""TREC formats: qrels in (`qid 0 docid rel`), runs and qrels out (`qid Q0 docid rank score tag`), so that
trec_eval, ranx or pyserini can read what madr judged and retrieved.

Qrels files are read one line per judgment, whitespace-separated, without a header; the second column (the
TREC "iteration") is ignored. BEIR's `qrels/<split>.tsv` (`query-id corpus-id score` with that header line) is
the other qrels layout; `qrels_layout` tells them apart by the first line, and `read_qrels` reads either
through `madr.data.line_files` (bad lines counted and quarantined with their file, line and field).
A run file lists each query's documents in madr's ranking order (`madr.metrics.rank_documents`: score
descending, ties by doc id), rank from 1, the score written so that it reads back to the same float.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from madr.data.line_files import FileResult, first_line, open_file, validate_file
from madr.data.validation import BadRow, Fields
from madr.metrics import Qrels, Run, rank_documents

TREC_QRELS_COLUMNS = ("qid", "iteration", "docid", "rel")
BEIR_QRELS_HEADER = ("query-id", "corpus-id", "score")
_TAG = re.compile(r"^\S+$")

# normalise(query id, doc id, relevance, fields) -> the good row (or raise BadRow); the ids' column names
# are the layout's own, so quarantine rows name the field as the file does
JudgmentCheck = Callable[[str, str, int, Fields], dict[str, Any]]


def qrels_layout(uri: str, filesystem: pafs.FileSystem | None = None) -> str:
    """"beir" when the first line is BEIR's `query-id corpus-id score` header, else "trec"."""
    fs, path = open_file(uri, filesystem)
    cells = tuple(first_line(fs, path).split())
    return "beir" if cells == BEIR_QRELS_HEADER else "trec"


def read_qrels(uri: str, check: JudgmentCheck | None = None, *, filesystem: pafs.FileSystem | None = None,
               source: str = "qrels", display: str | None = None, strict: bool = False) -> FileResult:
    """Judgments of a BEIR qrels TSV or a TREC qrels file (`qrels_layout`): good rows are what `check`
    returns (default {query_id, doc_id, relevance}); a relevance that is not an integer is `wrong_type`."""
    layout = qrels_layout(uri, filesystem)
    names = BEIR_QRELS_HEADER if layout == "beir" else ("qid", "docid", "rel")
    check = check or (lambda q, d, r, f: {"query_id": q, "doc_id": d, "relevance": r})

    def normalize(f: Fields, _options: Any, _file: str) -> dict[str, Any]:
        query_id = f.ident((names[0],), required=True)
        doc_id = f.ident((names[1],), required=True)
        relevance = f.integer((names[2],), required=True)
        return check(query_id, doc_id, relevance, f)

    if layout == "beir":
        return validate_file(uri, normalize, fmt="tsv", header=BEIR_QRELS_HEADER, skip_header=True,
                             max_chars=1_000, source=source, filesystem=filesystem, display=display, strict=strict)
    return validate_file(uri, normalize, fmt="trec", header=TREC_QRELS_COLUMNS, max_chars=1_000, source=source,
                         filesystem=filesystem, display=display, strict=strict)


def qrels_of(result: FileResult) -> Qrels:
    """{query id: {doc id: relevance}} of the good rows of `read_qrels`."""
    qrels: Qrels = {}
    for row in result.good:
        qrels.setdefault(row["query_id"], {})[row["doc_id"]] = float(row["relevance"])
    return qrels


def unknown_id(field: str, kind: str, value: str, where: str) -> BadRow:
    return BadRow("unknown_id", field, f"{kind} {value!r} is not in {where}")


def check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise ValueError(f"a TREC run tag must be one word without whitespace, got {tag!r}")
    return tag


def format_run(run: Run, tag: str) -> str:
    """`qid Q0 docid rank score tag` lines: queries in id order, documents in madr's ranking order."""
    check_tag(tag)
    lines: list[str] = []
    for qid in sorted(run):
        docs = run[qid]
        lines.extend(f"{qid} Q0 {doc_id} {rank} {float(docs[doc_id])!r} {tag}"
                     for rank, doc_id in enumerate(rank_documents(docs), 1))
    return "\n".join(lines) + ("\n" if lines else "")


def write_run(path: str | Path, run: Run, tag: str) -> Path:
    """Write `run` as a TREC run file (`format_run`)."""
    _check_ids(run, "run")
    path = Path(path)
    path.write_text(format_run(run, tag), encoding="utf-8")
    return path


def write_qrels(path: str | Path, qrels: Mapping[str, Mapping[str, float]]) -> Path:
    """Write `qrels` as a TREC qrels file (`qid 0 docid rel`, integer grades as integers)."""
    _check_ids(qrels, "qrels")
    lines = []
    for qid in sorted(qrels):
        for doc_id in sorted(qrels[qid]):
            rel = qrels[qid][doc_id]
            lines.append(f"{qid} 0 {doc_id} {int(rel) if float(rel).is_integer() else rel}")
    path = Path(path)
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return path


def _check_ids(table: Mapping[str, Mapping[str, Any]], what: str) -> None:
    """TREC files are whitespace-separated: an id with whitespace would shift every column after it (each distinct
    id is checked once; the first query holding a bad one is named)."""
    ids: set[str] = set()
    for qid, docs in table.items():
        ids.add(str(qid))
        ids.update(map(str, docs))
    if all(_TAG.match(value) for value in ids):
        return
    for qid, docs in table.items():
        for value in (qid, *docs):
            if not _TAG.match(str(value)):
                raise ValueError(f"{what}: id {value!r} (query {qid!r}) is empty or holds whitespace; "
                                 "TREC files cannot hold it")
