"""Query -> top-k over a sharded index, as a Ray Data actor (shared by the evaluation and mining jobs).

``SearchQueries`` loads the model and opens the ``ShardedIndex`` once per actor (memory-mapped where the
index type allows it, so several actors on one node share the page cache), encodes a batch of query
texts (``madr.index.encode_queries``) and searches all shards (``madr.search.sharded``): dense, or hybrid
(paper 002 Eq. 1) when the index has sparse shards and the model is hybrid, or dense + BM25 fusion when the
index has a lexical part (``madr.index.lexical``). ``DocKeys`` maps index ids to the display key that
qrels use (e.g. a product id) through the index's docs table. A run's settings are a
``madr.search.spec.SearchSpec``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from madr.search.params import SearchParams
from madr.search.spec import SearchSpec


def resolve_model_dir(spec: SearchSpec) -> str:
    from madr.index import Manifest

    if spec.model_dir:
        return spec.model_dir
    m = Manifest.load(spec.index)
    if not m.model_dir:
        raise ValueError(f"{spec.index}: the manifest names no model_dir; set model_dir for run {spec.name!r}")
    return m.model_dir


class SearchQueries:
    """``map_batches`` actor: (query_id, text) -> (query_id, ids list<int64>, scores list<float32>)."""

    def __init__(self, spec: dict[str, Any], k: int, torch_threads: int | None = 1, mmap: bool = True) -> None:
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.spec, self.k = SearchSpec(**spec), k
        model_dir = resolve_model_dir(self.spec)
        self.model, self.index = opened(model_dir, str(self.spec.index), mmap)
        self.encoder = query_encoder(self.model, self.spec.encoder_backend, self.spec.encoder_precision)
        self.model_key = encoder_key(model_dir, self.spec)

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        vectors = query_vectors(self.model, self.encoder, self.model_key, texts)
        scores, ids = search_texts(self.model, self.index, texts, self.k, self.spec, self.encoder, vectors)
        return pa.table({"query_id": batch.column("query_id"),
                         "ids": pa.array(list(ids), pa.list_(pa.int64())),
                         "scores": pa.array(list(scores), pa.list_(pa.float32()))})


def opened(model_dir: str, index: str, mmap: bool = True) -> tuple[Any, Any]:
    """(the model in eval mode, the opened ``ShardedIndex``), loaded once per process while neither is rewritten:
    the runs of one evaluation and its sweeps often share a model or an index (neither is changed by a search)."""
    return _opened(model_dir, index, mmap, _written_at(model_dir), _written_at(index))


def _written_at(path: str) -> int:
    """The modification time of a model's config or an index's manifest (0 when there is none to read)."""
    p = Path(path)
    p = p / ("config.json" if (p / "config.json").is_file() else "manifest.json") if p.is_dir() else p
    return p.stat().st_mtime_ns if p.is_file() else 0


@functools.lru_cache(maxsize=2)
def _opened(model_dir: str, index: str, mmap: bool, *written_at: int) -> tuple[Any, Any]:
    from madr.modeling.model import BiEncoder
    from madr.search.sharded import ShardedIndex

    return BiEncoder.load(model_dir).eval(), ShardedIndex.open(index, mmap=mmap, verify=False)


_VECTORS: OrderedDict[tuple, tuple[np.ndarray, Any]] = OrderedDict()
VECTOR_BATCHES = 64  # batches of query vectors a process keeps (`query_vectors`)


def encoder_key(model_dir: str, spec: SearchSpec) -> tuple:
    """What a query's vectors depend on: the model (its directory, as last written) and the query encoder."""
    return model_dir, _written_at(model_dir), spec.encoder_backend, spec.encoder_precision


def query_vectors(model: Any, encoder: Any, key: tuple, texts: list[str]) -> tuple[np.ndarray, Any]:
    """(dense, sparse) vectors of ``texts`` (``encoder`` when given, else ``model``'s float towers), kept per process
    under (``key``, texts) for the last `VECTOR_BATCHES` batches, read-only: the runs of one evaluation that share
    a model (a run and its bm25 / dense / aspect references) and its sweep encode each batch of queries once."""
    at = (*key, tuple(texts))
    if at in _VECTORS:
        _VECTORS.move_to_end(at)
        return _VECTORS[at]
    dense, sparse = encode_texts(model, texts, encoder)
    dense = np.asarray(dense)
    dense.setflags(write=False)
    _VECTORS[at] = dense, sparse
    while len(_VECTORS) > VECTOR_BATCHES:
        _VECTORS.popitem(last=False)
    return dense, sparse


def encode_texts(model: Any, texts: list[str], encoder: Any = None) -> tuple[np.ndarray, Any]:
    """(dense, sparse) query vectors of ``texts``: with ``encoder`` (``query_encoder``'s) when given, else with
    ``model``'s float towers."""
    from madr.index import encode_queries

    return encode_queries(model, texts) if encoder is None else encoder.encode(texts)


def query_encoder(model: Any, backend: str, precision: str) -> Any:
    """None for torch fp32 (``search_texts`` encodes with the model itself); else the query encoder a Serve app
    with the same ``encoder_backend`` / ``encoder_precision`` builds (`madr.search.query_encoder.build_query_encoder`:
    int8 in torch, or the tower in onnxruntime, fp32 or int8)."""
    if (backend, precision) == ("torch", "fp32"):
        return None
    from madr.search.query_encoder import build_query_encoder

    return build_query_encoder(model, backend=backend, precision=precision)


def search_texts(model: Any, index: Any, texts: list[str], k: int, spec: SearchSpec, encoder: Any = None,
                 vectors: tuple[np.ndarray, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``texts`` (with ``encoder``, a `LeanQueryEncoder`, when given; else ``model``'s float towers; or take
    their (dense, sparse) ``vectors``) and search ``index`` with ``spec``'s settings: (scores [Q, k], ids [Q, k]);
    with ``spec.aspect_filter`` the top ``k`` are then filtered / boosted by each query's predicted aspect values
    (``apply_aspect_filter``)."""
    dense, sparse = encode_texts(model, texts, encoder) if vectors is None else vectors
    if getattr(index, "has_lexical", False):  # dense + BM25 fusion (madr.index.lexical)
        params = spec.search.replace(k=k)
        aspects = query_aspects(model, index, texts, params, spec)
        top = index.search(dense, params, lexical=index.query_terms(model.tokenizer, texts), aspects=aspects)
    else:
        params = search_params(spec, k, sparse is not None and index.has_sparse)
        aspects = query_aspects(model, index, texts, params, spec)
        top = index.search(dense, params, sparse=sparse if index.has_sparse else None, aspects=aspects)
    return apply_aspect_filter(top, aspects, index, spec, k)


def apply_aspect_filter(top: tuple[np.ndarray, np.ndarray], aspects: dict | None, index: Any, spec: SearchSpec,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
    """``top`` filtered / boosted by the queries' predicted values (``spec.aspect_filter``; unchanged without)."""
    if spec.aspect_filter is None:
        return top
    if aspects is None:
        raise ValueError(f"run {spec.name!r}: aspect_filter needs an index with aspect data ({spec.index} has none)")
    from madr.search.aspect_match import predicted_filter

    return predicted_filter(top, aspects, index.aspects, spec.aspect_confidence, spec.aspect_filter, k)


def query_aspects(model: Any, index: Any, texts: list[str], params: SearchParams, spec: SearchSpec) -> dict | None:
    """The queries' calibrated top-k aspect values when the search uses them (an index with aspect data, and an
    aspect weight > 0, `ShardedIndex.aspect_weight`, or an ``aspect_filter``), as the served query encoder
    computes them; else None."""
    if getattr(index, "aspects", None) is None:
        return None
    if index.aspect_weight(params) == 0 and spec.aspect_filter is None:
        return None
    from madr.modeling.aspect_distributions import encode_aspects

    return encode_aspects(model, texts, "query", int(index.manifest.aspects["k"]))


def search_params(spec: SearchSpec, k: int, hybrid: bool) -> SearchParams:
    """``spec.search`` at depth ``k``; dense-only (lam = 1) unless both the model and the index are hybrid."""
    return spec.search.replace(k=k, **({} if hybrid else {"lam": 1.0}))


def search_dataset(queries: pa.Table, spec: SearchSpec, k: int, actors: int = 1, batch_size: int = 256,
                   num_cpus: float = 1.0) -> Any:
    """A Ray Dataset of search results of ``queries`` (query_id, text) on an actor pool."""
    import ray

    ds = ray.data.from_arrow(queries)
    return ds.map_batches(SearchQueries, fn_constructor_kwargs={"spec": dataclasses.asdict(spec), "k": k},
                          batch_size=batch_size, batch_format="pyarrow", num_cpus=num_cpus,
                          compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors))


def search_local(queries: pa.Table, spec: SearchSpec, k: int, batch_size: int = 256, threads: int = 1) -> Any:
    """``search_dataset`` in this process, without Ray: one ``SearchQueries`` (``threads`` torch threads) over
    ``queries`` in batches of ``batch_size`` (an iterable of result tables, what ``collect`` reads)."""
    searcher = SearchQueries(dataclasses.asdict(spec), k, torch_threads=threads)
    return (searcher(queries.slice(start, batch_size)) for start in range(0, queries.num_rows, batch_size))


def collect(results: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """query id -> (ids, scores) from a ``search_dataset`` or ``search_local`` (the results are small: Q x k)."""
    batches = results.iter_batches(batch_size=None, batch_format="pyarrow") if hasattr(results, "iter_batches") \
        else results
    out = {}
    for batch in batches:
        for qid, ids, scores in zip(*(batch.column(c).to_pylist() for c in ("query_id", "ids", "scores")), strict=True):
            out[qid] = (np.asarray(ids, np.int64), np.asarray(scores, np.float32))
    return out


class DocKeys:
    """Index id <-> display key (a column of the index's docs table, e.g. a product id); ``None`` key
    column: the id itself as a string."""

    def __init__(self, manifest_path: str | Path, key: str | None) -> None:
        from madr.index import DocStore, Manifest

        self.key = key
        self._to_key: dict[int, str] = {}
        self._to_id: dict[str, int] = {}
        if key is None:
            return
        m = Manifest.load(manifest_path)
        if not m.docs_path:
            raise ValueError(f"{manifest_path}: the index has no docs table to map ids to {key!r}")
        base = Path(manifest_path).parent if Path(manifest_path).is_file() else Path(manifest_path)
        store = DocStore.open(base / m.docs_path, columns=[key])
        if key not in store.table.column_names:
            raise ValueError(f"{base / m.docs_path}: no column {key!r} (columns: {store.table.column_names})")
        ids = store.table.column("doc_id").to_pylist()
        keys = [str(x) for x in store.table.column(key).to_pylist()]
        self._to_key = dict(zip(ids, keys, strict=True))
        self._to_id = dict(zip(keys, ids, strict=True))
        self._dense = _dense_keys(ids, keys)

    def keys(self, ids: np.ndarray) -> list[str]:
        if self.key is None:
            return [str(int(i)) for i in ids]
        ids = np.asarray(ids)
        if self._dense is not None and ids.size and 0 <= ids.min() and ids.max() < len(self._dense):
            out = self._dense[ids].tolist()
            if None not in out:
                return out
        return [self._to_key.get(int(i), str(int(i))) for i in ids]

    def id_of(self, key: str) -> int | None:
        if self.key is None:
            try:
                return int(key)
            except ValueError:
                return None
        return self._to_id.get(key)


def _dense_keys(ids: list[int], keys: list[str]) -> np.ndarray | None:
    """The keys as an array indexed by id (None where no document has the id), so that a whole top-k maps in one
    take; None when the ids are negative or too sparse for it (more than 16 slots of 8 bytes per document)."""
    if not ids or min(ids) < 0 or max(ids) >= 16 * len(ids) + 1024:
        return None
    out = np.full(max(ids) + 1, None, dtype=object)
    out[np.asarray(ids, dtype=np.int64)] = keys
    return out
