"""Aspect value vocabularies at phrase / word / token granularity.

Paper 000 Sec. 5: each aspect a (category, brand, color) has a finite value vocabulary V_a, collected from
the annotations after "filtering out some low-frequency aspect values" (Sec. 8.1); aspect learning
predicts value ids in V_a. Paper 001 Sec. 3 / 5.3.1 ("Multi-granularity value collection") decomposes the
phrase-level values into finer vocabularies V_a^g: "handmade products" -> words [handmade, products] ->
tokens [hand, ##made, products]. Words come from splitting by spaces and punctuation, tokens from the
BERT tokenizer, and duplicates are merged.

Conventions here:
- phrase = the normalised value (lowercase, whitespace collapsed, stripped);
- word = maximal runs of letters/digits of the phrase (`[^\\W_]+`, Unicode-aware);
- token = the tokenizer's pieces of the phrase, keeping only pieces with a letter or digit (a lone "-"
  or "&" is no aspect value) and dropping special tokens such as [UNK].
- Frequencies count documents (annotations) containing the piece, once per document and aspect; order is
  frequency descending, then alphabetical, so ids are deterministic.
- `encode` maps a multi-valued annotation to the sorted unique ids of its in-vocabulary pieces;
  out-of-vocabulary pieces are dropped.

A token vocabulary needs the tokenizer to decompose phrases. Every phrase seen when building is cached
with its pieces (`segments`, saved in the JSON), so a loaded vocabulary encodes known values without one;
for an unseen phrase it uses `tokenize` when given (`load(path, tokenize=...)` / `set_tokenize`), else a
greedy longest-match-first WordPiece over the vocabulary's own pieces (an approximation of the tokenizer).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

GRANULARITIES = ("phrase", "word", "token")
Tokenize = Callable[[str], list[str]]

_WORD = re.compile(r"[^\W_]+")
_FORMAT = "madr.aspect_vocabularies"
_VERSION = 1


def normalize_value(value: str) -> str:
    """The phrase form of an aspect value: lowercase, internal whitespace collapsed, stripped."""
    if not isinstance(value, str):
        raise ValueError(f"aspect value must be a string, got {type(value).__name__}: {value!r}")
    return " ".join(value.lower().split())


def split_words(value: str) -> list[str]:
    """Word granularity: the phrase split by whitespace and punctuation (paper 001 Sec. 5.3.1)."""
    return _WORD.findall(normalize_value(value))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _is_value_piece(piece: str) -> bool:
    """A token piece that can be a value: has a letter or digit and is not a special token like [UNK]."""
    if len(piece) > 2 and piece.startswith("[") and piece.endswith("]"):
        return False
    return any(ch.isalnum() for ch in piece.removeprefix("##"))


def value_pieces(value: str, granularity: str, tokenize: Tokenize | None = None) -> list[str]:
    """The unique pieces of one aspect value at `granularity`, in order of appearance."""
    _check_granularity(granularity)
    phrase = normalize_value(value)
    if not phrase:
        return []
    if granularity == "phrase":
        return [phrase]
    if granularity == "word":
        return _unique(split_words(phrase))
    if tokenize is None:
        raise ValueError("token granularity needs a tokenize callable (e.g. tokenizer.tokenize)")
    return _unique(p for p in tokenize(phrase) if _is_value_piece(p))


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")


def _check_values(values: object, where: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ValueError(
            f"{where}: aspect annotation must be a list of strings, got {type(values).__name__}: {values!r}"
        )
    for v in values:
        if not isinstance(v, str):
            raise ValueError(f"{where}: aspect value must be a string, got {type(v).__name__}: {v!r}")
    return list(values)


def _greedy_wordpiece(phrase: str, vocab: Mapping[str, int]) -> list[str]:
    """Longest-match-first WordPiece of each word of `phrase` against `vocab` (words with no match: none)."""
    pieces: list[str] = []
    for word in re.findall(r"[^\W_]+|[^\w\s]", phrase):
        start, out = 0, []
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                out = []
                break
            out.append(("##" if start else "") + word[start:end])
            start = end
        pieces.extend(out)
    return pieces


class AspectVocabulary:
    """V_a^g: the ordered values of one aspect at one granularity (paper 001 Table 1)."""

    def __init__(
        self,
        aspect: str,
        granularity: str,
        values: Sequence[str],
        counts: Sequence[int] | None = None,
        tokenize: Tokenize | None = None,
        segments: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        _check_granularity(granularity)
        if not aspect:
            raise ValueError("AspectVocabulary: aspect name must be non-empty")
        values = list(values)
        for i, v in enumerate(values):
            if not isinstance(v, str) or not v:
                raise ValueError(
                    f"AspectVocabulary {aspect}/{granularity}: value {i} must be a non-empty string, "
                    f"got {v!r}"
                )
        dup = [v for v, n in Counter(values).items() if n > 1]
        if dup:
            raise ValueError(f"AspectVocabulary {aspect}/{granularity}: duplicate values {sorted(dup)[:5]}")
        if counts is not None and len(counts) != len(values):
            raise ValueError(
                f"AspectVocabulary {aspect}/{granularity}: {len(counts)} counts for {len(values)} values"
            )
        self.aspect = aspect
        self.granularity = granularity
        self.values = values
        self.counts = [int(c) for c in counts] if counts is not None else None
        self.index = {v: i for i, v in enumerate(values)}
        self.tokenize = tokenize
        self.segments = {k: list(v) for k, v in (segments or {}).items()}

    def __len__(self) -> int:
        return len(self.values)

    def __contains__(self, piece: object) -> bool:
        return piece in self.index

    def __repr__(self) -> str:
        return f"AspectVocabulary({self.aspect!r}, {self.granularity!r}, {len(self)} values)"

    def pieces(self, value: str) -> list[str]:
        """The pieces of one phrase-level value at this vocabulary's granularity (in vocabulary or not)."""
        if self.granularity != "token":
            return value_pieces(value, self.granularity)
        phrase = normalize_value(value)
        if phrase in self.segments:
            return list(self.segments[phrase])
        if self.tokenize is not None:
            return value_pieces(phrase, "token", self.tokenize)
        return _unique(_greedy_wordpiece(phrase, self.index))

    def encode(self, values: Sequence[str]) -> list[int]:
        """A multi-valued annotation -> sorted unique ids of its in-vocabulary pieces (OOV pieces dropped)."""
        values = _check_values(values, f"{self.aspect}/{self.granularity}")
        ids = {self.index[p] for v in values for p in self.pieces(v) if p in self.index}
        return sorted(ids)

    def decode(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.values):
                raise ValueError(
                    f"AspectVocabulary {self.aspect}/{self.granularity}: id {i} out of range "
                    f"[0, {len(self.values)})"
                )
            out.append(self.values[i])
        return out

    def to_dict(self) -> dict:
        d: dict = {"aspect": self.aspect, "granularity": self.granularity, "values": list(self.values)}
        if self.counts is not None:
            d["counts"] = list(self.counts)
        if self.segments:
            d["segments"] = {k: list(v) for k, v in sorted(self.segments.items())}
        return d

    @classmethod
    def from_dict(cls, d: Mapping, tokenize: Tokenize | None = None) -> AspectVocabulary:
        missing = [k for k in ("aspect", "granularity", "values") if k not in d]
        if missing:
            raise ValueError(f"AspectVocabulary.from_dict: missing keys {missing}")
        return cls(d["aspect"], d["granularity"], d["values"], d.get("counts"), tokenize, d.get("segments"))


class AspectVocabularies:
    """All V_a^g, keyed by (aspect, granularity)."""

    def __init__(self, vocabularies: Iterable[AspectVocabulary]) -> None:
        self._vocabs: dict[tuple[str, str], AspectVocabulary] = {}
        for v in vocabularies:
            key = (v.aspect, v.granularity)
            if key in self._vocabs:
                raise ValueError(f"AspectVocabularies: two vocabularies for {key}")
            self._vocabs[key] = v

    @property
    def aspects(self) -> list[str]:
        return _unique(a for a, _ in self._vocabs)

    @property
    def granularities(self) -> list[str]:
        return _unique(g for _, g in self._vocabs)

    def __len__(self) -> int:
        return len(self._vocabs)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._vocabs)

    def __contains__(self, key: object) -> bool:
        return key in self._vocabs

    def items(self) -> Iterator[tuple[tuple[str, str], AspectVocabulary]]:
        return iter(self._vocabs.items())

    def get(self, aspect: str, granularity: str) -> AspectVocabulary:
        try:
            return self._vocabs[(aspect, granularity)]
        except KeyError:
            raise ValueError(
                f"no aspect vocabulary for ({aspect!r}, {granularity!r}); have {list(self._vocabs)}"
            ) from None

    def encode(self, aspects: Mapping[str, Sequence[str]], granularity: str) -> dict[str, list[int]]:
        """One document's annotations -> {aspect: ids} for every aspect with a `granularity` vocabulary."""
        _check_granularity(granularity)
        return {a: v.encode(aspects.get(a, [])) for (a, g), v in self._vocabs.items() if g == granularity}

    def set_tokenize(self, tokenize: Tokenize | None) -> None:
        """Use `tokenize` for token-granularity phrases not seen when building."""
        for v in self._vocabs.values():
            v.tokenize = tokenize

    def to_dict(self) -> dict:
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "vocabularies": [v.to_dict() for v in self._vocabs.values()],
        }

    @classmethod
    def from_dict(cls, d: Mapping, tokenize: Tokenize | None = None) -> AspectVocabularies:
        if d.get("format") != _FORMAT or d.get("version") != _VERSION:
            raise ValueError(
                f"not a {_FORMAT} v{_VERSION} document (format={d.get('format')!r}, "
                f"version={d.get('version')!r})"
            )
        return cls(AspectVocabulary.from_dict(v, tokenize) for v in d["vocabularies"])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, tokenize: Tokenize | None = None) -> AspectVocabularies:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
        try:
            return cls.from_dict(data, tokenize)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


def build_vocabularies(
    annotations: Iterable[Mapping[str, Sequence[str]]],
    aspects: Sequence[str],
    granularities: Sequence[str] = GRANULARITIES,
    tokenize: Tokenize | None = None,
    min_freq: int = 1,
    max_size: int | None = None,
) -> AspectVocabularies:
    """Collect V_a^g for every aspect and granularity from query/item annotations (paper 001 Sec. 5.3.1).

    A piece is kept when at least `min_freq` annotations contain it (paper 000 Sec. 8.1 filters
    low-frequency values); at most `max_size` pieces per vocabulary, the most frequent first.
    """
    granularities = list(granularities)
    for g in granularities:
        _check_granularity(g)
    if "token" in granularities and tokenize is None:
        raise ValueError("build_vocabularies: the token granularity needs a tokenize callable")
    if min_freq < 1 or (max_size is not None and max_size < 1):
        raise ValueError(
            f"build_vocabularies: min_freq and max_size must be >= 1, got {min_freq}, {max_size}"
        )
    counts = {(a, g): Counter() for a in aspects for g in granularities}
    segments: dict[str, dict[str, list[str]]] = {a: {} for a in aspects}
    for n, ann in enumerate(annotations):
        for a in aspects:
            values = _check_values(ann.get(a, []), f"annotation {n}, aspect {a!r}")
            phrases = _unique(p for p in (normalize_value(v) for v in values) if p)
            for g in granularities:
                if g == "token":
                    for p in phrases:
                        if p not in segments[a]:
                            segments[a][p] = value_pieces(p, "token", tokenize)
                    pieces = _unique(t for p in phrases for t in segments[a][p])
                else:
                    pieces = _unique(t for p in phrases for t in value_pieces(p, g))
                counts[(a, g)].update(pieces)
    vocabs = []
    for (a, g), counter in counts.items():
        kept = sorted(((p, c) for p, c in counter.items() if c >= min_freq), key=lambda pc: (-pc[1], pc[0]))
        kept = kept[:max_size] if max_size is not None else kept
        vocabs.append(
            AspectVocabulary(
                a,
                g,
                [p for p, _ in kept],
                [c for _, c in kept],
                tokenize,
                segments[a] if g == "token" else None,
            )
        )
    return AspectVocabularies(vocabs)
