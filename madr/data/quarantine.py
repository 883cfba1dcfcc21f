"""The quarantine: bad rows with their reason and origin, per-block counts, and the ingestion summary.

Each validated block writes, under the quarantine directory (a local path or an object-store URI):

- `rows/<key>.parquet`: its bad rows (only when it has some): source, file, row, line_format, reason,
  field, detail, raw (the raw line or row as text, truncated);
- `counts/<key>.json`: {file, first_row, rows, good, skipped: {reason: n}, quarantined: {reason: n}};
- `hashes/<key>.parquet`: a 64-bit hash of each good (normalised) row, from which `read_summary` counts
  duplicate rows (kept, not quarantined: a repeated pair may be deliberate, but it is reported).

`key` = hash of the file + the block's first row: blocks hold disjoint rows, so keys never collide within
a run, and a retried task that gets the same block overwrites its own files instead of counting twice
(Ray keeps block boundaries on a plain retry; `ingest` empties the directory before a run). `read_summary` folds the counts into an `IngestSummary` (rows = good + skipped +
quarantined, per reason and per file); `read_quarantine` reads the bad rows back as one Arrow table.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

QUARANTINE_SCHEMA = pa.schema([("source", pa.string()), ("file", pa.string()), ("row", pa.int64()),
                               ("line_format", pa.bool_()), ("reason", pa.string()), ("field", pa.string()),
                               ("detail", pa.string()), ("raw", pa.string())])
ROWS_DIR, COUNTS_DIR, HASHES_DIR, SUMMARY_FILE = "rows", "counts", "hashes", "summary.json"


def resolve(uri: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of a local path or an object-store URI (s3://, gs://, ...)."""
    if filesystem is not None:
        return filesystem, uri
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def block_key(file: str, first_row: int) -> str:
    return f"{hashlib.sha1(file.encode('utf-8')).hexdigest()[:16]}-{first_row:012d}"


def row_hashes(rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """A 64-bit hash of each row's content (key order ignored): equal rows, equal hashes."""
    digests = [hashlib.blake2b(json.dumps(r, sort_keys=True, default=str).encode("utf-8"), digest_size=8).digest()
               for r in rows]
    return np.frombuffer(b"".join(digests), dtype=np.uint64).copy()


def write_block(directory: str, key: str, counts: dict[str, Any], bad: list[dict[str, Any]],
                filesystem: pafs.FileSystem | None = None, hashes: np.ndarray | None = None) -> None:
    """Write one block's counts (always), bad rows (when any) and good-row hashes (when given)."""
    fs, base = resolve(directory, filesystem)
    if hashes is not None and len(hashes):
        fs.create_dir(f"{base}/{HASHES_DIR}", recursive=True)
        pq.write_table(pa.table({"hash": pa.array(hashes, pa.uint64())}), f"{base}/{HASHES_DIR}/{key}.parquet",
                       filesystem=fs)
    fs.create_dir(f"{base}/{COUNTS_DIR}", recursive=True)
    with fs.open_output_stream(f"{base}/{COUNTS_DIR}/{key}.json") as out:
        out.write(json.dumps(counts).encode("utf-8"))
    if bad:
        fs.create_dir(f"{base}/{ROWS_DIR}", recursive=True)
        table = pa.Table.from_pylist(bad, schema=QUARANTINE_SCHEMA)
        pq.write_table(table, f"{base}/{ROWS_DIR}/{key}.parquet", filesystem=fs)


def clear(directory: str, filesystem: pafs.FileSystem | None = None) -> None:
    """Empty the quarantine directory (a fresh run must not count an earlier run's blocks)."""
    fs, base = resolve(directory, filesystem)
    if fs.get_file_info(base).type != pafs.FileType.NotFound:
        fs.delete_dir_contents(base, missing_dir_ok=True)
    fs.create_dir(base, recursive=True)


@dataclass
class IngestSummary:
    """Counts of one ingestion: rows read = good + skipped + quarantined, per reason and per file."""

    source: str = ""
    rows: int = 0
    good: int = 0
    skipped: Counter = field(default_factory=Counter)
    quarantined: Counter = field(default_factory=Counter)
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    duplicates: int = 0  # good rows equal to an earlier good row (kept)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def num_quarantined(self) -> int:
        return sum(self.quarantined.values())

    @property
    def balanced(self) -> bool:
        """Every row read is accounted for exactly once."""
        return self.rows == self.good + self.num_skipped + self.num_quarantined

    def add(self, counts: dict[str, Any]) -> None:
        self.rows += counts["rows"]
        self.good += counts["good"]
        self.skipped.update(counts["skipped"])
        self.quarantined.update(counts["quarantined"])
        per_file = self.files.setdefault(counts["file"], {"rows": 0, "good": 0, "skipped": 0, "quarantined": 0})
        per_file["rows"] += counts["rows"]
        per_file["good"] += counts["good"]
        per_file["skipped"] += sum(counts["skipped"].values())
        per_file["quarantined"] += sum(counts["quarantined"].values())

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rows": self.rows, "good": self.good, "skipped": dict(self.skipped),
                "quarantined": dict(self.quarantined), "duplicates": self.duplicates, "balanced": self.balanced,
                "files": self.files}

    def format(self) -> str:
        """A short text report."""
        lines = [f"{self.source or 'ingest'}: {self.rows} rows read, {self.good} good, {self.num_skipped} "
                 f"skipped, {self.num_quarantined} quarantined, {self.duplicates} duplicate good rows"
                 + ("" if self.balanced else "  [COUNTS DO NOT ADD UP]")]
        lines += [f"  skipped     {reason:<16} {n}" for reason, n in sorted(self.skipped.items())]
        lines += [f"  quarantined {reason:<16} {n}" for reason, n in sorted(self.quarantined.items())]
        for name, c in sorted(self.files.items()):
            lines.append(f"  {name}: {c['rows']} rows, {c['good']} good, {c['skipped']} skipped, "
                         f"{c['quarantined']} quarantined")
        return "\n".join(lines)


def _files_under(fs: pafs.FileSystem, path: str, suffix: str) -> list[str]:
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix))


def read_summary(directory: str, source: str = "", filesystem: pafs.FileSystem | None = None) -> IngestSummary:
    """Fold every block's counts under `directory` into one summary."""
    fs, base = resolve(directory, filesystem)
    summary = IngestSummary(source=source)
    for path in _files_under(fs, f"{base}/{COUNTS_DIR}", ".json"):
        with fs.open_input_stream(path) as f:
            summary.add(json.loads(f.read().decode("utf-8")))
    summary.duplicates = count_duplicates(fs, f"{base}/{HASHES_DIR}")
    return summary


def count_duplicates(fs: pafs.FileSystem, directory: str) -> int:
    """Good rows whose hash repeats an earlier one, over every block (8 bytes of memory per good row)."""
    paths = _files_under(fs, directory, ".parquet")
    if not paths:
        return 0
    hashes = np.concatenate([pq.read_table(p, filesystem=fs).column("hash").to_numpy() for p in paths])
    return int(hashes.size - np.unique(hashes).size)


def write_summary(directory: str, summary: IngestSummary, filesystem: pafs.FileSystem | None = None) -> None:
    fs, base = resolve(directory, filesystem)
    with fs.open_output_stream(f"{base}/{SUMMARY_FILE}") as out:
        out.write(json.dumps(summary.to_dict(), indent=1).encode("utf-8"))


def read_quarantine(directory: str, filesystem: pafs.FileSystem | None = None) -> pa.Table:
    """Every quarantined row under `directory` (ordered by file, then row)."""
    fs, base = resolve(directory, filesystem)
    paths = _files_under(fs, f"{base}/{ROWS_DIR}", ".parquet")
    tables: Iterable[pa.Table] = [pq.read_table(p, filesystem=fs, schema=QUARANTINE_SCHEMA) for p in paths]
    table = pa.concat_tables(tables) if paths else QUARANTINE_SCHEMA.empty_table()
    return table.sort_by([("file", "ascending"), ("row", "ascending")])


class NoGoodRowsError(ValueError):
    """An input file of which every row was quarantined: a wrong source, layout or encoding, not bad luck."""


def check_files_have_good_rows(summary: IngestSummary, quarantine_dir: str) -> None:
    """Raise NoGoodRowsError naming each file whose rows were all quarantined (none good)."""
    failed = {name: c for name, c in summary.files.items() if c["quarantined"] and not c["good"]}
    if not failed:
        return
    reasons = ", ".join(f"{r} {n}" for r, n in summary.quarantined.most_common(3))
    files = "; ".join(f"{name}: all {c['quarantined']} rows quarantined" for name, c in sorted(failed.items()))
    raise NoGoodRowsError(f"{summary.source}: no good row in {files} (reasons: {reasons}); is it the right "
                          f"source and layout? quarantined rows and summary.json are in {quarantine_dir}")
