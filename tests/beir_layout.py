"""Test helper: a madr catalog written in the BEIR layout (corpus.jsonl, queries.jsonl, qrels/<split>.tsv),
aspect values in each line's `metadata` object, so that `madr.data.beir.read_beir` can read it back."""

from __future__ import annotations

import json
from pathlib import Path

from madr.data.schema import SPLITS, Catalog


def write_beir(catalog: Catalog, directory: Path) -> Path:
    """Write `catalog` as a BEIR directory: documents `_id` / `title` / `text` (= description), queries
    `_id` / `text` (+ `language` when not English), one qrels TSV per split that has judgments."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "corpus.jsonl", "w", encoding="utf-8") as f:
        for p in catalog.products:
            f.write(json.dumps({"_id": p.product_id, "title": p.title, "text": p.description,
                                "metadata": {a: p.aspects.get(a, []) for a in catalog.aspect_names}}) + "\n")
    with open(directory / "queries.jsonl", "w", encoding="utf-8") as f:
        for q in catalog.queries:
            row = {"_id": q.query_id, "text": q.text,
                   "metadata": {a: q.aspects.get(a, []) for a in catalog.aspect_names}}
            if q.language != "en":
                row["language"] = q.language
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    split_of = {q.query_id: q.split for q in catalog.queries}
    (directory / "qrels").mkdir(exist_ok=True)
    for split in SPLITS:
        rows = [j for j in catalog.judgments if split_of[j.query_id] == split]
        if rows:
            lines = ["query-id\tcorpus-id\tscore"] + [f"{j.query_id}\t{j.product_id}\t{j.relevance}" for j in rows]
            (directory / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory
