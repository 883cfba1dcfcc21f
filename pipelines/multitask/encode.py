"""Encode stage: the held-out English candidates through the served document tower into a sharded FAISS index.

The candidates are the distinct English sentences of the held-out translation pairs (the targets of the
cross-lingual retrieval of paper 004's evaluation): written as a Parquet corpus (`doc_id` = position in
`candidates`, `text`) and encoded by the existing batch job (`pipelines.encode.job.run_encode`: Ray Data
read -> tokenise actors -> encode actors -> `index.num_shards` shards of `index.index_factory` + manifest;
the model's document prefix, e.g. e5's "passage: ", is applied by the job's tokeniser).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from madr.data.records import MultilingualData
from pipelines.multitask.config import IndexSettings

CORPUS_DIR, INDEX_DIR = "candidates", "index"


def candidates(data: MultilingualData) -> list[str]:
    """The held-out English candidates, in first-seen order (as `encoder_metrics` ranks them)."""
    return list(dict.fromkeys(r.target for r in data.parallel_eval))


def write_corpus(texts: list[str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "part-00000.parquet"
    pq.write_table(pa.table({"doc_id": pa.array(range(len(texts)), pa.int64()), "text": texts}), path)
    return path


def run_index(model_dir: str, data: MultilingualData, settings: IndexSettings, output_dir: Path,
              log: Any = print, local: bool = False) -> Any:
    """Write the corpus and run the encode job on the current Ray cluster (`local`: in this process); returns its
    `EncodeResult`."""
    from madr.encode_config import EncodeConfig
    from pipelines.encode.job import run_encode

    texts = candidates(data)
    corpus = write_corpus(texts, output_dir / CORPUS_DIR)
    shards = min(settings.num_shards, len(texts))
    # a shard is a run of whole read pieces: pieces no larger than a shard's share
    rows_per_read = min(settings.rows_per_read, -(-len(texts) // shards))
    cfg = EncodeConfig(input=[str(corpus)], output=str(output_dir / INDEX_DIR), model_dir=model_dir,
                       text_columns=["text"], num_shards=shards,
                       index_factory=settings.index_factory, batch_size=settings.batch_size,
                       rows_per_read=rows_per_read, encode_actors=settings.encode_actors,
                       tokenize_actors=settings.tokenize_actors, lexical=None, lexical_tokenizer=None,
                       overwrite=True, replace_other_job=True)
    return run_encode(cfg, log=log, local=local)
