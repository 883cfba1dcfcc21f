"""The HTTP API (FastAPI, no Ray): routes, request validation, API key, body-size limit, filters.

``create_api(backend, settings, docs)`` builds the app over any `serve.backend.Backend`: the Ray Serve ingress
(`serve/app.py`) hands it Ray handles, ``plain_app`` an in-process model and index (the uvicorn baseline).

Routes: ``POST /search`` (query, k, aspect filters, lambda override -> ids, scores, DocStore fields; on an index
with aspect data also ``aspect_weight``, the aspect-match score's weight, and aspect-aware retrieval: filter or
boost by the caller's ``aspects`` values or, with ``aspect_filter``, by the query's own predicted values above
``min_confidence``; `madr.search.aspect_match`),
``POST /explain`` (paper 000 Table 8 aspect predictions / presence / fusion weights, the calibrated aspect values
of both sides and each aspect's contribution to the aspect-match score, and paper 002 matched
and expansion terms of a query and a document; an index with a BM25 part adds the pair's BM25 score and
matched word pieces), ``POST /encode`` (dense vector + top sparse terms),
``GET /healthz`` (the process answers; ``search_mode``: dense, hybrid or dense+bm25), ``GET /ready`` (model and
every shard loaded), ``/openapi.json``,
``/docs``. Bad input answers 4xx with a message naming the field: 401 (API key), 404 (unknown doc id),
408 (body slower than ``body_timeout_s``), 413 (body over ``max_body_bytes``), 422 (validation: types,
ranges, blank, invisible-only or over-long text, unpaired surrogates, a body that is not UTF-8 or nests
too deeply, unknown filters or fields), 431 (headers over ``max_header_bytes``). A backend that is down
(no live replica: it is being replaced) answers 503, one that does not answer within the request's deadline
(``request_timeout_s``, for the whole request) 504, both with ``Retry-After: 1``; a request beyond the queue
bound of a busy app (``max_queued_requests``) gets Serve's 503 with ``Retry-After: 1`` before it reaches the app.
"""

# No `from __future__ import annotations`: FastAPI must see the request models built in create_api as
# real classes, not strings naming local variables.

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from madr.index.manifest import Manifest
from madr.search.aspect_match import (
    AspectStore,
    apply_condition,
    aspect_rescore,
    condition_mask,
    predicted_condition,
)
from madr.search.params import SearchParams
from madr.search.sharded import candidate_pool
from madr.search.timing import stage
from madr.serve_config import ASPECT_FILTER_MODES, ASPECT_MIN_CONFIDENCE
from serve.backend import (
    Backend,
    BackendBadRequest,
    BackendTimeout,
    BackendUnavailable,
    Docs,
    EncodedQuery,
    LexicalExplainer,
    check_text,
)
from serve.config import RETRY_AFTER_S, ServeSettings, check_exposure, require_manifest, resolved_api_key
from serve.filters import check_filters, matches
from serve.guard import Guard
from serve.latency import StageSink, StageTimer, route_done, route_started

TITLE = "madr search"
RETRY_AFTER = {"Retry-After": f"{RETRY_AFTER_S:g}"}  # 503 (no live replica, a full queue) and 504 (slow backend)


# ---- request and response models ----------------------------------------------------------------------------

MAX_DOC_ID = 2**63 - 1  # DocStore ids are int64


class SearchHit(BaseModel):
    id: int
    score: float
    doc: dict[str, Any] | None = None


class FilterReport(BaseModel):
    fetched: int = Field(description="candidates fetched from the index before filtering")
    matched: int = Field(description="candidates that passed the filters")
    complete: bool = Field(description="False when fewer than k matched within max_filter_fetch candidates")


class AspectReport(BaseModel):
    weight: float = Field(description="the aspect-match weight applied (request, else the index's)")
    mode: str | None = Field(None, description="filter | boost, when aspect values were asked for")
    source: str | None = Field(None, description="request (the caller's aspects) | predicted (the query's own)")
    values: dict[str, list[str]] = Field(default_factory=dict, description="the aspect values filtered / boosted on")
    fetched: int = Field(0, description="candidates re-scored / filtered")
    matched: int = Field(0, description="candidates whose top stored value matched every asked aspect")


class SearchResponse(BaseModel):
    query: str
    k: int
    lam: float | None = Field(description="lambda sent (None: the index default: hybrid_lambda, fusion_lambda, or dense-only)")
    results: list[SearchHit]
    filter: FilterReport | None = None
    aspects: AspectReport | None = None
    took_ms: float = Field(description="time in the API, from the parsed request to the response")
    timings_ms: dict[str, float] = Field(default_factory=dict, description="encode / search / docs")


NO_ASPECTS = "the index has no aspect data (built from a model without aspect heads, or with aspect_top_k 0)"


class AspectFilter(BaseModel):
    """Aspect-aware retrieval (`madr.search.aspect_match`): `filter` keeps, `boost` ranks first, the candidates
    whose most probable stored value is wanted for every aspect; the values are the request's `aspects`, else the
    query's own predicted values whose confidence (presence * calibrated probability) is >= `min_confidence`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    mode: Literal[ASPECT_FILTER_MODES] = "filter"  # type: ignore[valid-type]
    min_confidence: float = Field(ASPECT_MIN_CONFIDENCE, gt=0.0, le=1.0)


class AspectPlan:
    """One request's aspect stage (`SearchRoutes._aspect_plan`) and what it did (`report`)."""

    def __init__(self, weight: float, condition: dict | None, mode: str, source: str | None) -> None:
        self.weight, self.condition, self.mode, self.source = weight, condition, mode, source
        self.fetched = self.matched = 0

    def report(self, store: AspectStore) -> dict[str, Any]:
        values = {a: store.names(a, sorted(v)) for a, v in (self.condition or {}).items()}
        return {"weight": self.weight, "mode": self.mode if self.condition is not None else None,
                "source": self.source, "values": values, "fetched": self.fetched, "matched": self.matched}


def request_models(s: ServeSettings, filter_fields: list[str], doc_fields: list[str],
                   aspect_store: AspectStore | None = None) -> dict[str, type]:
    """Pydantic request models with this deployment's limits (so they show in the OpenAPI schema); `aspect_store`:
    the index's stored aspect values (None: it has none), which `aspects` / `aspect_filter` are checked against."""

    class SearchRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        query: str = Field(min_length=1, max_length=s.max_query_chars, description="query text")
        k: int = Field(10, ge=1, le=s.max_k, description="number of results")
        filters: dict[str, str | list[str]] | None = Field(
            None, description=f"aspect filters on document fields ({', '.join(filter_fields) or 'none'}): "
                              "a value or list of values per field; AND across fields, OR within one")
        lam: float | None = Field(None, ge=0.0, le=1.0, description="dense weight override: hybrid (paper 002 Eq. 1) or dense + BM25 fusion")
        include_docs: bool = Field(True, description="attach DocStore fields to each result")
        fields: list[str] | None = Field(None, description="DocStore fields to return (default: all)")
        aspect_weight: float | None = Field(None, ge=0.0, le=1.0, description="weight of the aspect-match score "
                                            "fused with the candidates' score (None: the index's; 0: none)")
        aspects: dict[str, list[str]] | None = Field(
            None, description=f"aspect values to filter / boost by ({', '.join(aspect_store.aspects) if aspect_store else 'none'})"
                              ": AND across aspects, OR within one (mode: aspect_filter.mode, default filter)")
        aspect_filter: AspectFilter | None = Field(None, description="filter / boost by aspect values: the "
                                                   "request's aspects, else the query's predicted ones")

        @field_validator("aspect_weight")
        @classmethod
        def _aspect_weight(cls, v: float | None) -> float | None:
            if v and aspect_store is None:
                raise ValueError(NO_ASPECTS)
            return v

        @field_validator("aspects")
        @classmethod
        def _aspects(cls, v: dict | None) -> dict | None:
            if v is not None:
                if aspect_store is None:
                    raise ValueError(NO_ASPECTS)
                if not v or any(not values for values in v.values()):
                    raise ValueError("give at least one aspect and one value per aspect")
                aspect_store.condition(v)  # names the unknown aspect or value
            return v

        @field_validator("aspect_filter")
        @classmethod
        def _aspect_filter(cls, v: AspectFilter | None) -> AspectFilter | None:
            if v is not None and aspect_store is None:
                raise ValueError(NO_ASPECTS)
            return v

        @field_validator("query")
        @classmethod
        def _query(cls, v: str) -> str:
            return check_text(v, "query")

        @field_validator("filters")
        @classmethod
        def _filters(cls, v: dict | None) -> dict | None:
            if v is not None:
                check_filters(v, filter_fields)
            return v

        @field_validator("fields")
        @classmethod
        def _fields(cls, v: list[str] | None) -> list[str] | None:
            unknown = [f for f in v or [] if f not in doc_fields]
            if unknown:
                raise ValueError(f"unknown document field(s) {unknown}; known: {', '.join(doc_fields) or 'none'}")
            return v

    class ExplainRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        query: str = Field(min_length=1, max_length=s.max_query_chars)
        doc_id: int | None = Field(None, ge=0, le=MAX_DOC_ID, description="a document of the index (its DocStore text)")
        doc_text: str | None = Field(None, min_length=1, max_length=8 * s.max_query_chars,
                                     description="or the document text itself")

        @field_validator("query", "doc_text")
        @classmethod
        def _text(cls, v: str | None, info: ValidationInfo) -> str | None:
            return v if v is None else check_text(v, str(info.field_name))

        @model_validator(mode="after")
        def _one_doc(self) -> "ExplainRequest":
            if (self.doc_id is None) == (self.doc_text is None):
                raise ValueError("give exactly one of doc_id and doc_text")
            return self

    class EncodeRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        texts: list[str] = Field(min_length=1, max_length=s.max_encode_texts, description="query texts")
        top_terms: int = Field(20, ge=0, le=256, description="sparse terms to return per text")
        include_dense: bool = True

        @field_validator("texts")
        @classmethod
        def _texts(cls, v: list[str]) -> list[str]:
            for i, t in enumerate(v):
                if len(t) > s.max_query_chars:
                    raise ValueError(f"texts[{i}] must be at most {s.max_query_chars} characters")
                check_text(t, f"texts[{i}]")
            return v

    return {"search": SearchRequest, "explain": ExplainRequest, "encode": EncodeRequest}


def _validation_error(_: Any, exc: RequestValidationError) -> JSONResponse:
    detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
              for e in exc.errors()]
    summary = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in detail)
    return JSONResponse({"error": summary, "detail": detail}, status_code=422)


def _body_error(exc: StarletteHTTPException) -> str | None:
    """What is wrong with a body FastAPI could not parse (its 400 names nothing), or None."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return f"body: not valid UTF-8 (byte {cause.start}: {cause.reason})"
    if isinstance(cause, RecursionError):
        return "body: JSON nested too deeply"
    return f"body: not parseable as JSON ({type(cause).__name__})"


def _http_error(_: Any, exc: StarletteHTTPException) -> JSONResponse:
    message = _body_error(exc)
    if message is not None:
        return JSONResponse({"error": message, "detail": message}, status_code=422)
    return JSONResponse({"error": str(exc.detail), "detail": exc.detail}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


# ---- the app ------------------------------------------------------------------------------------------------

class SearchRoutes:
    """Route bodies, separate from FastAPI wiring so each stays short."""

    def __init__(self, backend: Backend, settings: ServeSettings, docs: Docs) -> None:
        self.backend, self.s, self.docs = backend, settings, docs
        manifest = Manifest.load(require_manifest(settings))
        self.has_sparse = manifest.has_sparse or manifest.has_lexical  # a lam applies
        self.search_mode = manifest.search_mode
        self.lexical = LexicalExplainer(require_manifest(settings), settings.model_dir) if manifest.has_lexical \
            else None  # /explain adds the pair's BM25 part
        self.aspects = AspectStore.open(require_manifest(settings))  # None: the index has no aspect data
        self.fused = manifest.has_lexical  # the aspect stage re-scores the whole dense + BM25 union

    async def within_deadline(self, route: Awaitable[Any]) -> Any:
        """A route's answer, bounded as a whole by `request_timeout_s` (HTTP 504 + Retry-After after it)."""
        try:
            return await asyncio.wait_for(route, self.s.request_timeout_s)
        except asyncio.TimeoutError as e:
            raise HTTPException(504, f"backend did not answer within {self.s.request_timeout_s:g} s",
                                headers=RETRY_AFTER) from e

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except BackendTimeout as e:
            raise HTTPException(504, f"backend did not answer, retry: {e}", headers=RETRY_AFTER) from e
        except BackendUnavailable as e:
            raise HTTPException(503, f"backend unavailable, retry: {e}", headers=RETRY_AFTER) from e
        except BackendBadRequest as e:
            raise HTTPException(422, str(e)) from e

    def _params(self, k: int, lam: float | None) -> SearchParams:
        """The settings' `search` with the request's k and, when it sends one, lam."""
        return self.s.search.replace(k=k, **({} if lam is None else {"lam": lam}))

    async def search(self, req: Any) -> dict[str, Any]:
        route_started()
        start = time.perf_counter()
        if req.lam is not None and req.lam != 1.0 and not self.has_sparse:
            raise HTTPException(422, "lam: the index is dense-only (no sparse or BM25 part); a lambda does not apply")
        encoding = (self.backend.encode(req.query) if self.aspects is None  # no aspect data: nothing to ask for
                    else self.backend.encode(req.query, aspects=self._uses_aspects(req)))
        query: EncodedQuery = await self._call(encoding)
        encoded = time.perf_counter()
        if req.lam is not None and req.lam != 1.0 and query.sparse is None and query.lexical is None:
            raise HTTPException(422, "lam: the model is dense-only; a hybrid lambda does not apply")
        plan = self._aspect_plan(query, req)
        if req.filters:
            hits, report = await self._filtered(query, req, plan)
            searched = time.perf_counter()
        else:
            fetch = req.k if plan is None else self._aspect_fetch(req, plan)
            scores, ids = await self._ranked(query, req, fetch, plan)
            scores, ids = scores[: req.k], ids[: req.k]
            searched = time.perf_counter()
            live = ids >= 0
            with stage("fields"):
                docs = self.docs.get(ids[live]) if req.include_docs else None
            hits, report = _hits(scores[live], ids[live], docs), None
        with stage("fields"):
            for h in hits:
                h["doc"] = _project(h["doc"], req.fields) if req.include_docs else None
        end = time.perf_counter()
        timings = {"encode": 1000 * (encoded - start), "search": 1000 * (searched - encoded),
                   "docs": 1000 * (end - searched)}
        route_done()
        return {"query": req.query, "k": req.k, "lam": req.lam, "results": hits, "filter": report,
                "aspects": None if plan is None else plan.report(self.aspects),
                "took_ms": 1000 * (end - start), "timings_ms": timings}

    def _aspect_weight(self, req: Any) -> float:
        """The aspect-match weight of a request on an index with aspect data: the request's, else the index's."""
        return self.aspects.aspect_weight if req.aspect_weight is None else req.aspect_weight

    def _uses_aspects(self, req: Any) -> bool:
        """Whether the request's search (on an index with aspect data) needs the query's predicted aspect values:
        an aspect-match weight > 0 or a filter / boost by predicted values."""
        return self._aspect_weight(req) > 0 or (req.aspects is None and req.aspect_filter is not None)

    def _aspect_plan(self, query: EncodedQuery, req: Any) -> AspectPlan | None:
        """What the aspect stage does for this request (None: nothing): the weight of the aspect-match score
        (the request's, else the index's) and the condition to filter / boost by."""
        if self.aspects is None:
            return None
        weight = self._aspect_weight(req)
        mode = req.aspect_filter.mode if req.aspect_filter is not None else "filter"
        condition, source = None, None
        if req.aspects is not None:
            condition, source = self.aspects.condition(req.aspects), "request"
        elif req.aspect_filter is not None:
            if query.aspects is None:
                raise HTTPException(422, "aspect_filter: the model predicts no aspect values for the query")
            condition = predicted_condition(query.aspects, 0, req.aspect_filter.min_confidence, self.aspects)
            source = "predicted"
        if weight > 0 and query.aspects is None:
            if req.aspect_weight:
                raise HTTPException(422, "aspect_weight: the model predicts no aspect values for the query")
            weight = 0.0
        if weight == 0 and condition is None:
            return None
        return AspectPlan(weight, condition, mode, source)

    def _aspect_fetch(self, req: Any, plan: AspectPlan) -> int:
        """Candidates the aspect stage works on: the base search's candidate pool (`candidate_pool`), and for a
        filter at least `k * filter_overfetch` (up to `max_filter_fetch`)."""
        fetch = candidate_pool(self._params(req.k, req.lam), self.fused)
        if plan.condition and plan.mode == "filter":
            fetch = max(fetch, min(req.k * self.s.filter_overfetch, self.s.max_filter_fetch))
        return fetch

    async def _ranked(self, query: EncodedQuery, req: Any, fetch: int,
                      plan: AspectPlan | None) -> tuple[np.ndarray, np.ndarray]:
        """The live top-`fetch` of the index, then (with a plan) re-scored by the aspect match and filtered /
        boosted by the plan's condition (`madr.search.aspect_match`)."""
        scores, ids = await self._call(self.backend.search(query, self._params(fetch, req.lam)))
        live = ids >= 0
        scores, ids = scores[live], ids[live]
        if plan is None:
            return scores, ids
        with stage("aspects"):
            if plan.weight > 0:
                top = aspect_rescore((scores[None], ids[None]), query.aspects, self.aspects, plan.weight, fetch)
                live = top[1][0] >= 0
                scores, ids = top[0][0][live], top[1][0][live]
            plan.fetched = int(ids.size)
            if plan.condition:
                mask = condition_mask(self.aspects.lookup(ids), plan.condition)
                plan.matched = int(mask.sum())
                scores, ids = apply_condition(scores, ids, mask, plan.mode)
        return scores, ids

    async def _filtered(self, query: EncodedQuery, req: Any, plan: AspectPlan | None = None
                        ) -> tuple[list[dict], dict]:
        """Over-fetch `k * filter_overfetch` candidates, doubling up to `max_filter_fetch`, until k pass."""
        wanted = check_filters(req.filters, self.docs.filter_fields(self.s))
        fetch = min(max(req.k * self.s.filter_overfetch, req.k), self.s.max_filter_fetch)
        if plan is not None:
            fetch = max(fetch, self._aspect_fetch(req, plan))
        while True:
            scores, ids = await self._ranked(query, req, fetch, plan)
            live = ids >= 0
            with stage("fields"):
                docs = self.docs.get(ids[live])
            keep = [i for i, d in enumerate(docs) if matches(d, wanted)]
            exhausted = plan is not None or int(live.sum()) < fetch or fetch >= self.s.max_filter_fetch
            if len(keep) >= req.k or exhausted:
                break
            fetch = min(2 * fetch, self.s.max_filter_fetch)
        keep = keep[: req.k]
        hits = _hits(scores[live][keep], ids[live][keep], [docs[i] for i in keep])
        return hits, {"fetched": fetch, "matched": len(keep), "complete": len(keep) >= req.k}

    async def explain(self, req: Any) -> dict[str, Any]:
        text, doc_id = req.doc_text, req.doc_id
        if doc_id is not None:
            try:
                text = self.docs.text(doc_id, self.docs.text_field(self.s))
            except LookupError as e:
                raise HTTPException(404, str(e)) from e
            except ValueError as e:
                raise HTTPException(422, str(e)) from e
        out = await self._call(self.backend.explain(req.query, text))
        if self.aspects is not None and "aspect_match" in out:
            out["aspect_match"]["index_aspect_weight"] = self.aspects.aspect_weight
        if self.lexical is not None:
            out["bm25"] = await asyncio.to_thread(self.lexical.explain, req.query, text)
        return {"doc_id": doc_id, **out}

    async def encode(self, req: Any) -> dict[str, Any]:
        encoded = await self._call(asyncio.gather(*[self.backend.encode(t) for t in req.texts]))
        results = []
        for q in encoded:
            terms: list[dict] = []
            if q.sparse is not None and req.top_terms:
                ids, weights = q.sparse.row(0)
                order = np.argsort(-weights, kind="stable")[: req.top_terms]
                names = await self._call(self.backend.term_names([int(i) for i in ids[order]]))
                terms = [{"id": int(ids[o]), "term": n, "weight": float(weights[o])} for o, n in zip(order, names,
                                                                                                      strict=True)]
            results.append({"dense": q.dense.tolist() if req.include_dense else None,
                            "sparse_nnz": 0 if q.sparse is None else int(q.sparse.nnz), "terms": terms})
        return {"dim": int(encoded[0].dense.shape[0]), "results": results}

    async def ready(self) -> JSONResponse:
        try:
            info = await asyncio.wait_for(self.backend.ready(), self.s.request_timeout_s)
        except Exception as e:  # noqa: BLE001 - any failure means not ready; say which
            return JSONResponse({"ready": False, "error": f"{type(e).__name__}: {e}"}, status_code=503)
        return JSONResponse({"ready": True, "docstore": self.docs.path is not None, "search_mode": self.search_mode,
                             **info})


def _hits(scores: np.ndarray, ids: np.ndarray, docs: list | None) -> list[dict]:
    return [{"id": int(i), "score": float(s), "doc": None if docs is None else docs[j]}
            for j, (s, i) in enumerate(zip(scores, ids, strict=True))]


def _project(doc: dict | None, fields: list[str] | None) -> dict | None:
    if doc is None:
        return None
    doc = {k: _jsonable(v) for k, v in doc.items()}
    return doc if fields is None else {f: doc.get(f) for f in fields}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)


def create_api(backend: Backend, settings: ServeSettings, docs: Docs, latency: StageSink | None = None) -> FastAPI:
    """The FastAPI app over `backend`; wrapped in `Guard` (API key + body size) and, outermost, `StageTimer`:
    every `/search` request's stage breakdown (`serve.latency`) goes to `latency` (default: a line on the
    `serve.latency` logger when `settings.access_log`). Refuses (ValueError) to build an open API on a non-loopback host
    unless the settings say `public` (`serve.config.check_exposure`)."""
    check_exposure(settings)
    routes = SearchRoutes(backend, settings, docs)
    models = request_models(settings, docs.filter_fields(settings), docs.fields, routes.aspects)
    search_model, explain_model, encode_model = models["search"], models["explain"], models["encode"]
    app = FastAPI(title=TITLE, version="1", description=__doc__)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # FastAPI's own 400 / 404 / 405 too

    @app.post("/search", response_model=SearchResponse)
    async def search(req: search_model) -> dict:  # type: ignore[valid-type]
        return await routes.within_deadline(routes.search(req))

    @app.post("/explain")
    async def explain(req: explain_model) -> dict:  # type: ignore[valid-type]
        return await routes.within_deadline(routes.explain(req))

    @app.post("/encode")
    async def encode(req: encode_model) -> dict:  # type: ignore[valid-type]
        return await routes.within_deadline(routes.encode(req))

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz() -> dict:
        return {"status": "ok", "search_mode": routes.search_mode}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        return await routes.ready()

    app.add_middleware(Guard, api_key=resolved_api_key(settings), max_body=settings.max_body_bytes,
                       max_header=settings.max_header_bytes, body_timeout_s=settings.body_timeout_s)
    if latency is None:
        latency = StageSink(logging.getLogger("serve.latency"), settings.access_log)
    app.add_middleware(StageTimer, sink=latency)  # added last: the outermost, so `http` includes the guard
    return app


def plain_app(settings: ServeSettings) -> FastAPI:
    """The same API over an in-process `LocalBackend` (no Ray): `uvicorn` runs it directly."""
    from serve.backend import LocalBackend

    manifest = require_manifest(settings)
    backend = LocalBackend(manifest, settings.model_dir, settings.mmap, settings.verify, settings.torch_threads,
                           settings.encoder_index_vocabulary, settings.encoder_backend, settings.encoder_precision)
    return create_api(backend, settings, Docs.open(manifest))
