"""Planning a read (on the driver): the input files, their formats, TSV headers and the parts that read tasks
split them into (`plan_parts` -> `FilePart`s, read by `pipelines.data.raw_files`).

`split_bytes="auto"` (the default of the read functions) splits each large local line file, and each
Parquet file with several row groups, into about `AUTO_PARTS_PER_CPU` parts per cluster CPU
(`auto_split_bytes`); an integer gives the part size; None reads every file whole (one task per file).

A large uncompressed line file is split into byte ranges: the driver makes one pass over the file counting
newlines to place each range on a line boundary and know its first line number (a cheap scan, at disk
speed). Compressed files (.gz, .bz2, .zst) are read whole, by one task each. "auto" splits only local line
files: on an object store that scan would download the whole file to the driver (give an integer to split
one anyway, or store large sources as several files). Parquet files split on row groups (from the footer).

Paths are local paths, object-store URIs (s3://, gs://, ...; pyarrow filesystems) or directories of them;
`filesystem=` overrides the inferred filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray

from madr.data import quarantine
from pipelines.data.sources import get_source

CHUNK_BYTES = 4 << 20  # bytes read from a line file at a time (scan for ranges, read tasks)
BOM, BOM_TEXT = b"\xef\xbb\xbf", "\ufeff"  # a UTF-8 byte order mark: skipped at the start of a file
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv", ".txt": "tsv",
               ".parquet": "parquet"}
AUTO_MIN_PART_BYTES = 4 << 20  # "auto" split: no part smaller (per-task start-up cost stays negligible)
AUTO_MAX_PART_BYTES = 256 << 20  # ... nor larger (a retried task re-reads at most this much)
AUTO_PARTS_PER_CPU = 4  # parts per CPU: a small last wave of tasks, so cores are not left idle at the end
SplitBytes = int | str | None


@dataclass(frozen=True)
class FilePart:
    """A contiguous part of one input file, read by one task.

    `first_row` is the line number (1-based) of the part's first line, or the Parquet row index (0-based)
    of its first row. `end=None` reads to the end of the file.
    """

    path: str
    display: str
    fmt: str
    filesystem: Any = field(compare=False)
    header: tuple[str, ...] = ()
    skip_header: bool = False
    start: int = 0
    end: int | None = None
    first_row: int = 1
    row_groups: tuple[int, ...] | None = None
    size: int = 0


def detect_format(path: str) -> str | None:
    name = path.lower()
    for ext in _COMPRESSED:
        name = name.removesuffix(ext)
    return _EXTENSIONS.get(os.path.splitext(name)[1])


def _list_files(path: str, filesystem: pafs.FileSystem | None) -> list[tuple[pafs.FileSystem, str, str]]:
    """(filesystem, path, display name) of `path` or of the files under it (hidden and _-files skipped)."""
    fs, resolved = quarantine.resolve(path, filesystem)
    prefix = path.split("://", 1)[0] + "://" if "://" in path and filesystem is None else ""
    info = fs.get_file_info(resolved)
    if info.type == pafs.FileType.NotFound:
        raise ValueError(f"{path}: no such file or directory")
    if info.type == pafs.FileType.File:
        return [(fs, resolved, prefix + resolved)]
    infos = fs.get_file_info(pafs.FileSelector(resolved, recursive=True))
    files = sorted(i.path for i in infos if i.type == pafs.FileType.File
                   and not os.path.basename(i.path).startswith((".", "_")) and detect_format(i.path))
    if not files:
        raise ValueError(f"{path}: directory holds no .jsonl/.json/.tsv/.txt/.parquet files")
    return [(fs, p, prefix + p) for p in files]


def _first_line(fs: pafs.FileSystem, path: str) -> str:
    with fs.open_input_stream(path) as f:
        data = b""
        while b"\n" not in data:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            data += chunk
    try:
        return data.split(b"\n", 1)[0].decode("utf-8").removeprefix(BOM_TEXT).removesuffix("\r")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: line 1 (the TSV header) is not valid UTF-8 ({err.reason})") from None


def _line_ranges(fs: pafs.FileSystem, path: str, size: int, split_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, first line number) of ranges of about `split_bytes`, each starting after a newline."""
    bounds = [(0, 1)]
    target, offset, lines = split_bytes, 0, 0
    with fs.open_input_stream(path, compression=None) as f:
        while chunk := f.read(CHUNK_BYTES):
            while target < offset + len(chunk):
                idx = chunk.find(b"\n", max(target - offset, 0))
                if idx < 0:
                    break
                boundary = offset + idx + 1
                if boundary < size:
                    bounds.append((boundary, lines + chunk.count(b"\n", 0, idx + 1) + 1))
                target = boundary + split_bytes - 1
            lines += chunk.count(b"\n")
            offset += len(chunk)
    ends = [b for b, _ in bounds[1:]] + [size]
    return [(start, end, line) for (start, line), end in zip(bounds, ends, strict=True)]


def cluster_cpus() -> int:
    """CPUs of the running Ray cluster (this machine's when Ray is not started)."""
    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def auto_split_bytes(size: int, cpus: int | None = None) -> int | None:
    """The part size "auto" gives a file of `size` bytes: about AUTO_PARTS_PER_CPU parts per CPU, parts
    of AUTO_MIN_PART_BYTES..AUTO_MAX_PART_BYTES; None (read whole) when the file is under two minimum parts.

    One task per part is the reader's only parallelism: a single large file read whole keeps one core busy
    however many the cluster has."""
    if size < 2 * AUTO_MIN_PART_BYTES:
        return None
    target = -(-size // (AUTO_PARTS_PER_CPU * (cpus or cluster_cpus())))
    return min(max(target, AUTO_MIN_PART_BYTES), AUTO_MAX_PART_BYTES)


def _part_bytes(split_bytes: SplitBytes, size: int, local: bool, cpus: int) -> int | None:
    if split_bytes == "auto":
        return auto_split_bytes(size, cpus) if local else None
    if isinstance(split_bytes, str) or (split_bytes is not None and split_bytes < 1):
        raise ValueError(f"split_bytes must be a positive integer, 'auto' or None, got {split_bytes!r}")
    return split_bytes


def plan_parts(source: str, paths: str | Sequence[str], fmt: str | None = None,
               filesystem: pafs.FileSystem | None = None, split_bytes: SplitBytes = None) -> list[FilePart]:
    """The file parts to read: every file under `paths`, its format, its TSV header, its byte ranges
    (`split_bytes`: a part size, "auto" (`auto_split_bytes`) or None: whole files)."""
    spec = get_source(source)
    cpus = cluster_cpus() if split_bytes == "auto" else 1
    paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not paths:
        raise ValueError(f"{source}: no input paths")
    parts: list[FilePart] = []
    for given in paths:
        for fs, path, display in _list_files(str(given), filesystem):
            kind = fmt or detect_format(path)
            if kind is None:
                raise ValueError(f"{display}: cannot tell the format from the extension; pass fmt")
            if kind not in spec.formats:
                raise ValueError(f"{display}: source {source!r} reads {'/'.join(spec.formats)}, not {kind}")
            size = fs.get_file_info(path).size or 0
            base = FilePart(path, display, kind, fs, size=size)
            if kind == "parquet":  # row groups from the footer: cheap on any filesystem
                parts.extend(_parquet_parts(base, _part_bytes(split_bytes, size, True, cpus)))
                continue
            part_bytes = _part_bytes(split_bytes, size, isinstance(fs, pafs.LocalFileSystem), cpus)
            if kind == "tsv":
                header = tuple(_first_line(fs, path).split("\t")) if spec.tsv_header else spec.tsv_columns
                base = replace(base, header=header, skip_header=spec.tsv_header)
            if part_bytes and size > part_bytes and not path.lower().endswith(_COMPRESSED):
                for i, (start, end, line) in enumerate(_line_ranges(fs, path, size, part_bytes)):
                    parts.append(replace(base, start=start, end=end, first_row=line, size=end - start,
                                         skip_header=base.skip_header and i == 0))
            else:
                parts.append(base)
    return parts


def _parquet_parts(base: FilePart, split_bytes: int | None) -> list[FilePart]:
    try:
        meta = pq.ParquetFile(base.filesystem.open_input_file(base.path)).metadata
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{base.display}: not a readable parquet file ({err})") from err
    if not split_bytes or meta.num_row_groups <= 1:
        return [replace(base, first_row=0)]
    parts, groups, first, nbytes, row = [], [], 0, 0, 0
    for g in range(meta.num_row_groups):
        groups.append(g)
        nbytes += meta.row_group(g).total_byte_size
        row += meta.row_group(g).num_rows
        if nbytes >= split_bytes or g == meta.num_row_groups - 1:
            parts.append(replace(base, first_row=first, row_groups=tuple(groups), size=nbytes))
            groups, first, nbytes = [], row, 0
    return parts
