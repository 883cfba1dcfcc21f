"""What the HTTP API calls: encode a query, search the shards, explain a pair. No Ray in this module.

`Backend` is the interface `serve/api.py` talks to. Two implementations share every numeric step:
`LocalBackend` (model + `ShardedIndex` in this process: the plain FastAPI/uvicorn app and the benchmark
baseline) and `RayBackend` in `serve/deployments.py` (Ray Serve handles to a batching `QueryEncoder` and one
`ShardSearcher` per shard group). Both encode with `madr.search.query_encoder.LeanQueryEncoder` (the vectors of
`madr.index` `encode_queries`, without per-call mode switches and with the SPLADE activation on the pooled row)
and search with `madr.search.sharded` `Shard.search` + `merge_topk` under one `madr.search.params.SearchParams`,
so the HTTP results equal an offline `ShardedIndex.search` of the same queries (paper 002 Eq. 1 per shard,
unnormalised, merged by score with ties by id). With `index_vocabulary` (settings
`encoder_index_vocabulary`, off by default) a hybrid model's queries are projected onto the terms the index
holds only (`madr.search.sharded.sparse_term_ids`): faster, and the top-k cut is then taken over those terms,
so results can differ from the offline reference where a query's top-k held terms no document has.

An index with a lexical (BM25) part (`madr.index.lexical`, manifest `search_mode` "dense+bm25") is searched by
dense + BM25 fusion: the encoder also counts the raw query's word pieces (`EncodedQuery.lexical`; those of the
index's own lexical tokenizer when the manifest names one, `lexical_tokenizer_dir`, else the model's), every shard
group returns its dense and BM25 top-`candidates` (`ShardGroup.candidates`), and the backend fuses the lists
of all groups with `madr.search.sharded.fuse_candidates`, as `ShardedIndex.search(..., lexical=...)` does.

An index with aspect data (`madr.index.aspects`) gets each query's calibrated top-k aspect values from the encoder
too (`EncodedQuery.aspects`, `madr.modeling.aspect_distributions.encode_aspects`; an extra forward pass of the
query tower, made only for a request whose search uses them: an aspect-match weight > 0 or a filter by predicted
values); the API applies the aspect-match fusion and aspect filters to the candidates (`serve/api.py`,
`madr.search.aspect_match`).
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from madr.index.manifest import Manifest
from madr.search.params import SearchParams, resolve
from madr.search.protocol import TopK, merge_topk
from madr.search.sharded import ShardedIndex, load_shard
from madr.search.sparse import SparseBatch
from madr.search.timing import stage

if TYPE_CHECKING:
    from madr.modeling.model import BiEncoder
    from madr.search.query_encoder import LeanQueryEncoder

# torch / transformers (madr.modeling.model, madr.modeling.explain, madr.index.encode) are imported inside the functions that
# need them, so the searcher and ingress replicas do not pay for them.


@dataclass
class EncodedQuery:
    """One encoded query: dense [d] float32, its sparse row (None for dense-only models) and, for indexes with
    a BM25 part, its word-piece counts (one row; None otherwise)."""

    dense: np.ndarray
    sparse: SparseBatch | None
    lexical: SparseBatch | None = None
    stage_ms: dict[str, float] | None = None  # a replica's encode time for its batch (`serve.latency`)
    aspects: dict | None = None  # indexes with aspect data: the query's top-k aspect values (one row)


@dataclass
class Searched:
    """A searcher replica's answer to one request: its arrays (`(scores, ids)`, or `ShardGroup.candidates`'
    four) and the stage times of the batch it was searched in (`madr.search.timing`, ms)."""

    arrays: tuple[np.ndarray, ...]
    stage_ms: dict[str, float]


class Backend(Protocol):
    async def encode(self, text: str, aspects: bool = True) -> EncodedQuery: ...

    async def search(self, query: EncodedQuery, params: SearchParams) -> tuple[np.ndarray, np.ndarray]: ...

    async def explain(self, query: str, doc_text: str) -> dict[str, Any]: ...

    async def term_names(self, ids: list[int]) -> list[str]: ...

    async def ready(self) -> dict[str, Any]: ...


# ---- request texts and batch isolation ----------------------------------------------------------------------

# Unicode categories with nothing to see: controls (NUL, ...), format characters (zero-width space / joiners,
# BOM, ...) and separators. A text made only of these (and whitespace) is blank.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})

T = TypeVar("T")
R = TypeVar("R")


def check_text(value: str, what: str) -> str:
    """`value` when it is valid Unicode with at least one visible character, else ValueError naming `what`.

    Unpaired UTF-16 surrogates (JSON "\\ud800") cannot be encoded as UTF-8 and make the tokenizer raise:
    refused here, before a text joins a batch, so it cannot fail its batch-mates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} holds an unpaired UTF-16 surrogate at character {e.start} "
                         "(not valid Unicode)") from None
    if all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in value):
        raise ValueError(f"{what} is blank (only whitespace, zero-width or control characters)")
    return value


def isolate(fn: Callable[[list[T]], Sequence[R]], items: list[T]) -> list[R | Exception]:
    """`fn(items)`, one result per item; when the whole batch raises, each item is retried alone so only the
    items that fail by themselves get their exception (returned in their slot, not raised)."""
    try:
        return list(fn(items))
    except Exception as err:  # noqa: BLE001 - any failure: find the guilty items
        if len(items) == 1:
            return [err]
    return [isolate(fn, [item])[0] for item in items]


# ---- model side ---------------------------------------------------------------------------------------------

def resolve_model_dir(manifest_path: str | Path, model_dir: str | None) -> Path:
    """`model_dir`, else the manifest's (relative to the manifest's directory); a clear error without one."""
    manifest_path = Path(manifest_path)
    if model_dir is None:
        model_dir = Manifest.load(manifest_path).model_dir
        if model_dir is None:
            raise ValueError(f"{manifest_path}: the manifest names no model_dir; set serve settings model_dir")
        path = Path(model_dir)
        return path if path.is_absolute() else manifest_path.parent / path
    return Path(model_dir)


def load_model(model_dir: str | Path, threads: int = 1, device: str = "cpu") -> BiEncoder:
    """The saved model in eval mode on `device` ("cpu" or "cuda"; a RuntimeError when torch sees no GPU)."""
    import torch

    from madr.modeling.model import BiEncoder

    torch.set_num_threads(threads)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("this replica was given a GPU (num_gpus) but torch sees no CUDA device")
    model = BiEncoder.load(model_dir).eval()
    return model if device == "cpu" else model.to(device)


def query_encoder(model: BiEncoder, manifest_path: str | Path | None = None, verify: bool = True,
                  backend: str = "torch", threads: int = 1, precision: str = "fp32") -> LeanQueryEncoder:
    """The query encoder of `model` for `backend` and `precision` (`madr.search.query_encoder.build_query_encoder`,
    in eval mode); with `manifest_path` (a hybrid index) its queries are projected onto the terms the index's sparse
    shards hold (`madr.search.sharded.sparse_term_ids`; torch only: the ONNX graph projects onto the whole
    vocabulary)."""
    from madr.search.query_encoder import build_query_encoder
    from madr.search.sharded import sparse_term_ids

    terms = None
    if manifest_path is not None and model.config.has_sparse:  # onnx refuses them (whole vocabulary)
        terms = sparse_term_ids(manifest_path, verify=verify)
    return build_query_encoder(model, terms, backend, precision, threads)


def encode_texts(encoder: LeanQueryEncoder, texts: list[str], lexical_vocab: int | None = None,
                 lexical_tokenizer: Any | None = None, aspect_k: int | None = None,
                 wants_aspects: Sequence[bool] | None = None) -> list[EncodedQuery]:
    """Query-tower dense (+ sparse for hybrid models) vectors of `texts` (`LeanQueryEncoder.encode`), one
    `EncodedQuery` each; with `lexical_vocab` (the index's BM25 vocabulary size) also the raw texts' word-piece
    counts, split by `lexical_tokenizer` (the index's own, `lexical_tokenizer_dir`) or, when None, the model's
    tokenizer; with `aspect_k` (an index with aspect data) the calibrated top-k aspect values of a model that
    predicts them, for the texts whose `wants_aspects` is true (None: all). Those cost a second pass of the query
    tower, so a search that uses no aspect (aspect weight 0, no predicted-aspect filter) asks for none."""
    with stage("encode"):
        dense, sparse = encoder.encode(list(texts))
        terms = None
        if lexical_vocab is not None:
            from madr.index.lexical import query_term_counts

            tok = encoder.model.tokenizer if lexical_tokenizer is None else lexical_tokenizer
            terms = query_term_counts(tok, list(texts), lexical_vocab)
    wanted = [i for i in range(len(texts)) if wants_aspects is None or wants_aspects[i]]
    aspects, row_of = None, {i: r for r, i in enumerate(wanted)}
    if aspect_k and wanted:
        from madr.index.aspects import select_rows
        from madr.modeling.aspect_distributions import encode_aspects

        aspects = encode_aspects(encoder.model, [texts[i] for i in wanted], "query", aspect_k) or None
    rows = []
    for i in range(len(texts)):
        rows.append(EncodedQuery(np.ascontiguousarray(dense[i], dtype=np.float32),
                                 None if sparse is None else sparse.select([i]),
                                 None if terms is None else terms.select([i]),
                                 aspects=None if aspects is None or i not in row_of
                                 else select_rows(aspects, np.array([row_of[i]]))))
    return rows


def lexical_vocab(manifest: Manifest) -> int | None:
    """The BM25 vocabulary size of an index with a lexical part (what the encoder counts query terms over)."""
    return int(manifest.lexical["vocab_size"]) if manifest.has_lexical else None


def aspect_k(manifest: Manifest) -> int | None:
    """The top-k of an index's stored aspect values (what the encoder keeps of a query's), None without them."""
    return int(manifest.aspects["k"]) if manifest.has_aspects else None


def lexical_tokenizer_dir(manifest_path: str | Path) -> str | None:
    """The directory of the index's own lexical tokenizer (`madr.index.lexical.TOKENIZER_DIR`), None when its
    queries are split by the model's tokenizer (or it has no lexical part)."""
    from madr.index.lexical import LexicalInfo

    manifest_path = Path(manifest_path)
    manifest = Manifest.load(manifest_path)
    if not manifest.has_lexical:
        return None
    base = manifest_path if manifest_path.is_dir() else manifest_path.parent
    path = LexicalInfo.from_dict(manifest.lexical).tokenizer_dir(base)
    return None if path is None else str(path)


def load_lexical_tokenizer(path: str | None, vocab_size: int | None) -> Any | None:
    """The tokenizer saved at `path` (`lexical_tokenizer_dir`), checked against the index's BM25 vocabulary."""
    if path is None:
        return None
    from madr.modeling.tokenization import load_tokenizer

    tok = load_tokenizer(path)
    if vocab_size is not None and len(tok) != vocab_size:
        raise ValueError(f"lexical tokenizer {path}: {len(tok)} pieces, the index's BM25 part has {vocab_size}")
    return tok


def stack(queries: Sequence[EncodedQuery]) -> tuple[np.ndarray, SparseBatch | None]:
    """[Q, d] dense and the Q sparse rows as one batch (None when the queries have none)."""
    dense = np.stack([q.dense for q in queries]).astype(np.float32, copy=False)
    if any(q.sparse is None for q in queries):
        return dense, None
    return dense, SparseBatch.concat([q.sparse for q in queries])


def stack_lexical(queries: Sequence[EncodedQuery]) -> SparseBatch | None:
    """The Q word-piece count rows as one batch (None when the queries have none)."""
    if any(q.lexical is None for q in queries):
        return None
    return SparseBatch.concat([q.lexical for q in queries])


def explain_texts(model: BiEncoder, query: str, doc_text: str) -> dict[str, Any]:
    """`madr.modeling.explain.explain_pair`, with expansion terms as {term, weight} objects for JSON clients."""
    from madr.modeling.explain import explain_pair

    out = explain_pair(model, query, doc_text)
    for side in ("query", "doc"):
        out[side]["expansion_terms"] = [{"term": t, "weight": float(w)} for t, w in out[side]["expansion_terms"]]
    return out



class LexicalExplainer:
    """`/explain`'s BM25 part for an index with one: the pair's BM25 score with the index's word pieces and
    collection statistics, and the pieces query and text share (`madr.index.lexical.bm25_matches`). The text is
    the one explained (a DocStore field by `doc_id`), which may be shorter than the text the index counted, so
    the score is that text's. Its tokenizer (the index's own, else the model's) is loaded on first use, so the
    ingress imports no transformers until an explanation is asked for."""

    def __init__(self, manifest_path: str | Path, model_dir: str | None = None) -> None:
        self.manifest_path, self.model_dir = Path(manifest_path), model_dir
        self._parts: tuple[Any, Any, np.ndarray] | None = None

    def _load(self) -> tuple[Any, Any, np.ndarray]:
        if self._parts is None:
            from madr.index.lexical import LexicalInfo
            from madr.modeling.tokenization import load_tokenizer

            info = LexicalInfo.from_dict(Manifest.load(self.manifest_path).lexical)
            base = self.manifest_path if self.manifest_path.is_dir() else self.manifest_path.parent
            tok = info.tokenizer(base) or load_tokenizer(resolve_model_dir(self.manifest_path, self.model_dir)
                                                         / "tokenizer")
            self._parts = (tok, info, info.idf_values(base))
        return self._parts

    def explain(self, query: str, text: str, top: int = 10) -> dict[str, Any]:
        """{"score": BM25 of (query, text), "matched_terms": the top shared pieces, largest contribution first}."""
        from madr.index.lexical import bm25_matches, word_pieces

        tok, info, idf = self._load()
        q_ids, d_ids = word_pieces(tok, [query, text])
        matches = bm25_matches(q_ids, d_ids, idf, info.avgdl, info.k1, info.b)
        names = tok.convert_ids_to_tokens([m["term_id"] for m in matches[:top]])
        terms = [{"term": name, **{k: v for k, v in m.items() if k != "term_id"}}
                 for name, m in zip(names, matches, strict=False)]
        return {"score": float(sum(m["contribution"] for m in matches)), "matched_terms": terms}

def term_names(model: BiEncoder, ids: list[int]) -> list[str]:
    return list(model.tokenizer.convert_ids_to_tokens([int(i) for i in ids]))


# ---- index side ---------------------------------------------------------------------------------------------

def shard_groups(num_shards: int, groups: int) -> list[list[int]]:
    """Contiguous, near-equal groups of shard numbers (at most `num_shards` groups, none empty)."""
    groups = max(1, min(groups, num_shards))
    return [list(part) for part in np.array_split(np.arange(num_shards), groups)]


class ShardGroup:
    """Some shards of one manifest, searched together: `Shard.search` each, then `merge_topk`."""

    def __init__(self, manifest_path: str | Path, shards: Sequence[int], mmap: bool = False,
                 verify: bool = True) -> None:
        if not shards:
            raise ValueError("ShardGroup: no shards given")
        self.shard_ids = [int(s) for s in shards]
        self.shards = [load_shard(manifest_path, s, mmap=mmap, verify=verify) for s in self.shard_ids]

    def search(self, dense: np.ndarray, params: SearchParams | None = None, *, sparse: SparseBatch | None = None,
               **overrides: Any) -> TopK:
        """A `madr.search.protocol.Searcher` over these shards: `Shard.search` each, then `merge_topk`."""
        params = resolve(params, overrides)
        parts = [s.search(dense, params, sparse=sparse) for s in self.shards]
        if len(parts) == 1:
            return parts[0]
        with stage("merge"):
            return merge_topk(parts, params.k)

    def candidates(self, dense: np.ndarray, params: SearchParams | None = None, *, sparse: SparseBatch | None = None,
                   lexical: SparseBatch | None = None, **overrides: Any
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Dense + BM25 fusion's share of these shards: (dense scores, dense ids, BM25 scores, BM25 ids), each
        [Q, candidates], merged over the group's shards (`Shard.candidates`); `fuse_candidates` fuses the
        groups' lists. `sparse` is ignored (fusion indexes are built from dense models)."""
        params = resolve(params, overrides)
        if lexical is None:
            raise ValueError("candidates: needs the queries' word-piece counts (lexical=)")
        parts = [s.candidates(dense, lexical, params) for s in self.shards]
        n = params.num_candidates
        with stage("merge"):
            d = merge_topk([p[0] for p in parts], n)
            b = merge_topk([p[1] for p in parts], n)
        return d[0], d[1], b[0], b[1]

    @property
    def fusion_lambda(self) -> float | None:
        return self.shards[0].fusion_lambda

    @property
    def ntotal(self) -> int:
        return int(sum(s.ntotal for s in self.shards))


def search_batched(search: Any, requests: Sequence[tuple[EncodedQuery, SearchParams]]
                   ) -> list[tuple[np.ndarray, ...]]:
    """Answer many (query, params) requests with one index call per distinct params; rows in input order.

    `search(dense [Q, d], params, sparse=sparse | None[, lexical=counts]) -> arrays [Q, ...]` (`(scores, ids)`,
    or `ShardGroup.candidates`' four); each request gets its row of every array."""
    results: list[Any] = [None] * len(requests)
    by_params: dict[tuple[SearchParams, bool, bool], list[int]] = {}
    for i, (query, params) in enumerate(requests):
        by_params.setdefault((params, query.sparse is None, query.lexical is None), []).append(i)
    for (params, _, no_lexical), rows in by_params.items():
        queries = [requests[i][0] for i in rows]
        dense, sparse = stack(queries)
        extra = {} if no_lexical else {"lexical": stack_lexical(queries)}
        out = search(dense, params, sparse=sparse, **extra)
        for j, i in enumerate(rows):
            results[i] = tuple(a[j] for a in out)
    return results


# ---- the in-process backend ---------------------------------------------------------------------------------

class LocalBackend:
    """Model + `ShardedIndex` in this process; blocking work runs in a worker thread, one request at a time
    per call (no cross-request batching): the plain-FastAPI baseline of the Serve app."""

    def __init__(self, manifest_path: str | Path, model_dir: str | None = None, mmap: bool = False,
                 verify: bool = True, threads: int = 1, index_vocabulary: bool = False,
                 encoder_backend: str = "torch", encoder_precision: str = "fp32") -> None:
        import faiss

        from madr.search.query_encoder import LeanQueryEncoder

        faiss.omp_set_num_threads(threads)
        self.model = load_model(resolve_model_dir(manifest_path, model_dir), threads)
        self.index = ShardedIndex.open(manifest_path, mmap=mmap, verify=verify)
        terms = self.index.sparse_term_ids() if index_vocabulary and self.model.config.has_sparse else None
        if encoder_backend == "torch" and encoder_precision == "fp32":
            self.encoder = LeanQueryEncoder(self.model, terms)
        else:  # onnx refuses index_vocabulary (it projects onto the whole vocabulary); int8 quantises a copy
            self.encoder = query_encoder(self.model, manifest_path if index_vocabulary else None, verify,
                                         encoder_backend, threads, encoder_precision)
        self.lexical_vocab = lexical_vocab(self.index.manifest)
        self.lexical_tokenizer = self.index.lexical_tokenizer  # None: the model's splits the queries
        self.aspect_k = aspect_k(self.index.manifest)
        self._lock = asyncio.Lock()

    async def encode(self, text: str, aspects: bool = True) -> EncodedQuery:
        async with self._lock:  # torch modules are not re-entrant across threads
            return (await asyncio.to_thread(encode_texts, self.encoder, [text], self.lexical_vocab,
                                            self.lexical_tokenizer, self.aspect_k, [aspects]))[0]

    async def search(self, query: EncodedQuery, params: SearchParams) -> tuple[np.ndarray, np.ndarray]:
        dense, sparse = stack([query])
        try:
            scores, ids = await asyncio.to_thread(self.index.search, dense, params, sparse=sparse,
                                                  lexical=stack_lexical([query]))
        except ValueError as e:
            raise BackendBadRequest(str(e)) from e
        return scores[0], ids[0]

    async def explain(self, query: str, doc_text: str) -> dict[str, Any]:
        async with self._lock:
            return await asyncio.to_thread(explain_texts, self.model, query, doc_text)

    async def term_names(self, ids: list[int]) -> list[str]:
        return term_names(self.model, ids)

    async def ready(self) -> dict[str, Any]:
        return {"model": self.model.config.name, "dim": int(self.model.embedding_dim),
                "num_shards": self.index.num_shards, "ntotal": int(self.index.ntotal),
                "search_mode": self.index.search_mode}


# ---- errors and documents -----------------------------------------------------------------------------------

class BackendUnavailable(RuntimeError):
    """A deployment the request needs is down (e.g. a replica died and is being replaced): HTTP 503."""


class BackendTimeout(RuntimeError):
    """A deployment did not answer in time: HTTP 504."""


class BackendBadRequest(ValueError):
    """The index or model refused the request's parameters (their ValueError): HTTP 422."""


DEFAULT_TEXT_FIELDS = ("text", "title")  # what `Docs.text_field` looks for when the settings name none


class Docs:
    """The manifest's DocStore (display fields and aspect values per document id), or none."""

    def __init__(self, store: Any | None, fields: list[str], path: Path | None) -> None:
        self.store, self.fields, self.path = store, fields, path

    @classmethod
    def open(cls, manifest_path: str | Path) -> Docs:
        manifest_path = Path(manifest_path)
        docs_path = Manifest.load(manifest_path).docs_path
        if docs_path is None:
            return cls(None, [], None)
        from madr.index.docstore import ID_COLUMN, DocStore

        path = Path(docs_path)
        path = path if path.is_absolute() else manifest_path.parent / path
        # One chunk per column: `take` over a column split into row-group chunks is far slower per look-up
        # than over one contiguous chunk.
        store = DocStore.open(path)
        store = DocStore(store.table.combine_chunks(), str(path))
        return cls(store, [n for n in store.table.column_names if n != ID_COLUMN], path)

    def get(self, ids: np.ndarray | Sequence[int]) -> list[dict | None]:
        ids = [int(i) for i in ids]
        if self.store is None or not ids:
            return [None] * len(ids)
        return list(self.store.get(ids))

    def filter_fields(self, settings: Any) -> list[str]:
        """Fields `/search` may filter on: `settings.filter_fields`, else all but the text field."""
        if settings.filter_fields is not None:
            unknown = [f for f in settings.filter_fields if f not in self.fields]
            if unknown:
                raise ValueError(f"serve settings: filter_fields {unknown} are not DocStore fields "
                                 f"({', '.join(self.fields) or 'no DocStore'})")
            return list(settings.filter_fields)
        return [f for f in self.fields if f != self.text_field(settings)]

    def text_field(self, settings: Any) -> str | None:
        """The field `/explain` reads by doc_id: `settings.doc_text_field`, else the first of DEFAULT_TEXT_FIELDS
        the DocStore has (None: none)."""
        if settings.doc_text_field is not None:
            return str(settings.doc_text_field)
        return next((f for f in DEFAULT_TEXT_FIELDS if f in self.fields), None)

    def text(self, doc_id: int, field: str | None) -> str:
        """The text of document `doc_id` (LookupError: unknown id; ValueError: no such text field)."""
        if field is None or field not in self.fields:
            name = "text" if field is None else repr(field)
            raise ValueError(f"doc_id: the DocStore has no {name} field; send doc_text instead")
        doc = self.get([doc_id])[0]
        if doc is None:
            raise LookupError(f"doc_id {doc_id} is not in the DocStore")
        return str(doc[field])
