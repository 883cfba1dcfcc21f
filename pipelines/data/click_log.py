"""A click log on Ray Data: event files -> validated events (quarantined per block) -> impressions, streaming.

`ingest_click_log(fmt, events, out_dir, quarantine_dir, queries=...)`:
1. `read_source` (`pipelines.data.readers`) reads the UBI events (and queries) or the plain impressions layout in
   parallel read tasks, validating each block with `madr.clicks.events`' normalisers; bad rows and counts go to
   `<quarantine_dir>/events` with their file, row and field, as every ingested source's;
2. each event gets its search key (`madr.clicks.collapse.search_key`), `groupby(key).map_groups` collapses every
   search (`madr.clicks.collapse.collapse_search`: duplicates dropped and counted, clicks placed) into rows of
   `COLLAPSED_SCHEMA`, written as Parquet parts;
3. the driver streams those parts once: impressions to `<out_dir>/impressions/part-*.parquet`, the events no
   search could place to `<quarantine_dir>/searches`, the counts into `<out_dir>/summary.json`.
`madr.clicks.log.read_click_log` is the same in one process (tests check that they agree).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray

from madr.clicks.collapse import (
    COUNT_KEYS,
    IMPRESSION_SCHEMA,
    Collapsed,
    check_position_base,
    collapse_search,
    from_table,
    search_key,
    to_table,
)
from madr.clicks.log import EVENTS_DIR, SEARCHES_DIR, SUMMARY, write_search_quarantine
from madr.data import quarantine
from pipelines.data.readers import find_strict_error, read_source

SEARCH_KEY = "_search"


def _with_search_key(batch: pa.Table) -> pa.Table:
    rows = batch.select(["search_id", "session_id", "query", "_file", "_row"]).to_pylist()
    return batch.append_column(SEARCH_KEY, pa.array([search_key(r) for r in rows], pa.string()))


def _collapse_group(group: pa.Table, position_base: str | int) -> pa.Table:
    events = group.drop_columns([SEARCH_KEY]).to_pylist()
    return to_table(collapse_search(events, position_base))


def read_events(fmt: str, events: str | Sequence[str], quarantine_dir: str,
                queries: str | Sequence[str] | None = None, strict: bool = False) -> ray.data.Dataset:
    """The validated events of a click log (with `_file` / `_row`), lazily."""
    if fmt not in ("ubi", "impressions"):
        raise ValueError(f"click log format must be 'ubi' or 'impressions', got {fmt!r}")
    if queries and fmt != "ubi":
        raise ValueError("a queries file belongs to a UBI log (format: ubi)")
    source = "ubi_events" if fmt == "ubi" else "impressions"
    ds = read_source(source, events, quarantine_dir=quarantine_dir, with_origin=True, strict=strict)
    if queries:
        ds = ds.union(read_source("ubi_queries", queries, quarantine_dir=quarantine_dir, with_origin=True,
                                  strict=strict))
    return ds


def collapse_dataset(events: ray.data.Dataset, position_base: str | int = "auto") -> ray.data.Dataset:
    """Events grouped by search and collapsed: rows of `madr.clicks.collapse.COLLAPSED_SCHEMA`."""
    keyed = events.map_batches(_with_search_key, batch_format="pyarrow")
    return keyed.groupby(SEARCH_KEY).map_groups(_collapse_group, fn_kwargs={"position_base": position_base},
                                                batch_format="pyarrow")


def _split_parts(parts_dir: Path, out: Path) -> Collapsed:
    """Impressions of every collapsed part -> `out/part-*.parquet`; counts and bad rows returned."""
    tally = Collapsed()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*.parquet"):
        old.unlink()
    for i, path in enumerate(sorted(parts_dir.glob("*.parquet"))):
        table = pq.read_table(path)
        is_impression = pc.equal(table.column("kind"), "impression")
        impressions = table.filter(is_impression).select(IMPRESSION_SCHEMA.names).cast(IMPRESSION_SCHEMA)
        if impressions.num_rows:
            pq.write_table(impressions, out / f"part-{i:05d}.parquet")
        tally.counts["_impressions_written"] += impressions.num_rows
        from_table(table.filter(pc.invert(is_impression)), tally)
    return tally


def ingest_click_log(fmt: str, events: str | Sequence[str], out_dir: str | Path, quarantine_dir: str | Path, *,
                     queries: str | Sequence[str] | None = None, position_base: str | int = "auto",
                     strict: bool = False) -> dict[str, Any]:
    """Read, validate and collapse a click log on Ray Data (module docstring); returns the summary."""
    check_position_base(position_base)
    out, qdir = Path(out_dir), Path(quarantine_dir)
    events_q = str(qdir / EVENTS_DIR)
    quarantine.clear(events_q)
    scratch = out / "_collapsed"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        collapse_dataset(read_events(fmt, events, events_q, queries, strict), position_base).write_parquet(
            str(scratch))
    except Exception as err:  # Ray wraps the UDF's exception: surface the strict-mode message as is
        found = find_strict_error(err)
        if found is not None:
            raise type(found)(str(found)) from None
        raise
    tally = _split_parts(scratch, out / "impressions")
    shutil.rmtree(scratch, ignore_errors=True)
    ingest = quarantine.read_summary(events_q, "click_log")
    quarantine.write_summary(events_q, ingest)
    write_search_quarantine(str(qdir / SEARCHES_DIR), tally.bad)
    sessions = pq.read_table(out / "impressions", columns=["session_id"]).column("session_id") \
        if tally.counts["_impressions_written"] else pa.array([], pa.string())
    summary = {"events": ingest.to_dict(), "searches": {k: int(tally.counts.get(k, 0)) for k in COUNT_KEYS},
               "sessions": len(set(sessions.to_pylist()) - {""})}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1))
    quarantine.check_files_have_good_rows(ingest, events_q)
    return summary
