"""Line files (JSONL, TSV, TREC) read in one process from a local path or a pyarrow filesystem, validated row
by row into good rows and quarantine rows.

A file is a local path, a URI pyarrow knows (`file://`, `s3://`, `gs://`, ...) or a path inside a given
pyarrow filesystem (`LocalFileSystem`, `SubTreeFileSystem`, ...): `madr.data.quarantine.resolve`.
`validate_file` streams it in blocks of lines with their 1-based line numbers (a header, when there is one,
is line 1; a UTF-8 byte order mark at the start is dropped; `.gz` / `.bz2` / `.zst` are decompressed by
extension) through `madr.data.validation.validate_rows` and gathers the result in a `FileResult`: the
normalised good rows, the quarantine rows (file, line, reason, field, detail, raw) and the counts per
reason, in the form `madr.data.quarantine.write_block` writes. `write_quarantine` writes the results of a
read as a quarantine directory (rows, counts, summary.json) like `pipelines.data` ingestion does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from madr.data import quarantine
from madr.data.validation import BlockResult, validate_rows

BOM = b"\xef\xbb\xbf"
CHUNK_BYTES = 1 << 20
LINES_PER_BLOCK = 10_000


@dataclass
class FileResult:
    """What validating one file gave: good rows (normalised, with their line numbers), bad rows, counts."""

    file: str
    good: list[dict[str, Any]] = field(default_factory=list)
    good_rows: list[int] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    skipped: Counter = field(default_factory=Counter)
    quarantined: Counter = field(default_factory=Counter)
    first_row: int = 1

    def counts(self) -> dict[str, Any]:
        """The counts record of `madr.data.quarantine.write_block` (rows = good + skipped + quarantined)."""
        return {"file": self.file, "first_row": self.first_row, "rows": self.rows, "good": len(self.good),
                "skipped": dict(self.skipped), "quarantined": dict(self.quarantined)}

    def extend(self, block: BlockResult) -> None:
        """Add the rows and counts of one validated block of the same file (`validate_rows`) to this result."""
        self.good += block.good
        self.good_rows += block.good_rows
        self.bad += block.bad
        self.rows += block.rows
        self.skipped.update(block.skipped)
        self.quarantined.update(block.quarantined)

    def skip_good(self, keep: Callable[[dict[str, Any]], bool], reason: str) -> int:
        """Move the good rows for which `keep` is false to the skipped count under `reason`; how many moved."""
        kept = [(g, r) for g, r in zip(self.good, self.good_rows, strict=True) if keep(g)]
        moved = len(self.good) - len(kept)
        if moved:
            self.skipped[reason] += moved
            self.good, self.good_rows = [g for g, _ in kept], [r for _, r in kept]
        return moved


def open_file(uri: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of an existing file; a missing one is a FileNotFoundError naming it."""
    fs, path = quarantine.resolve(uri, filesystem)
    if fs.get_file_info(path).type != pafs.FileType.File:
        raise FileNotFoundError(f"{uri}: file not found")
    return fs, path


def first_line(fs: pafs.FileSystem, path: str) -> str:
    """The first non-blank line of a text file (BOM and line end removed; "" for an empty file)."""
    for _, line in _lines(fs, path):
        text = line.decode("utf-8", errors="replace").strip()
        if text:
            return text
    return ""


def _lines(fs: pafs.FileSystem, path: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line bytes without the newline) of a text file, streamed."""
    number, carry, at_start = 0, b"", True
    with fs.open_input_stream(path) as stream:
        while True:
            chunk = stream.read(CHUNK_BYTES)
            if not chunk:
                break
            if at_start:
                chunk, at_start = chunk.removeprefix(BOM), False
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()
            for line in lines:
                number += 1
                yield number, line
    if carry:
        yield number + 1, carry


def _blocks(fs: pafs.FileSystem, path: str, skip_header: bool) -> Iterator[tuple[list[int], list[bytes]]]:
    rows: list[int] = []
    lines: list[bytes] = []
    for number, line in _lines(fs, path):
        if skip_header and number == 1:
            continue
        rows.append(number)
        lines.append(line)
        if len(lines) == LINES_PER_BLOCK:
            yield rows, lines
            rows, lines = [], []
    if lines:
        yield rows, lines


def validate_file(uri: str, normalize: Callable[..., dict[str, Any]], *, fmt: str, header: Sequence[str] = (),
                  skip_header: bool = False, max_chars: int, source: str,
                  filesystem: pafs.FileSystem | None = None, display: str | None = None,
                  strict: bool = False) -> FileResult:
    """Validate every line of one file with `normalize(fields, None, file)` (`madr.data.validation`);
    `display` names the file in the quarantine and in errors (default: `uri`). `strict` raises
    StrictModeError at the first bad row instead of quarantining it."""
    fs, path = open_file(uri, filesystem)
    name = display or uri
    result = FileResult(name, first_row=2 if skip_header else 1)
    for rows, lines in _blocks(fs, path, skip_header):
        result.extend(validate_rows(normalize, None, name, lines, rows, fmt, header, max_chars, source, strict))
    return result


def write_quarantine(directory: str, results: Sequence[FileResult], source: str,
                     filesystem: pafs.FileSystem | None = None) -> quarantine.IngestSummary:
    """Write the results of one read as a quarantine directory (emptied first): each file's bad rows and
    counts, and summary.json; returns the summary."""
    quarantine.clear(directory, filesystem)
    for r in results:
        quarantine.write_block(directory, quarantine.block_key(r.file, r.first_row), r.counts(), r.bad, filesystem)
    summary = quarantine.read_summary(directory, source, filesystem)
    quarantine.write_summary(directory, summary, filesystem)
    return summary


def summarize(results: Sequence[FileResult], source: str) -> quarantine.IngestSummary:
    """The summary of a read without writing anything."""
    summary = quarantine.IngestSummary(source=source)
    for r in results:
        summary.add(r.counts())
    return summary
