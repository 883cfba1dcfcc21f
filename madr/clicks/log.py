"""Reading a click log in one process: files -> validated events (bad rows quarantined) -> impressions.

`read_click_log(events, fmt, queries=...)` validates every row of the event files (and of UBI's queries files)
with `madr.clicks.events`' normalisers through `madr.data.validation` (the quarantine layout of `pipelines.data`:
file, row, reason, field, raw), groups the events by search and collapses each (`madr.clicks.collapse`). Files are
JSONL (`.jsonl` / `.json` / `.ndjson`, optionally `.gz`; 1-based line numbers, a UTF-8 BOM dropped) or Parquet
(0-based row numbers), local paths, pyarrow URIs or directories of them. `ClickLog.write` writes the impressions
Parquet, the quarantine (`events/` for bad rows, `searches/` for events no search could place) and `summary.json`.
`pipelines.data.click_log` does the same on Ray Data, streaming; the two agree row for row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from madr.clicks.collapse import (
    COUNT_KEYS,
    IMPRESSION_SCHEMA,
    Collapsed,
    check_position_base,
    collapse_events,
)
from madr.clicks.events import NORMALIZERS
from madr.data import quarantine
from madr.data.line_files import FileResult, open_file, summarize, validate_file, write_quarantine
from madr.data.validation import validate_rows

MAX_CHARS = 10_000
PARQUET_BATCH = 10_000
LINE_SUFFIXES = (".jsonl", ".json", ".ndjson")
EVENTS_DIR, SEARCHES_DIR, SUMMARY = "events", "searches", "summary.json"


def file_format(path: str) -> str:
    """'parquet' or 'jsonl' from a file name (compression suffixes ignored); anything else is an error."""
    name = path.lower()
    for suffix in (".gz", ".bz2", ".zst"):
        name = name.removesuffix(suffix)
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(LINE_SUFFIXES):
        return "jsonl"
    raise ValueError(f"{path}: a click log file must be .parquet or .jsonl (.json, .ndjson)")


def list_files(paths: str | Sequence[str], filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The files of `paths` (a directory stands for its .parquet / .jsonl files, sorted)."""
    out: list[str] = []
    for path in [paths] if isinstance(paths, str) else list(paths):
        fs, resolved = quarantine.resolve(path, filesystem)
        info = fs.get_file_info(resolved)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{path}: click log file not found")
        if info.type == pafs.FileType.Directory:
            found = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(resolved, recursive=False))
                           if i.is_file and not i.base_name.startswith((".", "_")))
            prefix = path.split("://", 1)[0] + "://" if "://" in path else ""
            out += [prefix + f for f in found if _is_log_file(f)]
        else:
            out.append(path)
    if not out:
        raise FileNotFoundError(f"{paths}: no .parquet or .jsonl click log files")
    return out


def _is_log_file(path: str) -> bool:
    try:
        file_format(path)
        return True
    except ValueError:
        return False


def validate_parquet(uri: str, source: str, filesystem: pafs.FileSystem | None = None,
                     strict: bool = False) -> FileResult:
    """Every row of one Parquet file through `source`'s normaliser (0-based row numbers)."""
    fs, path = open_file(uri, filesystem)
    result = FileResult(uri, first_row=0)
    start = 0
    with fs.open_input_file(path) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=PARQUET_BATCH):
            rows = batch.to_pylist()
            result.extend(validate_rows(NORMALIZERS[source], None, uri, rows, range(start, start + len(rows)),
                                        "parquet", (), MAX_CHARS, source, strict))
            start += len(rows)
    return result


def validate_events(uri: str, source: str, filesystem: pafs.FileSystem | None = None,
                    strict: bool = False) -> FileResult:
    """One event file validated by `source`'s normaliser (`madr.clicks.events.NORMALIZERS`)."""
    if file_format(uri) == "parquet":
        return validate_parquet(uri, source, filesystem, strict)
    return validate_file(uri, NORMALIZERS[source], fmt="jsonl", max_chars=MAX_CHARS, source=source,
                         filesystem=filesystem, strict=strict)


def with_origin(result: FileResult) -> list[dict[str, Any]]:
    """A file's good events with their origin (`_file`, `_row`), what the collapse step names in its errors."""
    return [{**e, "_file": result.file, "_row": row} for e, row in zip(result.good, result.good_rows, strict=True)]


@dataclass
class ClickLog:
    """A click log read: its impressions, the per-file validation results and the collapse counts."""

    impressions: pa.Table
    files: list[FileResult]
    collapsed: Collapsed = field(default_factory=Collapsed)

    def summary(self) -> dict[str, Any]:
        """Rows read / good / skipped / quarantined per reason and file, and the searches' counts."""
        ingest = summarize(self.files, "click_log").to_dict()
        return {"events": ingest, "searches": {k: int(self.collapsed.counts.get(k, 0)) for k in COUNT_KEYS},
                "sessions": len(set(self.impressions.column("session_id").to_pylist()) - {""})}

    def write(self, out_dir: str | Path, quarantine_dir: str | Path) -> dict[str, Any]:
        """`impressions/part-00000.parquet` under `out_dir`, the quarantine under `quarantine_dir`; returns the summary."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "impressions").mkdir(exist_ok=True)
        for old in (out / "impressions").glob("part-*.parquet"):
            old.unlink()
        pq.write_table(self.impressions, out / "impressions" / "part-00000.parquet")
        write_quarantine(str(Path(quarantine_dir) / EVENTS_DIR), self.files, "click_log")
        write_search_quarantine(str(Path(quarantine_dir) / SEARCHES_DIR), self.collapsed.bad)
        summary = self.summary()
        (out / SUMMARY).write_text(json.dumps(summary, indent=1))
        return summary



def write_search_quarantine(directory: str, bad: list[dict[str, Any]]) -> None:
    """The events the collapse step could not place (quarantine layout, one file)."""
    quarantine.clear(directory)
    if bad:
        fs, base = quarantine.resolve(directory)
        fs.create_dir(f"{base}/{quarantine.ROWS_DIR}", recursive=True)
        table = pa.Table.from_pylist(bad, schema=quarantine.QUARANTINE_SCHEMA)
        pq.write_table(table, f"{base}/{quarantine.ROWS_DIR}/searches.parquet", filesystem=fs)


def impressions_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Impression rows in `IMPRESSION_SCHEMA`, sorted by (search, position, document)."""
    rows = sorted(rows, key=lambda d: (d["search_id"], d["position"], d["doc_id"]))
    return pa.Table.from_pylist(rows, schema=IMPRESSION_SCHEMA)


def read_click_log(events: str | Sequence[str], fmt: str, queries: str | Sequence[str] | None = None, *,
                   position_base: str | int = "auto", filesystem: pafs.FileSystem | None = None,
                   strict: bool = False) -> ClickLog:
    """Read a click log in `fmt` "ubi" (event files + optional queries files) or "impressions" (module docstring).
    `strict` raises StrictModeError at the first bad row (naming its file, row and field)."""
    if fmt not in ("ubi", "impressions"):
        raise ValueError(f"click log format must be 'ubi' or 'impressions', got {fmt!r}")
    if queries and fmt != "ubi":
        raise ValueError("a queries file belongs to a UBI log (format: ubi)")
    check_position_base(position_base)
    source = "ubi_events" if fmt == "ubi" else "impressions"
    files = [validate_events(p, source, filesystem, strict) for p in list_files(events, filesystem)]
    if queries:
        files += [validate_events(p, "ubi_queries", filesystem, strict) for p in list_files(queries, filesystem)]
    rows = [e for r in files for e in with_origin(r)]
    collapsed = collapse_events(rows, position_base)
    return ClickLog(impressions_table(collapsed.impressions), files, collapsed)
