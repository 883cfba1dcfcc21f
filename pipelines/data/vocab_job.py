"""Aspect value vocabularies (phrase / word / token) over a whole corpus with Ray Data aggregations.

Paper 001 Sec. 5.3.1 ("multi-granularity value collection") / paper 000 Sec. 8.1: V_a^g is collected
from the query and item annotations. This job computes exactly what `madr.modeling.aspect_vocabulary.
build_vocabularies` computes in process, at corpus scale:

1. `map_batches(_piece_counts)`: per batch, the pieces of every annotation at every granularity, counted
   once per document and aspect (the same normalisation and splitting functions as the in-process
   builder; the tokenizer is loaded once per worker process), combined within the batch and emitted as
   partial counts (aspect, granularity, piece, n) -- a map-side combiner;
2. the final reduce, on the driver: the partial counts are streamed (`iter_batches`) and summed. They are
   vocabulary-sized per batch, not corpus-sized, and the vocabularies end up on the driver anyway. (A
   `groupby(...).sum("n")` does the same through a hash shuffle, far slower than the driver reduce on
   vocabulary-sized partial counts, so it is not used);
3. on the driver: the `min_freq` filter, the (-count, piece) order, the `max_size` cut, and the token
   segments of every phrase seen (what `build_vocabularies` caches).

Each row of the input Dataset is one annotated document (a query or an item) whose aspect columns are
list<string> (null = no value), as in the catalog layout of `madr.data.schema` and the `esci` source.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa
from ray.data import Dataset

from madr.modeling.aspect_vocabulary import (
    GRANULARITIES,
    AspectVocabularies,
    AspectVocabulary,
    normalize_value,
    value_pieces,
)
from pipelines.data.batched import map_batches


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    """One tokenizer per worker process (tasks reuse their worker processes)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from madr.modeling.tokenization import load_tokenizer

    return load_tokenizer(path)


def _annotation_values(values: Any, aspect: str, row: int) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, list | tuple):
        raise ValueError(f"row {row}, aspect {aspect!r}: expected a list of strings, got {type(values).__name__}")
    for v in values:
        if not isinstance(v, str):
            raise ValueError(f"row {row}, aspect {aspect!r}: aspect value must be a string, got {v!r}")
    return list(values)


def _piece_counts(batch: pa.Table, aspects: Sequence[str], granularities: Sequence[str],
                  tokenizer: str | None) -> pa.Table:
    """Partial document frequencies of the pieces of one batch of annotations."""
    tokenize = _tokenizer(tokenizer).tokenize if "token" in granularities else None
    missing = [a for a in aspects if a not in batch.column_names]
    if missing:
        raise ValueError(f"aspect columns {missing} are missing; columns are {batch.column_names}")
    counts: Counter = Counter()
    segments: dict[tuple[str, str], list[str]] = {}
    columns = {a: batch.column(a).to_pylist() for a in aspects}
    for a in aspects:
        for row, values in enumerate(columns[a]):
            phrases = list(dict.fromkeys(p for p in map(normalize_value, _annotation_values(values, a, row)) if p))
            if not phrases:
                continue
            for g in granularities:
                if g == "token":
                    for p in phrases:
                        if (a, p) not in segments:
                            segments[(a, p)] = value_pieces(p, "token", tokenize)
                    pieces = dict.fromkeys(t for p in phrases for t in segments[(a, p)])
                else:
                    pieces = dict.fromkeys(t for p in phrases for t in value_pieces(p, g))
                counts.update((a, g, t) for t in pieces)
    keys = list(counts)
    return pa.table({"aspect": pa.array([k[0] for k in keys], pa.string()),
                     "granularity": pa.array([k[1] for k in keys], pa.string()),
                     "piece": pa.array([k[2] for k in keys], pa.string()),
                     "n": pa.array([counts[k] for k in keys], pa.int64())})


def piece_frequencies(ds: Dataset | pa.Table, aspects: Sequence[str], granularities: Sequence[str],
                      tokenizer: str | None = None, batch_size: int = 4096) -> dict[tuple[str, str], Counter]:
    """{(aspect, granularity): Counter(piece -> number of documents containing it)} over `ds` (a Ray Dataset, or a
    `pyarrow.Table` counted in this process: `pipelines.data.batched`)."""
    partial = map_batches(ds, _piece_counts, {"aspects": list(aspects), "granularities": list(granularities),
                                              "tokenizer": tokenizer}, batch_size)
    out: dict[tuple[str, str], Counter] = {(a, g): Counter() for a in aspects for g in granularities}
    for batch in partial:
        for a, g, p, n in zip(*(batch.column(i).to_pylist() for i in range(4)), strict=True):
            out[(a, g)][p] += n
    return out


def build_vocabularies_ray(ds: Dataset | pa.Table, aspects: Sequence[str], granularities: Sequence[str] = GRANULARITIES,
                           tokenizer: str | os.PathLike | None = None, min_freq: int = 1,
                           max_size: int | None = None) -> AspectVocabularies:
    """`build_vocabularies` over a Dataset of annotations; `tokenizer` is a path for `load_tokenizer`
    (needed for the token granularity). The result equals the in-process one on the same annotations."""
    granularities = list(granularities)
    bad = [g for g in granularities if g not in GRANULARITIES]
    if bad:
        raise ValueError(f"granularities {bad} are not among {GRANULARITIES}")
    if "token" in granularities and tokenizer is None:
        raise ValueError("build_vocabularies_ray: the token granularity needs a tokenizer path")
    if min_freq < 1 or (max_size is not None and max_size < 1):
        raise ValueError(f"min_freq and max_size must be >= 1, got {min_freq}, {max_size}")
    if not aspects:
        raise ValueError("build_vocabularies_ray: give at least one aspect")
    needed = granularities + (["phrase"] if "token" in granularities and "phrase" not in granularities else [])
    path = None if tokenizer is None else str(tokenizer)
    freqs = piece_frequencies(ds, aspects, needed, path)
    tokenize = _tokenizer(path).tokenize if path is not None else None
    vocabs = []
    for a in aspects:
        segments = None
        if "token" in granularities:  # every phrase seen, with its pieces (build_vocabularies caches them)
            segments = {p: value_pieces(p, "token", tokenize) for p in sorted(freqs[(a, "phrase")])}
        for g in granularities:
            kept = sorted(((p, c) for p, c in freqs[(a, g)].items() if c >= min_freq), key=lambda pc: (-pc[1], pc[0]))
            kept = kept[:max_size] if max_size is not None else kept
            vocabs.append(AspectVocabulary(a, g, [p for p, _ in kept], [c for _, c in kept], tokenize,
                                           segments if g == "token" else None))
    return AspectVocabularies(vocabs)
