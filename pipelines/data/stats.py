"""Aspect statistics of a corpus: paper 000 Table 3 / paper 001 Table 2.

For each side (queries, items) and aspect: the percentage of documents with at least one non-empty aspect
value (paper 000 Table 3: "percentage of queries and documents having aspect annotations"); for each
aspect: the vocabulary size at each granularity (paper 001 Table 2: "(phrase, word, token)"). Coverage is
`map_batches` partial sums reduced on the driver; vocabulary sizes come from an `AspectVocabularies`
(e.g. `build_vocabularies_ray`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset

from madr.modeling.aspect_vocabulary import GRANULARITIES, AspectVocabularies, normalize_value
from pipelines.data.batched import map_batches


def _masks(batch: pa.Table, aspects: Sequence[str]) -> np.ndarray:
    """Per row, a bit mask: bit i set when aspect i has at least one non-empty value."""
    masks = np.zeros(batch.num_rows, dtype=np.int64)
    for i, a in enumerate(aspects):
        if a not in batch.column_names:
            raise ValueError(f"aspect column {a!r} is missing; columns are {batch.column_names}")
        has = [any(normalize_value(v) for v in (values or [])) for values in batch.column(a).to_pylist()]
        masks |= np.array(has, dtype=np.int64) << i
    return masks


def _partial(batch: pa.Table, aspects: Sequence[str], key: str | None) -> pa.Table:
    """Partial coverage of one batch: (documents, has_<aspect> sums), or (key, mask) rows to deduplicate."""
    masks = _masks(batch, aspects)
    if key is not None:
        return pa.table({"key": pa.array([str(k) for k in batch.column(key).to_pylist()]), "mask": masks})
    return pa.table({"documents": [batch.num_rows],
                     **{f"has_{a}": [int(((masks >> i) & 1).sum())] for i, a in enumerate(aspects)}})


def coverage(ds: Dataset | pa.Table, aspects: Sequence[str], key: str | None = None) -> tuple[int, dict[str, float]]:
    """(documents, {aspect: fraction of documents with at least one non-empty value}).

    `map_batches` computes partial sums per batch (of a Ray Dataset, or of a table in this process:
    `pipelines.data.batched`); the driver adds them up (a global `Dataset.aggregate`
    gives the same result far more slowly). With `key` (e.g. product_id, when items repeat over
    query-item pairs) each distinct key is one document, annotated if any of its rows is.
    """
    partial = map_batches(ds, _partial, {"aspects": list(aspects), "key": key})
    if key is None:
        totals = dict.fromkeys(["documents"] + [f"has_{a}" for a in aspects], 0)
        for batch in partial:
            for name in totals:
                totals[name] += int(pc.sum(batch.column(name)).as_py() or 0)
        docs, counts = totals["documents"], [totals[f"has_{a}"] for a in aspects]
    else:
        masks: dict[str, int] = {}
        for batch in partial:
            for k, m in zip(batch.column("key").to_pylist(), batch.column("mask").to_pylist(), strict=True):
                masks[k] = masks.get(k, 0) | m
        docs = len(masks)
        counts = [sum((m >> i) & 1 for m in masks.values()) for i in range(len(aspects))]
    return docs, {a: (c / docs if docs else 0.0) for a, c in zip(aspects, counts, strict=True)}


@dataclass
class AspectStats:
    """Coverage per side and aspect, documents per side, vocabulary sizes per aspect and granularity."""

    aspects: list[str]
    documents: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, dict[str, float]] = field(default_factory=dict)
    vocab_sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"aspects": self.aspects, "documents": self.documents, "coverage": self.coverage,
                "vocab_sizes": self.vocab_sizes}

    def format(self) -> str:
        """Paper 001 Table 2 layout: aspect | coverage per side | (phrase, word, token) vocabulary sizes."""
        sides = list(self.coverage)
        head = ["aspect"] + [f"{s} ({self.documents[s]})" for s in sides]
        if self.vocab_sizes:
            head.append("vocabulary (" + ", ".join(g for g in GRANULARITIES
                                                   if any(g in v for v in self.vocab_sizes.values())) + ")")
        rows = [head]
        for a in self.aspects:
            row = [a] + [f"{100 * self.coverage[s][a]:.1f}%" for s in sides]
            if self.vocab_sizes:
                sizes = self.vocab_sizes.get(a, {})
                row.append("(" + ", ".join(_short(sizes[g]) for g in GRANULARITIES if g in sizes) + ")")
            rows.append(row)
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _short(n: int) -> str:
    return f"{n / 1000:.0f}k" if n >= 10_000 else (f"{n / 1000:.1f}k" if n >= 1000 else str(n))


def aspect_stats(sides: Mapping[str, Dataset | pa.Table], aspects: Sequence[str],
                 vocabularies: AspectVocabularies | None = None,
                 keys: Mapping[str, str] | None = None) -> AspectStats:
    """Coverage of every side (name -> Dataset of annotated documents; `keys[side]` deduplicates that side
    by a column) and the vocabulary sizes."""
    if not sides:
        raise ValueError("aspect_stats: give at least one side (e.g. {'item': items, 'query': queries})")
    stats = AspectStats(list(aspects))
    for side, ds in sides.items():
        stats.documents[side], stats.coverage[side] = coverage(ds, aspects, (keys or {}).get(side))
    if vocabularies is not None:
        for (a, g), vocab in vocabularies.items():
            if a in aspects:
                stats.vocab_sizes.setdefault(a, {})[g] = len(vocab)
    return stats
