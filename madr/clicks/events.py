"""Click-log events: one normalised schema for the layouts a search team logs, and their row normalisers.

Layouts (the first name of each field is the layout's own, the others accepted aliases):

* UBI events (OpenSearch User Behavior Insights, `ubi_events`): action_name, query_id (one search, i.e. one
  result list), session_id, client_id, timestamp, user_query, object_id, object_description, position, dwell_time;
  the nested JSON export (`event_attributes.object.object_id`, `event_attributes.position.ordinal`,
  `event_attributes.session_id`, `event_attributes.dwell_time`) is read as well;
* UBI queries (`ubi_queries`): query_id, user_query, client_id, timestamp (read as that search's `search` event);
* plain impressions (`impressions`): one shown document per row: query, doc_id, position, clicked, and optionally
  search_id (or query_id / request_id), session_id, dwell_time, purchased, title, timestamp.

Actions are mapped to `search`, `impression`, `click` and `conversion` (`ACTIONS`); any other action (filters,
sorts, hovers, page exits) is a well-formed event without ranking signal and is skipped (counted as
`other_action`). An impression without its position is malformed (its examination cannot be estimated) and is
quarantined; a click without one is kept and placed by its search's impression of the same document
(`madr.clicks.collapse`). Positions are kept raw here (UBI logs them 0-based or 1-based): `collapse` maps them to
1-based ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from madr.data.validation import MISSING, BadRow, Fields, SkipRow

EVENT_SCHEMA = pa.schema([("search_id", pa.string()), ("session_id", pa.string()), ("query", pa.string()),
                          ("action", pa.string()), ("doc_id", pa.string()), ("doc_text", pa.string()),
                          ("position", pa.int32()), ("clicked", pa.bool_()), ("purchased", pa.bool_()),
                          ("dwell", pa.float64()), ("timestamp", pa.string())])
ACTIONS = {"search": "search", "impression": "impression", "click": "click", "item_click": "click",
           "product_click": "click", "add_to_cart": "conversion", "purchase": "conversion",
           "checkout": "conversion"}
_NESTED = {"object_id": ("object", "object_id"), "object_description": ("object", "description"),
           "position": ("position", "ordinal"), "session_id": ("session_id",), "dwell_time": ("dwell_time",)}
_BINARY = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
QUERY_NAMES = ("user_query", "query", "query_text", "search_term", "q")


def _flatten_ubi(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """A nested UBI event (OpenSearch's `event_attributes` object) with its attributes lifted to the top."""
    attributes = row.get("event_attributes")
    if not isinstance(attributes, Mapping):
        return row
    flat = dict(row)
    for name, path in _NESTED.items():
        value: Any = attributes
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is not None and flat.get(name) is None:
            flat[name] = value
    return flat


def _event(search_id: str, action: str, **values: Any) -> dict[str, Any]:
    row = {"search_id": search_id, "session_id": "", "query": None, "action": action, "doc_id": None,
           "doc_text": None, "position": None, "clicked": action == "click", "purchased": action == "conversion",
           "dwell": None, "timestamp": None}
    row.update(values)
    return row


def _dwell(f: Fields) -> float | None:
    dwell = f.number(("dwell_time", "dwell"))
    if dwell is not None and dwell < 0:
        raise BadRow("bad_value", "dwell_time", f"{dwell} < 0")
    return dwell


def _flag(f: Fields, names: tuple[str, ...], required: bool) -> bool | None:
    """A yes/no field: a bool, 0/1, a count (> 0 is yes) or true/false text."""
    name, value = f.find(names)
    if value is MISSING:
        if required:
            raise BadRow("missing_field", names[0], f"absent or null (also accepted: {', '.join(names[1:])})")
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        count = f.integer((name,), minimum=0)
        return bool(count)
    return f.choice((name,), _BINARY)


def _timestamp(f: Fields) -> str | None:
    name, value = f.find(("timestamp", "time", "event_time"))
    return None if value is MISSING else str(value)


def ubi_event(f: Fields, opts: Any, file: str) -> dict[str, Any]:
    """One UBI event row -> a normalised event (module docstring)."""
    f = Fields(_flatten_ubi(f.row), f.max_chars, f.typed, f.check_surrogates)
    action_name = f.text(("action_name", "action"))
    action = ACTIONS.get(action_name.strip().lower())
    if action is None:
        raise SkipRow("other_action")
    search_id = f.ident(("query_id",), required=True)
    doc_id = f.ident(("object_id", "doc_id"), required=action != "search") or None
    position = f.integer(("position", "ordinal"), minimum=0)
    if action == "impression" and position is None:
        raise BadRow("missing_field", "position", "an impression without its position (its examination cannot be "
                                                  "estimated)")
    return _event(search_id, action, session_id=f.ident(("session_id", "client_id")),
                  query=f.text(QUERY_NAMES, required=False), doc_id=doc_id,
                  doc_text=f.text(("object_description",), required=False), position=position, dwell=_dwell(f),
                  timestamp=_timestamp(f))


def ubi_query(f: Fields, opts: Any, file: str) -> dict[str, Any]:
    """One row of UBI's queries table -> the `search` event of that search (its query text)."""
    return _event(f.ident(("query_id",), required=True), "search", session_id=f.ident(("session_id", "client_id")),
                  query=f.text(QUERY_NAMES), timestamp=_timestamp(f))


def impression_row(f: Fields, opts: Any, file: str) -> dict[str, Any]:
    """One row of the plain impressions layout -> an `impression` event carrying its click / purchase flags.

    A row without search_id (or query_id / request_id) forms a search of its own unless it has a session_id
    (then its search is the session's result list for that query: `madr.clicks.collapse.search_key`)."""
    position = f.integer(("position", "rank"), required=True, minimum=0)
    clicked = _flag(f, ("clicked", "click", "clicks"), required=True)
    purchased = bool(_flag(f, ("purchased", "purchase", "add_to_cart", "conversion"), required=False))
    return _event(f.ident(("search_id", "query_id", "request_id", "impression_id")), "impression",
                  session_id=f.ident(("session_id", "session")), query=f.text(QUERY_NAMES),
                  doc_id=f.ident(("doc_id", "product_id", "object_id", "document_id"), required=True),
                  doc_text=f.text(("title", "doc_title", "object_description"), required=False),
                  position=position, clicked=clicked, purchased=purchased, dwell=_dwell(f), timestamp=_timestamp(f))


NORMALIZERS = {"ubi_events": ubi_event, "ubi_queries": ubi_query, "impressions": impression_row}
FORMATS = ("ubi", "impressions")
