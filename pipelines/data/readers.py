"""Ray Data readers: raw rows with their exact origin -> validated, normalised rows of one task schema.

Pipeline of `read_source` (lazy, streaming):

    plan_parts (driver: list files, read TSV headers, optional byte-range split)
      -> RawFileDatasource: one read task per file part; the task cuts its part into raw blocks of
         `rows_per_block` rows with `_file` and `_row` (JSONL/TSV: the raw line bytes; Parquet: the
         file's columns) and passes each through `IngestBlock` in the same task:
      -> validate_block: parse + check + normalise; bad rows and per-block counts go to the quarantine
         directory (`pipelines.data.quarantine`); good rows continue in the task schema;
      -> (`read_tokenized` with compute="tasks") tokenize_table with the worker's cached encoder.

Validation (and tokenisation) run inside the read task, so a row crosses the object store once, already
normalised (or as token ids), and there is no separate operator, repartition or actor start-up between
reading and tokenising. The read task's output is cut into blocks of about `block_bytes` so the stream
reaches its consumer in small steps. Parallelism is one task per file part. `split_bytes="auto"` (the
default of the read functions) splits each large local line file, and each Parquet file with several
row groups, into about `AUTO_PARTS_PER_CPU` parts per cluster CPU (`auto_split_bytes`); an integer gives
the part size; None reads every file whole (one task per file).
`read_tokenized(..., compute="actors")` instead tokenises in `map_batches` on an actor pool
(`pipelines.data.tokenize.tokenize_dataset`); `benchmarks.speed.ingest` measures both.

Row numbers stay exact while streaming because a read task reads its part sequentially and counts lines
itself: JSONL/TSV rows are 1-based line numbers (the TSV header is line 1, as `sed -n Np` counts), Parquet
rows 0-based indices. A large uncompressed line file can be split into byte ranges (`split_bytes`) so that
several tasks read it in parallel; the driver then makes one pass over the file counting newlines to
place each range on a line boundary and know its first line number (a cheap scan, at disk speed).
Compressed files (.gz, .bz2, .zst) are read whole, by one task each. "auto" splits only local line files:
on an object store that scan would download the whole file to the driver (give an integer to split one
anyway, or store large sources as several files).

Paths are local paths, object-store URIs (s3://, gs://, ...; pyarrow filesystems) or directories of them;
`filesystem=` overrides the inferred filesystem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray
from ray.data import Dataset
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from pipelines.data import quarantine
from pipelines.data.sources import SourceOptions, get_source
from pipelines.data.tokenize import (
    TASK_SIDES,
    SharedEncoder,
    default_workers,
    tokenize_dataset,
    tokenize_table,
)
from pipelines.data.validation import StrictModeError, validate_rows

_CHUNK = 4 << 20
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv", ".txt": "tsv",
               ".parquet": "parquet"}
ORIGIN_COLUMNS = ("_file", "_row")
BLOCK_BYTES = 8 << 20  # output blocks of a read task: small enough to stream, large enough to amortise
TOKENIZED_BLOCK_BYTES = 1 << 20  # read_tokenized's blocks: a consumer's first batch after ~7k rows, not a whole part
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
        return data.split(b"\n", 1)[0].decode("utf-8").removesuffix("\r")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: line 1 (the TSV header) is not valid UTF-8 ({err.reason})") from None


def _line_ranges(fs: pafs.FileSystem, path: str, size: int, split_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, first line number) of ranges of about `split_bytes`, each starting after a newline."""
    bounds = [(0, 1)]
    target, offset, lines = split_bytes, 0, 0
    with fs.open_input_stream(path, compression=None) as f:
        while chunk := f.read(_CHUNK):
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
    however many the cluster has (benchmarks/RESULTS.md, "Ray Data ingestion throughput")."""
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


# -- reading (runs in Ray read tasks) -------------------------------------------------------------------
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

    def block(lines: list[bytes]) -> pa.Table:
        return pa.table({**_origin(part.display, row, len(lines)), "_line": pa.array(lines, pa.binary())})

    with stream:
        while True:
            size = _CHUNK if remaining is None else min(_CHUNK, remaining)
            chunk = stream.read(size) if size > 0 else b""
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
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


def _read_part(part: FilePart, rows_per_block: int, transform: BlockTransform | None = None) -> Iterator[pa.Table]:
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
        return [ReadTask(partial(_read_part, part, self.rows_per_block, self.transform),
                         BlockMetadata(num_rows=None, size_bytes=part.size, exec_stats=None,
                                       input_files=[part.display]))
                for part in self.parts]

    def get_name(self) -> str:
        return "ReadRawFiles"


# -- validation (runs in the tasks fused with the reads) ------------------------------------------------
def validate_block(block: pa.Table, *, source: str, options: SourceOptions, layouts: dict[str, tuple[str, tuple]],
                   quarantine_dir: str | None, strict: bool, with_origin: bool,
                   quarantine_filesystem: pafs.FileSystem | None = None) -> pa.Table:
    """Raw rows -> normalised good rows (task schema); quarantine rows and counts written per file."""
    spec = get_source(source)
    max_chars = options.max_chars or spec.max_chars
    files = block.column("_file").to_pylist()
    rows = block.column("_row").to_pylist()
    if "_line" in block.column_names:
        payloads = block.column("_line").to_pylist()
    else:
        payloads = block.drop_columns(list(ORIGIN_COLUMNS)).to_pylist()
    by_file: dict[str, list[int]] = {}
    for i, f in enumerate(files):
        by_file.setdefault(f, []).append(i)
    good, good_files, good_rows = [], [], []
    for file, idx in by_file.items():  # a block comes from one file part; grouping keeps this general
        fmt, header = layouts[file]
        file_rows = [rows[i] for i in idx]
        result = validate_rows(spec.normalize, options, file, [payloads[i] for i in idx], file_rows, fmt,
                               header, max_chars, source, strict)
        good.extend(result.good)
        if with_origin:
            good_files += [file] * len(result.good_rows)
            good_rows += result.good_rows
        if quarantine_dir is not None:
            counts = {"file": file, "first_row": int(file_rows[0]), "rows": result.rows, "good": len(result.good),
                      "skipped": dict(result.skipped), "quarantined": dict(result.quarantined)}
            quarantine.write_block(quarantine_dir, quarantine.block_key(file, int(file_rows[0])), counts,
                                   result.bad, quarantine_filesystem)
    table = pa.Table.from_pylist(good, schema=spec.schema)
    if with_origin:
        table = table.append_column("_file", pa.array(good_files, pa.string()))
        table = table.append_column("_row", pa.array(good_rows, pa.int64()))
    return table


@dataclass(frozen=True)
class IngestBlock:
    """What a read task does to each raw block: validate + normalise (`validate_block`), then, with an
    `encoder`, tokenise (`tokenize_table`) with the worker process's cached encoder."""

    source: str
    options: SourceOptions
    layouts: dict[str, tuple[str, tuple]]
    quarantine_dir: str | None
    strict: bool = False
    with_origin: bool = False
    encoder: SharedEncoder | None = None
    bucket: bool = False
    quarantine_filesystem: pafs.FileSystem | None = None

    def __call__(self, raw: pa.Table) -> pa.Table:
        good = validate_block(raw, source=self.source, options=self.options, layouts=self.layouts,
                              quarantine_dir=self.quarantine_dir, strict=self.strict,
                              with_origin=self.with_origin and self.encoder is None,
                              quarantine_filesystem=self.quarantine_filesystem)
        if self.encoder is None:
            return good
        return tokenize_table(good, None, get_source(self.source).task, bucket=self.bucket,
                              encoder=self.encoder.get())


def _read(source: str, paths: str | Sequence[str], quarantine_dir: str | None, options: SourceOptions | None,
          strict: bool, fmt: str | None, filesystem: pafs.FileSystem | None, rows_per_block: int,
          split_bytes: SplitBytes, with_origin: bool, encoder: SharedEncoder | None, bucket: bool,
          block_bytes: int, workers: int | None, quarantine_filesystem: pafs.FileSystem | None) -> Dataset:
    spec = get_source(source)
    if quarantine_dir is None and not strict:
        raise ValueError("read_source: give a quarantine_dir (or strict=True)")
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes}")
    parts = plan_parts(source, paths, fmt, filesystem, split_bytes)
    transform = IngestBlock(spec.name, options or SourceOptions(), {p.display: (p.fmt, p.header) for p in parts},
                            quarantine_dir, strict, with_origin, encoder, bucket, quarantine_filesystem)
    ds = ray.data.read_datasource(RawFileDatasource(parts, rows_per_block, transform),
                                  override_num_blocks=len(parts), concurrency=workers)
    ds.context.target_max_block_size = block_bytes  # this dataset's copy of the context only
    return ds


def read_source(source: str, paths: str | Sequence[str], *, quarantine_dir: str | None,
                options: SourceOptions | None = None, strict: bool = False, fmt: str | None = None,
                filesystem: pafs.FileSystem | None = None, rows_per_block: int = 10_000,
                split_bytes: SplitBytes = "auto", with_origin: bool = False, block_bytes: int = BLOCK_BYTES,
                quarantine_filesystem: pafs.FileSystem | None = None) -> Dataset:
    """A lazy, streaming Dataset of `source`'s good rows in its task schema (`get_source(source).schema`).

    Bad rows go to `quarantine_dir` with their reason and origin, and every block's counts too (read them
    with `quarantine.read_summary` once the dataset has been consumed). `strict=True` stops at the first
    bad row with a StrictModeError naming its file, row and field (`quarantine_dir` may then be None).
    `with_origin` adds `_file` / `_row` columns to the good rows. Paths and `quarantine_dir` may be
    object-store URIs; `filesystem` / `quarantine_filesystem` override the filesystems inferred from them.
    `split_bytes`: read tasks per file (see the module docstring; "auto" splits large local files).
    """
    return _read(source, paths, quarantine_dir, options, strict, fmt, filesystem, rows_per_block, split_bytes,
                 with_origin, None, False, block_bytes, None, quarantine_filesystem)


def read_tokenized(source: str, paths: str | Sequence[str], tokenizer: str | os.PathLike | SharedEncoder, *,
                   quarantine_dir: str | None, max_length: int = 128, bucket: bool = False,
                   compute: str = "tasks", workers: int | None = None, options: SourceOptions | None = None,
                   strict: bool = False, fmt: str | None = None, filesystem: pafs.FileSystem | None = None,
                   rows_per_block: int = 2048, split_bytes: SplitBytes = "auto",
                   block_bytes: int = TOKENIZED_BLOCK_BYTES,
                   quarantine_filesystem: pafs.FileSystem | None = None) -> Dataset:
    """Read + validate + tokenise `source`: a streaming Dataset of int columns (`tokenize_table`'s).

    compute="tasks" (default): tokenised inside the read tasks, `rows_per_block` rows per tokenizer call,
    at most `workers` tasks at a time (default: as many as the cluster's CPUs). compute="actors": read
    tasks validate, an autoscaling pool of 1..`workers` actors tokenises in `map_batches`. `bucket` sorts
    each `rows_per_block` window by length. Output blocks of about `block_bytes` (1 MiB: with 8 MiB a
    consumer waited for whole file parts, 7 s for its first batch in benchmarks.speed.ingest at 200k rows,
    2.7 s with 1 MiB, same CPU per row). Quarantine and strict mode as in `read_source`.
    """
    if compute not in ("tasks", "actors"):
        raise ValueError(f"compute must be 'tasks' or 'actors', got {compute!r}")
    task = get_source(source).task
    if task not in TASK_SIDES:
        raise ValueError(f"source {source!r} ({task} rows) is not tokenised; tokenised tasks: {', '.join(TASK_SIDES)}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    shared = tokenizer if isinstance(tokenizer, SharedEncoder) else SharedEncoder(tokenizer, max_length)
    workers = workers or default_workers()
    if compute == "tasks":
        return _read(source, paths, quarantine_dir, options, strict, fmt, filesystem, rows_per_block,
                     split_bytes, False, shared, bucket, block_bytes, workers, quarantine_filesystem)
    ds = read_source(source, paths, quarantine_dir=quarantine_dir, options=options, strict=strict, fmt=fmt,
                     filesystem=filesystem, rows_per_block=rows_per_block, split_bytes=split_bytes,
                     block_bytes=block_bytes, quarantine_filesystem=quarantine_filesystem)
    return tokenize_dataset(ds, task, shared, window=rows_per_block, bucket=bucket, max_actors=workers)


def find_strict_error(err: BaseException) -> StrictModeError | None:
    """The StrictModeError inside a Ray task error (Ray wraps UDF exceptions), or None."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, StrictModeError) and not isinstance(getattr(e, "cause", None), StrictModeError):
            return e  # the original error, not Ray's wrapper (whose text is the whole remote traceback)
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    text = str(err)
    marker = "StrictModeError: "
    if marker in text:
        return StrictModeError(text.split(marker, 1)[1].splitlines()[0])
    return None


def ingest(source: str, paths: str | Sequence[str], output: str, *, quarantine_dir: str | None = None,
           options: SourceOptions | None = None, strict: bool = False, fmt: str | None = None,
           filesystem: pafs.FileSystem | None = None, rows_per_block: int = 10_000,
           split_bytes: SplitBytes = "auto", tokenizer: str | os.PathLike | SharedEncoder | None = None,
           max_length: int = 128, bucket: bool = False, compute: str = "tasks",
           workers: int | None = None) -> quarantine.IngestSummary:
    """Read, validate and normalise `paths`, write the good rows as Parquet under `output` and the bad ones
    under `quarantine_dir` (default `<output>.quarantine`), and return the summary (also written there as
    summary.json). Strict mode raises StrictModeError naming the first bad row's file, row and field.
    With a `tokenizer`, the rows written are tokenised in the same pass (`read_tokenized`)."""
    qdir = quarantine_dir or output.rstrip("/") + ".quarantine"
    quarantine.clear(qdir, filesystem)
    common = {"quarantine_dir": qdir, "options": options, "strict": strict, "fmt": fmt, "filesystem": filesystem,
              "rows_per_block": rows_per_block, "split_bytes": split_bytes, "quarantine_filesystem": filesystem,
              "block_bytes": BLOCK_BYTES}  # written files of up to 8 MiB blocks, tokenised or not
    if tokenizer is None:
        ds = read_source(source, paths, **common)
    else:
        ds = read_tokenized(source, paths, tokenizer, max_length=max_length, bucket=bucket, compute=compute,
                            workers=workers, **common)
    try:
        ds.write_parquet(output, filesystem=filesystem, mode="overwrite")
    except Exception as err:  # Ray wraps the UDF's exception: surface the strict-mode message as is
        found = find_strict_error(err)
        if found is not None:
            raise StrictModeError(str(found)) from None
        raise
    summary = quarantine.read_summary(qdir, source, filesystem)
    quarantine.write_summary(qdir, summary, filesystem)
    return summary
