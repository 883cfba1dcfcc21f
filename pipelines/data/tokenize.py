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
is loaded once per actor, not once per batch. `pipelines.data.readers.read_tokenized` can instead run the
tokeniser inside the read tasks (rows then cross the object store once, as token ids).

Loading: `SharedEncoder` loads the tokenizer once on the driver (`madr.modeling.tokenization.load_tokenizer`, so
the ids are exactly the `transformers` tokenizer's) and ships its Rust backend (`tokenizers` JSON, with
truncation set) through the object store; each worker process rebuilds it once (`SharedEncoder.get`,
cached per process) with `tokenizers` alone, so a worker never imports `transformers` / `torch` (seconds
of CPU per process). Encoding uses `Tokenizer.encode_batch_fast` (no offsets: same ids, less work) on whole
batches.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


def _index(column: pa.ChunkedArray, vocabulary: tuple[str, ...]) -> np.ndarray:
    """Positions of the values in `vocabulary` (vectorised; a value outside it is an error)."""
    ids = pc.index_in(column, value_set=pa.array(vocabulary))
    if ids.null_count:
        unknown = pc.filter(column, pc.is_null(ids)).unique().to_pylist()
        raise ValueError(f"values {unknown[:5]} are not in {vocabulary}")
    return ids.to_numpy().astype(np.int8)


def _numbers(table: pa.Table, name: str, dtype: Any, fill: Any = None) -> np.ndarray:
    column = table.column(name)
    if fill is not None and column.null_count:
        column = pc.fill_null(column, fill)
    return column.to_numpy().astype(dtype)


def _targets(table: pa.Table, task: str) -> dict[str, np.ndarray]:
    """The numeric columns a task's loss needs (unknown position 0, unknown relevance -1, no score NaN)."""
    if task == "nli":
        return {"label_id": _index(table.column("label"), NLI_LABELS)}
    if task == "click":
        return {"clicked": _numbers(table, "clicked", np.int8),
                "position": _numbers(table, "position", np.int32, 0),
                "clicks": _numbers(table, "clicks", np.int32),
                "impressions": _numbers(table, "impressions", np.int32),
                "relevance": _numbers(table, "relevance", np.int32, -1)}
    if task == "parallel":
        return {"score": _numbers(table, "score", np.float32, float("nan"))}
    if task == "evidence":
        return {"label": _numbers(table, "label", np.int8),
                "source_id": _index(table.column("source"), EVIDENCE_SOURCES)}
    return {"relevance": _numbers(table, "relevance", np.int8), "esci_id": _index(table.column("esci"), ESCI_LABELS)}


def _ragged(ids: list[list[int]]) -> pa.ListArray:
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


Encoder = Callable[[list[str]], list[list[int]]]


def backend_state(tokenizer: Any, max_length: int) -> str | None:
    """The fast tokenizer's Rust backend as `tokenizers` JSON, truncating to `max_length`, unpadded
    (None for a slow, Python-only tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(backend.to_str())
    own.no_padding()
    own.enable_truncation(max_length)
    return own.to_str()


def encoder_from_state(state: str) -> Encoder:
    """texts -> ids of a backend JSON from `backend_state` (imports `tokenizers` only)."""
    from tokenizers import Tokenizer

    own = Tokenizer.from_str(state)
    encode = getattr(own, "encode_batch_fast", own.encode_batch)  # no offsets: same ids, faster
    return lambda texts: [e.ids for e in encode(texts, add_special_tokens=True)]


def make_encoder(tokenizer: Any, max_length: int) -> Encoder:
    """texts -> token ids with special tokens, truncated to `max_length`, unpadded.

    For a fast tokenizer this calls a private copy of its Rust backend with truncation set once (the
    `transformers` call builds a BatchEncoding per call, which is slower); the ids are the same as
    `tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]`.
    """
    state = backend_state(tokenizer, max_length)
    if state is None:
        def slow(texts: list[str]) -> list[list[int]]:
            return tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length,
                             return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return slow
    return encoder_from_state(state)


_ENCODERS: dict[str, Encoder] = {}  # per process: SharedEncoder key -> encoder


class SharedEncoder:
    """A tokenizer loaded once on the driver and rebuilt once per worker process, without `transformers`.

    `SharedEncoder(path_or_tokenizer, max_length)` loads the tokenizer (`load_tokenizer` for a path),
    keeps its backend JSON (`backend_state`) in the object store when Ray is running (one copy however many
    tasks or actors carry this object) and `get()` returns the process's cached encoder. A slow tokenizer
    (no Rust backend) is reloaded from its path with `transformers` in each process instead.
    """

    def __init__(self, tokenizer: Any, max_length: int = 128) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        path = str(tokenizer) if isinstance(tokenizer, str | os.PathLike) else None
        if path is not None:
            from madr.modeling.tokenization import load_tokenizer

            tokenizer = load_tokenizer(path)
        state = backend_state(tokenizer, max_length)
        if state is None and path is None:
            raise ValueError("SharedEncoder: a slow (non-Rust) tokenizer must be given by its path")
        self.max_length, self.path = max_length, path
        self.key = hashlib.sha1(f"{state or path}|{max_length}".encode()).hexdigest()
        self._state: Any = ray.put(state) if state is not None and ray.is_initialized() else state

    def get(self) -> Encoder:
        """This process's encoder (built on first use)."""
        encoder = _ENCODERS.get(self.key)
        if encoder is None:
            if self._state is None:
                from madr.modeling.tokenization import load_tokenizer

                encoder = make_encoder(load_tokenizer(self.path), self.max_length)
            else:
                state = self._state if isinstance(self._state, str) else ray.get(self._state)
                encoder = encoder_from_state(state)
            _ENCODERS[self.key] = encoder
        return encoder


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
    """`map_batches` callable for an actor pool: the tokenizer is loaded once, when the actor starts.

    `tokenizer`: a `SharedEncoder` (no `transformers` import in the actor) or a tokenizer path."""

    def __init__(self, tokenizer: SharedEncoder | str, task: str, max_length: int = 128, bucket: bool = False,
                 threads: bool = False) -> None:
        if not threads:  # one actor per core: no extra Rust threads fighting the other actors
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        shared = tokenizer if isinstance(tokenizer, SharedEncoder) else SharedEncoder(tokenizer, max_length)
        self.encoder = shared.get()
        self.task, self.max_length, self.bucket = task, shared.max_length, bucket

    def __call__(self, batch: pa.Table) -> pa.Table:
        return tokenize_table(batch, None, self.task, self.max_length, self.bucket, self.encoder)


def default_workers(num_cpus: float = 1.0) -> int:
    """How many `num_cpus` workers the cluster's CPUs hold (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1) // max(num_cpus, 1e-3)))


def tokenize_dataset(ds: Dataset, task: str, tokenizer: str | os.PathLike | SharedEncoder, *,
                     max_length: int = 128, window: int = 2048, bucket: bool = False,
                     max_actors: int | None = None, num_cpus: float = 1.0) -> Dataset:
    """`ds` (normalised `task` rows) tokenised on an autoscaling pool of 1..`max_actors` CPU actors
    (default: the cluster's CPUs); `window` rows per call (the bucketing window). A `SharedEncoder`
    carries its own `max_length`."""
    if task not in TASK_SIDES:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASK_SIDES)}")
    if window < 1 or max_length < 2:
        raise ValueError(f"need window >= 1 and max_length >= 2, got {window}, {max_length}")
    shared = tokenizer if isinstance(tokenizer, SharedEncoder) else SharedEncoder(tokenizer, max_length)
    return ds.map_batches(
        Tokenize, fn_constructor_kwargs={"tokenizer": shared, "task": task, "bucket": bucket},
        batch_size=window, batch_format="pyarrow", num_cpus=num_cpus, udf_modifying_row_count=False,
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=max_actors or default_workers(num_cpus)))


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
    return {k: torch.from_numpy(np.require(v, requirements=("C", "W"))) for k, v in pad_batch(batch, pad_id).items()}
