"""Tokenisation of normalised task rows on a CPU actor pool, with optional length bucketing.

Each task has two text sides (`TASK_SIDES`: NLI premise / hypothesis, click query / document, parallel
source / target, evidence question / evidence, aspect query / product) and a few numeric targets
(`label_id`, `clicked`, ...). `tokenize_table` turns a batch of one task into int columns only:
`<side>_input_ids` as ragged list<int32> (special tokens added, truncated to `max_length`, no padding) plus
the targets; strings are dropped, because `iter_torch_batches` cannot carry them.

Padding is done per training batch (`pad_batch` / `collate_to_torch`), so a batch is only as wide as its
longest row. Length bucketing (`bucket=True`) sorts each window of `window` rows by length before it
leaves the tokeniser: consecutive rows then have similar lengths and batches cut from the stream carry
little padding (do not combine it with a local shuffle, which would undo it).

`tokenize_dataset` runs `Tokenize` with `compute=ActorPoolStrategy(min_size=1, max_size=N)`: the tokenizer
is loaded once per actor from a path (`madr.tokenization.load_tokenizer`), not once per batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import ray
from ray.data import Dataset

from madr.data.records import EVIDENCE_SOURCES, NLI_LABELS
from pipelines.data.sources import DOC_FIELDS, TASK_SCHEMAS

ESCI_LABELS = ("E", "S", "C", "I")
_FIELD_ORDER = {name: i for i, name in enumerate(DOC_FIELDS)}


def _column(name: str) -> Callable[[pa.Table], list[str]]:
    return lambda table: table.column(name).to_pylist()


def _document(table: pa.Table) -> list[str]:
    """A click document's fields joined in title, description, body, url order (others after)."""
    out = []
    for pairs in table.column("fields").to_pylist():
        ordered = sorted(pairs, key=lambda kv: (_FIELD_ORDER.get(kv[0], len(_FIELD_ORDER)), kv[0]))
        out.append(" ".join(v for _, v in ordered))
    return out


def _product(table: pa.Table) -> list[str]:
    titles, descriptions = table.column("title").to_pylist(), table.column("description").to_pylist()
    return [f"{t} {d}".strip() for t, d in zip(titles, descriptions, strict=True)]


# task -> ((side name, text getter), (side name, text getter))
TASK_SIDES: dict[str, tuple[tuple[str, Callable[[pa.Table], list[str]]], ...]] = {
    "nli": (("premise", _column("premise")), ("hypothesis", _column("hypothesis"))),
    "click": (("query", _column("query")), ("document", _document)),
    "parallel": (("source", _column("source")), ("target", _column("target"))),
    "evidence": (("question", _column("question")), ("evidence", _column("evidence"))),
    "aspect": (("query", _column("query")), ("product", _product)),
}


def _index(values: list[Any], vocabulary: tuple[str, ...]) -> np.ndarray:
    lookup = {v: i for i, v in enumerate(vocabulary)}
    return np.array([lookup[v] for v in values], dtype=np.int8)


def _targets(table: pa.Table, task: str) -> dict[str, np.ndarray]:
    """The numeric columns a task's loss needs (unknown position 0, unknown relevance -1, no score NaN)."""
    col = lambda name: table.column(name).to_pylist()  # noqa: E731
    if task == "nli":
        return {"label_id": _index(col("label"), NLI_LABELS)}
    if task == "click":
        return {"clicked": np.array(col("clicked"), dtype=np.int8),
                "position": np.array([p or 0 for p in col("position")], dtype=np.int32),
                "clicks": np.array(col("clicks"), dtype=np.int32),
                "impressions": np.array(col("impressions"), dtype=np.int32),
                "relevance": np.array([-1 if r is None else r for r in col("relevance")], dtype=np.int32)}
    if task == "parallel":
        return {"score": np.array([np.nan if s is None else s for s in col("score")], dtype=np.float32)}
    if task == "evidence":
        return {"label": np.array(col("label"), dtype=np.int8), "source_id": _index(col("source"), EVIDENCE_SOURCES)}
    return {"relevance": np.array(col("relevance"), dtype=np.int8), "esci_id": _index(col("esci"), ESCI_LABELS)}


def _ragged(ids: list[list[int]]) -> pa.ListArray:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


Encoder = Callable[[list[str]], list[list[int]]]


def make_encoder(tokenizer: Any, max_length: int) -> Encoder:
    """texts -> token ids with special tokens, truncated to `max_length`, unpadded.

    For a fast tokenizer this calls a private copy of its Rust backend with truncation set once (the
    `transformers` call builds a BatchEncoding per call, about 30% slower here); the ids are the same as
    `tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        def slow(texts: list[str]) -> list[list[int]]:
            return tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                             return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return slow
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.no_padding()
    own.enable_truncation(max_length)
    return lambda texts: [e.ids for e in own.encode_batch(texts, add_special_tokens=True)]


def tokenize_table(table: pa.Table, tokenizer: Any, task: str, max_length: int = 128,
                   bucket: bool = False, encoder: Encoder | None = None) -> pa.Table:
    """One batch of normalised `task` rows -> `<side>_input_ids` (list<int32>) + the task's numeric targets.

    `encoder` (from `make_encoder(tokenizer, max_length)`) is built per call when not given."""
    if task not in TASK_SIDES:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASK_SIDES)}")
    missing = [n for n in TASK_SCHEMAS[task].names if n not in table.column_names]
    if missing:
        raise ValueError(f"tokenize_table: a {task} batch lacks columns {missing}")
    encode = encoder or make_encoder(tokenizer, max_length)
    columns: dict[str, Any] = {}
    lengths = np.zeros(table.num_rows, dtype=np.int64)
    for side, texts in TASK_SIDES[task]:
        array = _ragged(encode(texts(table)))
        lengths = np.maximum(lengths, np.diff(array.offsets.to_numpy()))
        columns[f"{side}_input_ids"] = array
    columns.update({k: pa.array(v) for k, v in _targets(table, task).items()})
    out = pa.table(columns)
    if bucket:
        out = out.take(pa.array(np.argsort(lengths, kind="stable")))
    return out


class Tokenize:
    """`map_batches` callable for an actor pool: the tokenizer is loaded once, when the actor starts."""

    def __init__(self, tokenizer: str, task: str, max_length: int = 128, bucket: bool = False,
                 threads: bool = False) -> None:
        if not threads:  # one actor per core: no extra Rust threads fighting the other actors
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from madr.tokenization import load_tokenizer

        self.tokenizer = load_tokenizer(tokenizer)
        self.encoder = make_encoder(self.tokenizer, max_length)
        self.task, self.max_length, self.bucket = task, max_length, bucket

    def __call__(self, batch: pa.Table) -> pa.Table:
        return tokenize_table(batch, self.tokenizer, self.task, self.max_length, self.bucket, self.encoder)


def tokenize_dataset(ds: Dataset, task: str, tokenizer: str | os.PathLike, *, max_length: int = 128,
                     window: int = 2048, bucket: bool = False, max_actors: int | None = None,
                     num_cpus: float = 1.0) -> Dataset:
    """`ds` (normalised `task` rows) tokenised on an autoscaling pool of 1..`max_actors` CPU actors
    (default: the cluster's CPUs); `window` rows per call (the bucketing window)."""
    if task not in TASK_SIDES:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASK_SIDES)}")
    if window < 1 or max_length < 2:
        raise ValueError(f"need window >= 1 and max_length >= 2, got {window}, {max_length}")
    max_actors = max_actors or max(1, int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-3)))
    return ds.map_batches(
        Tokenize, fn_constructor_kwargs={"tokenizer": str(tokenizer), "task": task, "max_length": max_length,
                                         "bucket": bucket},
        batch_size=window, batch_format="pyarrow", num_cpus=num_cpus, udf_modifying_row_count=False,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max_actors))


def pad_batch(batch: Mapping[str, Any], pad_id: int = 0) -> dict[str, np.ndarray]:
    """Ragged `*_input_ids` columns -> int64 [batch, longest] arrays (right-padded with `pad_id`) plus
    `*_attention_mask`; other columns pass through as numpy arrays."""
    out: dict[str, np.ndarray] = {}
    for name, column in batch.items():
        if not name.endswith("_input_ids"):
            out[name] = np.asarray(column)
            continue
        rows = list(column)
        width = max((len(r) for r in rows), default=0)
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        out[name] = ids
        out[name.removesuffix("_input_ids") + "_attention_mask"] = mask
    return out


def collate_to_torch(batch: Mapping[str, Any], pad_id: int = 0) -> dict[str, Any]:
    """`pad_batch` then torch tensors: a `collate_fn` for `iter_torch_batches` over tokenised rows."""
    import torch

    strings = [k for k, v in batch.items() if np.asarray(v).dtype.kind in "OUS" and not k.endswith("_input_ids")]
    if strings:
        raise ValueError(f"collate_to_torch: string columns {strings} cannot become tensors; drop them first")
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in pad_batch(batch, pad_id).items()}
