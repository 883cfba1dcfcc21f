"""One search's events -> its impressions: the unit every later step (bias estimation, judgments) reads.

A search is one result list shown to a user: UBI's `query_id`; in the plain impressions layout the row's
`search_id`, else its session's list for that query, else the row alone (`search_key`). Within a search:

* duplicate events (the same action on the same document at the same position, time and flags: a client
  retrying its beacon) are dropped and counted (`duplicate_events`);
* one impression per shown document: its 1-based rank is its smallest logged position (UBI logs positions
  0-based or 1-based: `position_base` "auto" reads a search whose positions include 0 as 0-based), clicked if any
  click (or the row's flag) names it, purchased if any conversion does, dwell the longest logged;
* a click or conversion on a document the search shows no impression of is placed at its own position (an
  implied impression, counted); one without any position is quarantined (`no_position`);
* the query text is the search's own (its `search` event or queries-table row, the latest when there are
  several) else the most frequent text on its events; a search with none is quarantined (`no_query`).

`collapse_search` returns the impressions, the quarantine rows (the quarantine layout of
`madr.data.quarantine`, with the origin of the event at fault) and the counts of the search; `collapse_events`
does it for an iterable of searches. Ray-free: `pipelines.data.click_log` calls it in `map_groups`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

IMPRESSION_SCHEMA = pa.schema([("search_id", pa.string()), ("session_id", pa.string()), ("query", pa.string()),
                               ("doc_id", pa.string()), ("doc_text", pa.string()), ("position", pa.int32()),
                               ("clicked", pa.bool_()), ("clicks", pa.int32()), ("purchased", pa.bool_()),
                               ("dwell", pa.float64())])
COUNT_KEYS = ("events", "duplicate_events", "searches", "searches_without_impressions", "impressions",
              "implied_impressions", "clicked_impressions", "clicks", "purchases", "no_position", "no_query",
              "bad_position")
POSITION_BASES = ("auto", 0, 1)


def search_key(event: dict[str, Any]) -> str:
    """The search an event belongs to: its search id, else its session + query, else its own origin."""
    if event.get("search_id"):
        return f"id:{event['search_id']}"
    if event.get("session_id"):
        return f"session:{event['session_id']}\x1f{event.get('query') or ''}"
    return f"row:{event.get('_file', '')}:{event.get('_row', '')}"


@dataclass
class Collapsed:
    """Impressions, quarantine rows and counts of one or more searches."""

    impressions: list[dict[str, Any]] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def extend(self, other: Collapsed) -> None:
        self.impressions += other.impressions
        self.bad += other.bad
        self.counts.update(other.counts)


def _event_key(e: dict[str, Any]) -> tuple:
    return (e["action"], e.get("doc_id"), e.get("position"), e.get("timestamp"), e.get("clicked"),
            e.get("purchased"), e.get("dwell"), e.get("query"))


def _problem(e: dict[str, Any], source: str, reason: str, field_name: str, detail: str) -> dict[str, Any]:
    raw = {k: v for k, v in e.items() if not k.startswith("_")}
    return {"source": source, "file": e.get("_file", ""), "row": int(e.get("_row", -1)),
            "line_format": not str(e.get("_file", "")).endswith(".parquet"), "reason": reason, "field": field_name,
            "detail": detail, "raw": json.dumps(raw, default=str)[:4000]}


def _query_text(events: Sequence[dict[str, Any]]) -> str | None:
    searches = [e for e in events if e["action"] == "search" and e.get("query")]
    if searches:
        return max(searches, key=lambda e: (e.get("timestamp") or "", e.get("_row", 0)))["query"]
    texts = Counter(e["query"] for e in events if e.get("query"))
    return min(texts, key=lambda t: (-texts[t], t)) if texts else None


def _base(events: Sequence[dict[str, Any]], position_base: str | int) -> int:
    if position_base != "auto":
        return int(position_base)
    return 0 if any(e.get("position") == 0 for e in events) else 1


def collapse_search(events: Sequence[dict[str, Any]], position_base: str | int = "auto",
                    source: str = "click_log") -> Collapsed:
    """One search's events (each with `_file` / `_row`) -> `Collapsed` (module docstring)."""
    out = Collapsed()
    events = sorted(events, key=lambda e: (str(e.get("_file", "")), int(e.get("_row", 0))))
    out.counts.update(events=len(events), searches=1)
    unique, seen = [], set()
    for e in events:
        key = _event_key(e)
        if key in seen:
            out.counts["duplicate_events"] += 1
            continue
        seen.add(key)
        unique.append(e)
    shown = [e for e in unique if e["action"] != "search"]
    if not shown:
        out.counts["searches_without_impressions"] += 1
        return out
    query = _query_text(unique)
    if query is None:
        out.counts["no_query"] += len(shown)
        out.bad += [_problem(e, source, "no_query", "user_query", "no query text on the search or its events")
                    for e in shown]
        return out
    base = _base(unique, position_base)
    docs: dict[str, dict[str, Any]] = {}
    for e in sorted(shown, key=lambda e: e["action"] != "impression"):  # impressions place the documents first
        position = e.get("position")
        if position is not None and position < base:
            out.counts["bad_position"] += 1
            out.bad.append(_problem(e, source, "bad_value", "position", f"{position} < position base {base}"))
            continue
        doc = docs.get(e["doc_id"])
        if doc is None:
            if position is None:
                out.counts["no_position"] += 1
                out.bad.append(_problem(e, source, "no_position", "position",
                                        f"a {e['action']} of {e['doc_id']!r} that the search shows no impression "
                                        "of and that has no position"))
                continue
            doc = {"search_id": unique[0]["search_id"] or search_key(unique[0]), "session_id": e.get("session_id") or "",
                   "query": query, "doc_id": e["doc_id"], "doc_text": e.get("doc_text"), "position": position - base + 1,
                   "clicked": False, "clicks": 0, "purchased": False, "dwell": None}
            docs[e["doc_id"]] = doc
            out.counts["implied_impressions"] += e["action"] != "impression"
        elif position is not None and e["action"] == "impression":
            doc["position"] = min(doc["position"], position - base + 1)
        doc["doc_text"] = doc["doc_text"] or e.get("doc_text")
        if e.get("clicked"):
            doc["clicked"], doc["clicks"] = True, doc["clicks"] + 1
        doc["purchased"] = doc["purchased"] or bool(e.get("purchased"))
        if e.get("dwell") is not None:
            doc["dwell"] = max(doc["dwell"] or 0.0, e["dwell"])
    impressions = sorted(docs.values(), key=lambda d: (d["position"], d["doc_id"]))
    out.impressions = impressions
    out.counts.update(impressions=len(impressions), clicked_impressions=sum(d["clicked"] for d in impressions),
                      clicks=sum(d["clicks"] for d in impressions),
                      purchases=sum(d["purchased"] for d in impressions))
    return out


def group_events(events: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Events grouped by `search_key`, in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        groups.setdefault(search_key(e), []).append(e)
    return groups


def collapse_events(events: Iterable[dict[str, Any]], position_base: str | int = "auto",
                    source: str = "click_log") -> Collapsed:
    """Every search of `events` collapsed (`collapse_search`), impressions sorted by (search, position)."""
    out = Collapsed()
    for group in group_events(events).values():
        out.extend(collapse_search(group, position_base, source))
    out.impressions.sort(key=lambda d: (d["search_id"], d["position"], d["doc_id"]))
    return out


def check_position_base(value: Any) -> str | int:
    if value not in POSITION_BASES:
        raise ValueError(f"position_base must be one of {POSITION_BASES}, got {value!r}")
    return value


# -- as one Arrow table (what a Ray Data map_groups returns) ------------------------------------------------
COLLAPSED_SCHEMA = pa.schema(list(IMPRESSION_SCHEMA) + [("kind", pa.string()), ("note", pa.string())])


def to_table(collapsed: Collapsed) -> pa.Table:
    """`Collapsed` as rows of one table: `kind` "impression" (the impression's columns), one "counts" row and one
    "bad" row per quarantine row (`note`: their JSON)."""
    rows = [{**d, "kind": "impression", "note": None} for d in collapsed.impressions]
    rows.append({"kind": "counts", "note": json.dumps(dict(collapsed.counts))})
    rows += [{"kind": "bad", "note": json.dumps(b)} for b in collapsed.bad]
    return pa.Table.from_pylist(rows, schema=COLLAPSED_SCHEMA)


def from_table(table: pa.Table, into: Collapsed | None = None) -> Collapsed:
    """The inverse of `to_table` (rows appended to `into` when given)."""
    out = into if into is not None else Collapsed()
    names = IMPRESSION_SCHEMA.names
    for row in table.to_pylist():
        if row["kind"] == "impression":
            out.impressions.append({k: row[k] for k in names})
        elif row["kind"] == "counts":
            out.counts.update(json.loads(row["note"]))
        else:
            out.bad.append(json.loads(row["note"]))
    return out
