"""Ray Serve deployments: the batching query encoder, the shard searchers, and the handles backend.

- `QueryEncoder`: the model's query tower (`madr.search.query_encoder.LeanQueryEncoder`) behind `@serve.batch` (dynamic batching: concurrent requests are
  encoded as one padded batch, up to `encoder_max_batch_size` or `encoder_batch_wait_timeout_s`); also
  answers `/explain` (both towers) and term names for `/encode`.
- `ShardSearcher`: one deployment per shard group (`searcher-<g>`), each replica holding its shards in
  memory; `@serve.batch` groups concurrent requests with equal search knobs into one FAISS call.
- `RayBackend`: the `serve.backend.Backend` the ingress uses: encode once, fan out to every shard group,
  `merge_topk` (paper 002 Eq. 1 scores, comparable across shards); each hop is a `serve.calls.call` (busy
  replicas: the call queues; a dead replica: retried on another, else `BackendUnavailable` -> 503 fast),
  concurrent requests' hops coalesced into calls with a list (`serve.coalesce`; `ingress_coalesce`: 1, a call each).
  For an index with a BM25 part the groups return their dense and BM25 candidate lists
  (`ShardSearcher.candidates`) and the backend fuses them (`madr.search.sharded.fuse_candidates`).

A batch isolates its members: a text is checked (`check_text`) before it joins a batch, and a batch that
raises is retried member by member (`isolate`), so a bad request fails alone, never its batch-mates.
A replica's health check fails while one of its batches has run longer than `stuck_after_s` (a hung call,
`serve.watchdog`), so that Serve replaces it.

Stage times (`serve.latency`): each replica times its batches' stages (`timed_batch`: encode; dense, sparse, bm25,
fusion, merge), observes them in its metrics and sends them back with every answer (`EncodedQuery.stage_ms`,
`Searched`); `RayBackend` times its hops (`encode_call`, `search_call`) and its own fusion / merge, and reports the
replicas' times to the request's log line.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from ray import serve

from madr.search.params import SearchParams
from madr.search.protocol import merge_topk
from madr.search.sharded import fuse_candidates
from madr.search.timing import stage
from serve.backend import (
    BackendBadRequest,
    EncodedQuery,
    Searched,
    ShardGroup,
    check_text,
    encode_texts,
    explain_texts,
    isolate,
    load_lexical_tokenizer,
    load_model,
    query_encoder,
    search_batched,
    term_names,
)
from serve.calls import CallPolicy, call, member_error
from serve.coalesce import Coalescer
from serve.latency import report, timed_batch
from serve.watchdog import Watchdog


def replica_device() -> str:
    """Where this replica runs the query tower: "cuda" when Ray gave it a GPU (its deployment's `num_gpus`, or
    `ray_actor_options.num_gpus` in a Serve YAML), else "cpu"."""
    import ray

    return "cuda" if ray.is_initialized() and ray.get_gpu_ids() else "cpu"


def replica_actor_name() -> str:
    """The Ray actor name of the calling replica (namespace "serve"): lets tests kill a given replica."""
    return serve.get_replica_context().replica_id.to_full_id_str()


@serve.deployment(name="QueryEncoder")
class QueryEncoder:
    """The query tower with dynamic batching (module docstring)."""

    def __init__(self, model_dir: str, threads: int = 1, max_batch_size: int = 16,
                 batch_wait_timeout_s: float = 0.003, lexical_vocab: int | None = None,
                 lexical_tokenizer: str | None = None, vocabulary_manifest: str | None = None,
                 verify: bool = True, backend: str = "torch", precision: str = "fp32",
                 aspect_k: int | None = None, stuck_after_s: float | None = None) -> None:
        self.watchdog = Watchdog("QueryEncoder", stuck_after_s)  # check_health fails while a batch is stuck
        device = replica_device()
        if device == "cuda" and (backend, precision) != ("torch", "fp32"):
            raise ValueError(f"QueryEncoder: a replica with a GPU runs the torch fp32 query tower, not "
                             f"{backend!r} / {precision!r} (they run on the CPU); give it num_gpus: 0")
        self.model = load_model(model_dir, threads, device)
        # eval mode set once; with `vocabulary_manifest` a hybrid model projects onto the index's terms only;
        # backend "onnx": the forward pass in onnxruntime (ServeSettings.encoder_backend); precision "int8": its
        # Linear layers quantised (ServeSettings.encoder_precision)
        self.encoder = query_encoder(self.model, vocabulary_manifest, verify, backend, threads, precision)
        self.lexical_vocab = lexical_vocab  # an index with a BM25 part: also count the queries' word pieces
        # ... split by the index's own lexical tokenizer (a directory of the index) when it has one
        self.lexical_tokenizer = load_lexical_tokenizer(lexical_tokenizer, lexical_vocab)
        self.aspect_k = aspect_k  # an index with aspect data: also the queries' calibrated top-k aspect values
        self._encode_batch.set_max_batch_size(max_batch_size)
        self._encode_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def encode(self, text: str, aspects: bool = True) -> EncodedQuery:
        """One query, encoded in a batch with concurrent ones (with its aspect values when `aspects` and the index
        has aspect data); a bad text fails only its own request."""
        return _raise_or_return(await self._encode_batch((check_text(text, "text"), bool(aspects))))

    async def encode_many(self, queries: list[tuple[str, bool]]) -> list[EncodedQuery | Exception]:
        """An ingress's coalesced queries (`serve.coalesce`: (text, aspects) pairs), each encoded as `encode`
        does; a failed one is its exception, in place."""
        return await _each(lambda q: self.encode(*q), queries)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.003)
    async def _encode_batch(self, queries: list[tuple[str, bool]]) -> list[EncodedQuery | Exception]:
        # In a thread: the event loop keeps queueing requests for the next batch meanwhile.
        with self.watchdog.running():
            results, stages = await asyncio.to_thread(timed_batch, partial(isolate, lambda batch: encode_texts(
                self.encoder, [t for t, _ in batch], self.lexical_vocab, self.lexical_tokenizer, self.aspect_k,
                [a for _, a in batch])), queries)
        for r in results:
            if isinstance(r, EncodedQuery):
                r.stage_ms = stages  # the batch's encode time travels back with each query (`serve.latency`)
        return results

    def explain(self, query: str, doc_text: str) -> dict[str, Any]:
        return explain_texts(self.model, query, doc_text)

    def term_names(self, ids: list[int]) -> list[str]:
        return term_names(self.model, ids)

    def info(self) -> dict[str, Any]:
        return {"model": self.model.config.name, "dim": int(self.model.embedding_dim),
                "replica": replica_actor_name(), "pid": os.getpid()}

    def check_health(self) -> None:
        self.watchdog.check()


@serve.deployment(name="ShardSearcher")
class ShardSearcher:
    """Some shards of the index (module docstring)."""

    def __init__(self, manifest_path: str, shards: Sequence[int], mmap: bool = False, verify: bool = True,
                 threads: int = 1, max_batch_size: int = 16, batch_wait_timeout_s: float = 0.001,
                 stuck_after_s: float | None = None) -> None:
        import faiss

        self.watchdog = Watchdog("ShardSearcher", stuck_after_s)  # check_health fails while a batch is stuck
        faiss.omp_set_num_threads(threads)
        self.group = ShardGroup(manifest_path, shards, mmap=mmap, verify=verify)
        for batched in (self._search_batch, self._candidates_batch):
            batched.set_max_batch_size(max_batch_size)
            batched.set_batch_wait_timeout_s(batch_wait_timeout_s)

    async def search(self, request: tuple[EncodedQuery, SearchParams]) -> Searched:
        """Top-k of one (query, params), searched in a batch with concurrent ones; failures stay its own.
        `Searched.arrays`: (scores, ids); its `stage_ms`: the batch's stage times (`serve.latency`)."""
        return _raise_or_return(await self._search_batch(request))

    async def candidates(self, request: tuple[EncodedQuery, SearchParams]) -> Searched:
        """Dense + BM25 fusion: this group's dense and BM25 candidate lists for one request (batched), as
        `Searched.arrays` (dense scores, dense ids, BM25 scores, BM25 ids)."""
        return _raise_or_return(await self._candidates_batch(request))

    async def search_many(self, requests: list[tuple[EncodedQuery, SearchParams]]) -> list[Any]:
        """An ingress's coalesced `search` requests (`serve.coalesce`); a failed one is its exception, in place."""
        return await _each(self.search, requests)

    async def candidates_many(self, requests: list[tuple[EncodedQuery, SearchParams]]) -> list[Any]:
        """An ingress's coalesced `candidates` requests; a failed one is its exception, in place."""
        return await _each(self.candidates, requests)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001)
    async def _search_batch(self, requests: list[tuple[EncodedQuery, SearchParams]]) -> list[Searched | Exception]:
        return await self._batch(self.group.search, requests)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.001)
    async def _candidates_batch(self, requests: list[tuple[EncodedQuery, SearchParams]]
                                ) -> list[Searched | Exception]:
        return await self._batch(self.group.candidates, requests)

    async def _batch(self, search: Callable[..., Any], requests: list[tuple[EncodedQuery, SearchParams]]
                     ) -> list[Searched | Exception]:
        """One batch through `search` (`ShardGroup.search` / `.candidates`) in a worker thread, its members
        isolated, each answer with the batch's stage times."""
        with self.watchdog.running():
            results, stages = await asyncio.to_thread(
                timed_batch, partial(isolate, lambda batch: search_batched(search, batch)), requests)
        return [r if isinstance(r, Exception) else Searched(r, stages) for r in results]

    def info(self) -> dict[str, Any]:
        return {"shards": self.group.shard_ids, "ntotal": self.group.ntotal, "replica": replica_actor_name(),
                "pid": os.getpid()}

    def check_health(self) -> None:
        if not self.group.shards:
            raise RuntimeError("ShardSearcher has no shards loaded")
        self.watchdog.check()


async def _each(method: Callable[[Any], Awaitable[Any]], items: list[Any]) -> list[Any]:
    """`method(item)` for every item concurrently (so they join the replica's batches), exceptions in place."""
    return list(await asyncio.gather(*(method(item) for item in items), return_exceptions=True))


def _raise_or_return(result: Any) -> Any:
    """A batch member's result, or its exception raised (`isolate` returns them in place)."""
    if isinstance(result, Exception):
        raise result
    return result


class RayBackend:
    """`Backend` over deployment handles: one encoder, one handle per shard group. Every hop goes through
    `serve.calls.call` (busy replicas: it queues; a dead replica: retried on another one, else 503 once no
    replica has been alive for `policy.route_timeout_s`). With `coalesce` > 1 a request's encode and search hops
    are coalesced with concurrent requests' (`serve.coalesce`: up to `coalesce` per call; 1: a call per request)."""

    def __init__(self, encoder: Any, searchers: Sequence[Any], fusion_lambda: float | None = None,
                 search_mode: str = "dense", policy: CallPolicy | None = None,
                 fusion_normalisation: str | None = None, coalesce: int = 1) -> None:
        self.encoder, self.searchers = encoder, list(searchers)
        self.fusion_lambda, self.search_mode = fusion_lambda, search_mode  # the manifest's
        self.fusion_normalisation = fusion_normalisation  # the manifest's (chosen on dev by the tune stage)
        self.policy = policy or CallPolicy()
        self.coalesce = coalesce
        self._encode = self._coalescer("encode_many", "QueryEncoder", self.encoder, coalesce)
        self._groups = {method: [self._coalescer(f"{method}_many", f"searcher-{g}", h, coalesce)
                                 for g, h in enumerate(self.searchers)] for method in ("search", "candidates")}

    def _coalescer(self, method: str, what: str, handle: Any, size: int) -> Coalescer:
        """Calls of `handle.<method>(list)`; a member's exception answered as `call` answers its own."""
        async def send_many(items: list[Any]) -> list[Any]:
            results = await self._call(lambda: getattr(handle, method).remote(items), what, handle)
            return [member_error(what, r) if isinstance(r, Exception) else r for r in results]

        return Coalescer(send_many, size)

    def _call(self, send: Callable[[], Any], what: str, handle: Any) -> Awaitable[Any]:
        return call(send, self.policy, what, handle)

    async def encode(self, text: str, aspects: bool = True) -> EncodedQuery:
        with stage("encode_call"):
            if self.coalesce > 1:
                query = await self._encode((text, aspects))
            else:
                query = await self._call(lambda: self.encoder.encode.remote(text, aspects), "QueryEncoder",
                                         self.encoder)
        report([query.stage_ms])
        return query

    async def _each_group(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every shard group, concurrently (`search` / `candidates`: coalesced when asked)."""
        if self.coalesce > 1 and method in self._groups:
            return await asyncio.gather(*[c(*args) for c in self._groups[method]])
        return await asyncio.gather(*[
            self._call(lambda h=h: getattr(h, method).remote(*args), f"searcher-{g}", h)
            for g, h in enumerate(self.searchers)])

    async def _searched(self, method: str, query: EncodedQuery, params: SearchParams) -> list[tuple[np.ndarray, ...]]:
        """Every group's arrays for `method` ("search" / "candidates"); their stage times reported."""
        with stage("search_call"):
            parts: list[Searched] = await self._each_group(method, (query, params))
        report([p.stage_ms for p in parts])
        return [p.arrays for p in parts]

    async def search(self, query: EncodedQuery, params: SearchParams) -> tuple[np.ndarray, np.ndarray]:
        if query.lexical is not None:
            return await self._fused(query, params)
        parts = await self._searched("search", query, params)
        if len(parts) == 1:
            return parts[0]
        with stage("merge"):
            scores, ids = merge_topk([(s[None, :], i[None, :]) for s, i in parts], params.k)
        return scores[0], ids[0]

    async def _fused(self, query: EncodedQuery, params: SearchParams) -> tuple[np.ndarray, np.ndarray]:
        """Dense + BM25: every group's candidate lists, fused once over all of them (as ShardedIndex.search)."""
        parts = await self._searched("candidates", query, params)
        lam = self.fusion_lambda if params.lam is None else params.lam
        if lam is None:
            raise BackendBadRequest("the index records no fusion_lambda; send lam")
        if self.fusion_normalisation is not None:
            params = params.replace(normalisation=params.normalisation_or(self.fusion_normalisation))
        try:
            with stage("fusion"):
                scores, ids = fuse_candidates([(ds[None], di[None]) for ds, di, _, _ in parts],
                                              [(bs[None], bi[None]) for _, _, bs, bi in parts], float(lam), params)
        except ValueError as e:
            raise BackendBadRequest(str(e)) from e
        return scores[0], ids[0]

    async def explain(self, query: str, doc_text: str) -> dict[str, Any]:
        return await self._call(lambda: self.encoder.explain.remote(query, doc_text), "QueryEncoder", self.encoder)

    async def term_names(self, ids: list[int]) -> list[str]:
        return await self._call(lambda: self.encoder.term_names.remote(ids), "QueryEncoder", self.encoder)

    async def ready(self) -> dict[str, Any]:
        enc = await self._call(lambda: self.encoder.info.remote(), "QueryEncoder", self.encoder)
        groups = await self._each_group("info")
        return {"model": enc["model"], "dim": enc["dim"], "num_shards": sum(len(g["shards"]) for g in groups),
                "ntotal": sum(g["ntotal"] for g in groups), "shard_groups": [g["shards"] for g in groups],
                "search_mode": self.search_mode}
