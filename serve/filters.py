"""Aspect filters: exact-value post-filters on the document fields kept in the DocStore.

A filter maps a DocStore field (an aspect such as ``brand``, ``color`` or ``category``: paper 000 Sec. 3's
structured product aspects) to one value or a list of values: ``{"brand": "acme", "color": ["red", "blue"]}``.
A document passes when, for every field, one of its values (a string or a list of strings; numbers and
booleans as their string form) equals one of the requested values, compared case-insensitively after
trimming: AND across fields, OR within a field. Documents without the field (or without a DocStore row)
fail. The index itself is not filtered: `/search` over-fetches candidates by relevance and keeps those that
pass (serve/api.py), so a very rare value can return fewer than ``k`` documents (the response says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MAX_FILTER_VALUES = 64
MAX_VALUE_CHARS = 200


def _norm(value: Any) -> str:
    return str(value).strip().casefold()


def check_filters(filters: Mapping[str, Any], allowed: Sequence[str]) -> dict[str, frozenset[str]]:
    """Validated, normalised filters; ValueError naming the field for unknown fields or bad values."""
    out: dict[str, frozenset[str]] = {}
    for name, raw in filters.items():
        if name not in allowed:
            known = ", ".join(allowed) if allowed else "none (the index has no filterable document fields)"
            raise ValueError(f"unknown filter field {name!r}; filterable fields: {known}")
        values = [raw] if isinstance(raw, str) else raw
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"filter {name!r}: expected a string or a list of strings")
        if not values or len(values) > MAX_FILTER_VALUES:
            raise ValueError(f"filter {name!r}: give 1 to {MAX_FILTER_VALUES} values, got {len(values)}")
        for v in values:
            if not v.strip() or len(v) > MAX_VALUE_CHARS:
                raise ValueError(f"filter {name!r}: values must be non-blank and at most {MAX_VALUE_CHARS} "
                                 f"characters, got {v!r:.60}")
        out[name] = frozenset(_norm(v) for v in values)
    return out


def doc_values(value: Any) -> set[str]:
    """The normalised values of one document field (None: no values)."""
    if value is None:
        return set()
    if isinstance(value, (list, tuple, set)) or (hasattr(value, "tolist") and not isinstance(value, str)):
        items: Iterable[Any] = value.tolist() if hasattr(value, "tolist") else value
        if not isinstance(items, list):
            items = [items]
        return {_norm(v) for v in items if v is not None}
    return {_norm(value)}


def matches(doc: Mapping[str, Any] | None, filters: Mapping[str, frozenset[str]]) -> bool:
    """True when `doc` passes every filter (see the module docstring)."""
    if doc is None:
        return not filters
    return all(doc_values(doc.get(name)) & wanted for name, wanted in filters.items())
