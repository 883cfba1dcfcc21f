"""Ray Data readers: raw rows with their exact origin -> validated, normalised rows of one task schema.

Pipeline of `read_source` (lazy, streaming):

    plan_parts (driver, `pipelines.data.file_parts`: list files, read TSV headers, optional byte-range split)
      -> RawFileDatasource (`pipelines.data.raw_files`): one read task per file part; the task cuts its part
         into raw blocks of `rows_per_block` rows with `_file` and `_row` (JSONL/TSV: the raw line bytes;
         Parquet: the file's columns) and passes each through `IngestBlock` in the same task:
      -> validate_block: parse + check + normalise; bad rows and per-block counts go to the quarantine
         directory (`madr.data.quarantine`); good rows continue in the task schema;
      -> (`read_tokenized` with compute="tasks") tokenize_table with the worker's cached encoder.

Validation (and tokenisation) run inside the read task, so a row crosses the object store once, already
normalised (or as token ids), and there is no separate operator, repartition or actor start-up between
reading and tokenising. The read task's output is cut into blocks of about `block_bytes` so the stream
reaches its consumer in small steps. Parallelism is one task per file part. `split_bytes="auto"` (the
default of the read functions) splits each large local line file, and each Parquet file with several
row groups, into about `AUTO_PARTS_PER_CPU` parts per cluster CPU (`file_parts.auto_split_bytes`); an
integer gives the part size; None reads every file whole (one task per file).
`read_tokenized(..., compute="actors")` instead tokenises in `map_batches` on an actor pool
(`pipelines.data.tokenize.tokenize_dataset`); `benchmarks.speed.ingest` measures both.

Row numbers stay exact while streaming (`pipelines.data.raw_files`): JSONL/TSV rows are 1-based line
numbers (the TSV header is line 1), Parquet rows 0-based indices. Paths are local paths, object-store URIs
(s3://, gs://, ...; pyarrow filesystems) or directories of them; `filesystem=` overrides the inferred one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.data import Dataset

from madr.data import quarantine
from madr.data.quarantine import NoGoodRowsError  # noqa: F401  (raised by ingest; importers use this name)
from madr.data.validation import StrictModeError, validate_rows
from pipelines.data.file_parts import SplitBytes, plan_parts
from pipelines.data.raw_files import ORIGIN_COLUMNS, RawFileDatasource
from pipelines.data.sources import SourceOptions, get_source
from pipelines.data.tokenize import (
    TASK_SIDES,
    SharedEncoder,
    default_workers,
    tokenize_dataset,
    tokenize_table,
)

BLOCK_BYTES = 8 << 20  # output blocks of a read task: small enough to stream, large enough to amortise
TOKENIZED_BLOCK_BYTES = 1 << 20  # read_tokenized's blocks: a consumer's first batch after ~7k rows, not a whole part


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
                                   result.bad, quarantine_filesystem, hashes=quarantine.row_hashes(result.good))
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
    each `rows_per_block` window by length. Output blocks of about `block_bytes` (1 MiB: with larger blocks a
    consumer waits for whole file parts before its first batch, at the same CPU per row). Quarantine and
    strict mode as in `read_source`.
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
    summary.json). Strict mode raises StrictModeError naming the first bad row's file, row and field; a file
    of which every row was quarantined raises NoGoodRowsError naming it (after the summary is written).
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
    quarantine.check_files_have_good_rows(summary, qdir)
    return summary
