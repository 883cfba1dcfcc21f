"""Row validation: why a row is rejected or skipped, typed field accessors, and the per-block step that
parses, checks and normalises a block of raw rows into good rows and quarantine rows.

A raw row is one line of a JSONL/TSV file or of a whitespace-separated one ("trec": TREC qrels and runs;
bytes: decoding, JSON and column errors are caught here) or one row of a Parquet file. Each source
(`pipelines.data.sources`, `madr.data.beir`, `madr.data.trec`) turns a parsed row into one normalised
row of its task's schema through a `Fields` accessor, raising `BadRow(reason, field, detail)` for a
malformed row (it goes to quarantine) or `SkipRow(reason)` for an expected, well-formed row that carries
no training signal (SNLI's '-' label, a WikiMatrix pair under the score threshold, a blank line).
Every input row is counted exactly once: rows = good + skipped + quarantined.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# reason -> what it means (a quarantined row carries the reason, the field and a detail)
REASONS = {
    "bad_utf8": "the line is not valid UTF-8 (or a JSON string holds an unpaired surrogate)",
    "bad_json": "the line is not one JSON object",
    "bad_columns": "a TSV line with the wrong number of columns",
    "missing_field": "a required field is absent or null",
    "wrong_type": "a field has the wrong type",
    "empty_text": "a text field is empty or only whitespace",
    "too_long": "a text field is longer than max_chars",
    "unknown_label": "a label (or category) outside the source's set",
    "bad_value": "a number out of range, or fields that contradict each other",
    "unknown_id": "a judgment naming a query or document id that the queries or the corpus do not hold",
    "duplicate_id": "an id (or a judged query-document pair) that an earlier row of the same kind already has",
    "no_position": "a click-log click that its search shows no impression of and that carries no position",
    "no_query": "a click-log search without any query text (on its search event or its other events)",
}
# reason -> what it means (skipped rows are counted, not quarantined)
SKIPS = {
    "blank_line": "an empty line in a line format",
    "no_consensus": "NLI gold label '-' / -1: the annotators did not agree",
    "below_threshold": "a WikiMatrix pair whose margin score is below min_score",
    "unjudged": "a BEIR query that no qrels file of the read splits judges (no split to put it in)",
    "other_action": "a click-log event that is no search, impression, click or conversion (filters, sorts, hovers)",
}
TEXT_FORMATS = ("tsv", "trec")  # line formats whose cells are all text (numbers are parsed from it)

_SURROGATE = re.compile("[\ud800-\udfff]")
MISSING = object()  # what Fields.find returns for an absent or null field


class BadRow(ValueError):
    """A malformed row: `reason` (a key of REASONS), the `field` at fault ('' for the whole row), a detail."""

    def __init__(self, reason: str, field: str, detail: str) -> None:
        super().__init__(f"field {field!r}: {reason}: {detail}" if field else f"{reason}: {detail}")
        self.reason, self.field, self.detail = reason, field, detail


class SkipRow(Exception):
    """A well-formed row without training signal; `reason` is a key of SKIPS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StrictModeError(ValueError):
    """Strict ingestion stopped at a bad row; the message names the file, the row and the field."""


def origin_text(file: str, row: int, line_format: bool) -> str:
    """'<file>: line <n>' (1-based, header included) for JSONL/TSV, '<file>: row <i>' (0-based) for Parquet."""
    return f"{file}: line {row}" if line_format else f"{file}: row {row}"


def strict_message(file: str, row: int, line_format: bool, err: BadRow) -> str:
    field = f"field {err.field!r}" if err.field else "whole row"
    return f"{origin_text(file, row, line_format)}: {field}: {err.reason}: {err.detail}"


class Fields:
    """Typed access to one parsed row, raising `BadRow` with the row's own column name.

    `names` arguments are the accepted column names of one field, the source's native name first (it is
    the name reported when the field is missing). `typed=False` (TSV: every cell is a string) lets numeric
    fields be parsed from text and treats an empty cell of an optional number as absent.
    """

    def __init__(self, row: Mapping[str, Any], max_chars: int, typed: bool = True,
                 check_surrogates: bool = False) -> None:
        self.row = row
        self.max_chars = max_chars
        self.typed = typed
        self.check_surrogates = check_surrogates
        self.used: set[str] = set()

    def find(self, names: Sequence[str]) -> tuple[str, Any]:
        """(name, value) of the first accepted name with a non-null value, else (names[0], MISSING)."""
        for name in names:
            value = self.row.get(name)
            if value is not None:
                self.used.add(name)
                return name, value
        self.used.update(n for n in names if n in self.row)
        return names[0], MISSING

    @staticmethod
    def _missing(names: Sequence[str]) -> BadRow:
        also = f" (also accepted: {', '.join(names[1:])})" if len(names) > 1 else ""
        return BadRow("missing_field", names[0], f"absent or null{also}")

    def text(self, names: Sequence[str], required: bool = True, allow_empty: bool = False) -> str | None:
        """A string field: a string, <= max_chars; blank -> "" if allow_empty, BadRow if required, else None."""
        name, value = self.find(names)
        if value is MISSING:
            if required:
                raise self._missing(names)
            return None
        if not isinstance(value, str):
            raise BadRow("wrong_type", name, f"expected a string, got {type(value).__name__} {_short(value)}")
        if not value.strip():
            if allow_empty:
                return ""
            if required:
                raise BadRow("empty_text", name, "is empty or whitespace")
            return None
        if len(value) > self.max_chars:
            raise BadRow("too_long", name, f"{len(value)} characters > max_chars={self.max_chars}")
        if self.check_surrogates and _SURROGATE.search(value):
            raise BadRow("bad_utf8", name, "holds an unpaired UTF-16 surrogate (not encodable as UTF-8)")
        return value

    def ident(self, names: Sequence[str], required: bool = False) -> str:
        """An id: a non-blank string or an integer, returned as a string ('' when optional and absent)."""
        name, value = self.find(names)
        if value is MISSING or value == "":
            if required:
                raise self._missing(names) if value is MISSING else BadRow("empty_text", name, "empty id")
            return ""
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise BadRow("wrong_type", name, f"expected a string or integer id, got {type(value).__name__}")
        value = str(value).strip()
        if not value and required:
            raise BadRow("empty_text", name, "empty id")
        return value

    def _numeric(self, names: Sequence[str], required: bool, parse: Callable[[str], Any],
                 kind: str) -> tuple[str, Any]:
        """(name, value) of a numeric field before its type checks: a TSV cell's text parsed by `parse`;
        value MISSING when the field is absent (or an empty TSV cell) and not `required`."""
        name, value = self.find(names)
        if value is MISSING or (value == "" and not self.typed):
            if required:
                raise self._missing(names) if value is MISSING else BadRow("empty_text", name, "empty cell")
            return name, MISSING
        if isinstance(value, str) and not self.typed:
            try:
                value = parse(value.strip())
            except ValueError:
                raise BadRow("wrong_type", name, f"expected {kind}, got {_short(value)}") from None
        return name, value

    def integer(self, names: Sequence[str], required: bool = False, minimum: int | None = None,
                default: int | None = None) -> int | None:
        """An integer field (an integral float is accepted; text only in TSV)."""
        name, value = self._numeric(names, required, int, "an integer")
        if value is MISSING:
            return default
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRow("wrong_type", name, f"expected an integer, got {type(value).__name__} {_short(value)}")
        if minimum is not None and value < minimum:
            raise BadRow("bad_value", name, f"{value} < {minimum}")
        return value

    def number(self, names: Sequence[str], required: bool = False) -> float | None:
        """A finite real number (text only in TSV)."""
        name, value = self._numeric(names, required, float, "a number")
        if value is MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRow("wrong_type", name, f"expected a number, got {type(value).__name__} {_short(value)}")
        if not math.isfinite(value):
            raise BadRow("bad_value", name, f"{value} is not finite")
        return float(value)

    def choice(self, names: Sequence[str], mapping: Mapping[str, Any], required: bool = True,
               skip: Mapping[str, str] | None = None) -> Any:
        """A label: its text form (stripped, lower-cased; integers as digits) looked up in `mapping`.

        `skip` maps label forms that mean "no usable label" to a SKIPS reason (raises SkipRow).
        """
        name, value = self.find(names)
        if value is MISSING:
            if required:
                raise self._missing(names)
            return None
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        if not isinstance(value, str | int):  # bool is an int: True/False -> "true"/"false"
            raise BadRow("wrong_type", name, f"expected a label string or integer, got {type(value).__name__}")
        key = str(value).strip().lower()
        if skip and key in skip:
            raise SkipRow(skip[key])
        if key not in mapping:
            known = sorted({str(k) for k in mapping})
            raise BadRow("unknown_label", name, f"{_short(value)} is not one of {known}")
        return mapping[key]

    def values(self, names: Sequence[str]) -> list[str]:
        """A multi-valued annotation: a string (one value), a list of strings, or absent/null/empty -> []."""
        name, value = self.find(names)
        if value is MISSING or value is None:
            return []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple):
            raise BadRow("wrong_type", name, f"expected a string or a list of strings, got {type(value).__name__}")
        out = []
        for v in value:
            if not isinstance(v, str):
                raise BadRow("wrong_type", name, f"list holds a {type(v).__name__} {_short(v)}, expected strings")
            if len(v) > self.max_chars:
                raise BadRow("too_long", name, f"value of {len(v)} characters > max_chars={self.max_chars}")
            if v.strip():
                out.append(v.strip())
        return out

    def string_map(self, names: Sequence[str]) -> dict[str, str] | None:
        """A JSON object of string -> string (None when absent)."""
        name, value = self.find(names)
        if value is MISSING:
            return None
        if isinstance(value, list) and all(isinstance(kv, tuple | list) and len(kv) == 2 for kv in value):
            value = dict(value)  # a Parquet map column
        if not isinstance(value, dict):
            raise BadRow("wrong_type", name, f"expected an object of strings, got {type(value).__name__}")
        out = {}
        for k, v in value.items():
            if not isinstance(v, str):
                raise BadRow("wrong_type", name, f"value of {k!r} is {type(v).__name__}, expected a string")
            if len(v) > self.max_chars:
                raise BadRow("too_long", name, f"value of {k!r}: {len(v)} characters > max_chars={self.max_chars}")
            if self.check_surrogates and _SURROGATE.search(v):
                raise BadRow("bad_utf8", name, f"value of {k!r} holds an unpaired UTF-16 surrogate")
            out[str(k)] = v
        return out

    def unused(self) -> dict[str, Any]:
        """Fields of the row no accessor asked for."""
        return {k: v for k, v in self.row.items() if k not in self.used}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- parsing one raw line -------------------------------------------------------------------------------
def parse_line(line: bytes, fmt: str, header: Sequence[str]) -> tuple[dict[str, Any], bool]:
    """One JSONL / TSV / TREC (whitespace-separated) line -> (row dict, whether its strings must be checked
    for lone surrogates)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRow("bad_utf8", "", f"byte {err.start}: {err.reason}") from None
    text = text.removesuffix("\r")
    if not text or text.isspace():  # what `not text.strip()` tests, without copying the line
        raise SkipRow("blank_line")
    if fmt == "jsonl":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise BadRow("bad_json", "", f"{err.msg} at column {err.colno}") from None
        if not isinstance(obj, dict):
            raise BadRow("bad_json", "", f"expected a JSON object, got {type(obj).__name__}")
        return obj, "\\u" in text or "\\U" in text
    cells = text.split() if fmt == "trec" else text.split("\t")
    if len(cells) != len(header):
        kind = "whitespace-separated" if fmt == "trec" else "tab-separated"
        raise BadRow("bad_columns", "", f"{len(cells)} {kind} columns, expected {len(header)} "
                                        f"({', '.join(header)})")
    return dict(zip(header, cells, strict=True)), False


@dataclass
class BlockResult:
    """What validating one block gives: normalised good rows, quarantine rows and the counts."""

    good: list[dict[str, Any]]
    good_rows: list[int]
    bad: list[dict[str, Any]]
    rows: int
    skipped: Counter
    quarantined: Counter


def raw_text(payload: Any, limit: int = 4000) -> str:
    """The raw row as text for the quarantine (bytes decoded with escapes, rows as JSON), truncated."""
    if isinstance(payload, bytes):
        text = payload.decode("utf-8", errors="backslashreplace")
    else:
        text = json.dumps(payload, ensure_ascii=False, default=str)
    text = text.encode("utf-8", errors="backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "...[truncated]"


def validate_rows(normalize: Any, options: Any, file: str, payloads: Sequence[Any], rows: Sequence[int],
                  fmt: str, header: Sequence[str], max_chars: int, source: str, strict: bool) -> BlockResult:
    """Parse, check and normalise the raw rows of one file (`payloads`: line bytes, or Parquet row dicts).

    Good rows come back normalised by `normalize(fields, options, file)`; a bad row becomes a quarantine
    row (source, file, row, line_format, reason, field, detail, raw), or, with `strict`, raises
    StrictModeError naming the file, the row and the field.
    """
    line_format = fmt != "parquet"
    result = BlockResult([], [], [], len(payloads), Counter(), Counter())
    for payload, row in zip(payloads, rows, strict=True):
        try:
            if line_format:
                parsed, surrogates = parse_line(payload, fmt, header)
            else:
                parsed, surrogates = payload, False
            fields = Fields(parsed, max_chars, typed=fmt not in TEXT_FORMATS, check_surrogates=surrogates)
            result.good.append(normalize(fields, options, file))
            result.good_rows.append(int(row))
        except SkipRow as skip:
            result.skipped[skip.reason] += 1
        except BadRow as err:
            if strict:
                raise StrictModeError(strict_message(file, row, line_format, err)) from None
            result.quarantined[err.reason] += 1
            result.bad.append({"source": source, "file": file, "row": int(row), "line_format": line_format,
                               "reason": err.reason, "field": err.field, "detail": err.detail,
                               "raw": raw_text(payload)})
    return result
