"""Where a `/search` request's time goes: a per-stage breakdown in one log line per request and in Prometheus.

Stages, in ms, each timed where it runs (`madr.search.timing` marks the search code's own):

| stage | timed on | what |
|---|---|---|
| `http` | ingress | arrival at the app -> the route starts: API key and size checks, body read, JSON parse, validation |
| `encode_call` | ingress | wall time of the encode hop (fan-out: the handle call; co-located: the in-process call, batching wait included) |
| `encode` | encoder | the query tower's forward pass (+ BM25 term counts) of the batch the query was in |
| `search_call` | ingress | wall time of the search hop (every shard group, concurrently; summed over a filter's rounds) |
| `dense` | searcher | FAISS top-k |
| `sparse` | searcher | the hybrid index's sparse top-candidates |
| `bm25` | searcher | the BM25 top-candidates |
| `fusion` | searcher, ingress | hybrid re-scoring + interpolation (searcher); dense + BM25 fusion of the groups' lists (ingress) |
| `merge` | searcher, ingress | the top-k over shards (searcher) and over shard groups (ingress) |
| `fields` | ingress | DocStore look-ups and field projection |
| `respond` | ingress | the route's return -> response start: response validation and JSON encoding |
| `total` | ingress | arrival at the app -> the response sent |

`encode_call - encode` and `search_call - (dense + sparse + bm25 + fusion + merge)` are what the hops cost:
network, serialisation, queueing and batching waits. What happens before the app (Serve's proxy, its queue) is
Serve's own `ray_serve_http_request_latency_ms`.

Exported through Ray Serve's metrics (`ray.serve.metrics`; Prometheus names gain Ray's ``ray_`` prefix):
``madr_search_stage_ms`` (histogram, tag ``stage``, plus Serve's ``deployment``, ``replica``, ``application``).
Each process observes only the stages it timed itself, once per request (a batch's stages once for each of its
requests), successful (2xx) requests only; the ingress's log line (`StageSink`) carries every stage, the
replicas' reported back with their answers (`EncodedQuery.stage_ms`, `Searched.stage_ms`; concurrent shard
groups: the slowest group's). The line goes through Serve's access log (``ray.serve`` logger, marked as an
access-log record), so Serve's `enable_access_log` (`ServeSettings.access_log` for `run_local`) turns it off
with the access log; the plain app logs it on `serve.latency` when `access_log` is set.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from time import perf_counter
from typing import Any, TypeVar

from madr.search.timing import collecting

STAGE_METRIC = "madr_search_stage_ms"
BOUNDARIES_MS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
ORDER = ("http", "encode_call", "encode", "search_call", "dense", "sparse", "bm25", "fusion", "merge", "fields",
         "respond", "total")  # the log line's order; any other stage follows
SEARCH_PATH = "/search"
LOG_PREFIX = "madr_search"

T = TypeVar("T")


@dataclass(slots=True)
class RequestClock:
    """One request's times: `stages` timed in this process, `reported` by the replicas it called."""

    arrived: float
    stages: dict[str, float] = field(default_factory=dict)
    reported: dict[str, float] = field(default_factory=dict)
    route_end: float | None = None

    def breakdown(self) -> dict[str, float]:
        """Every stage, ms: this process's and the replicas' (a stage timed in both sums)."""
        out = dict(self.stages)
        for name, ms in self.reported.items():
            out[name] = out.get(name, 0.0) + ms
        return out


_CLOCK: ContextVar[RequestClock | None] = ContextVar("madr_request_clock", default=None)


def route_started() -> None:
    """The route begins: what came before it is the `http` stage."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.stages["http"] = 1000.0 * (perf_counter() - clock.arrived)


def route_done() -> None:
    """The route has its answer: what follows until the response starts is the `respond` stage."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.route_end = perf_counter()


def report(parts: Iterable[Mapping[str, float] | None]) -> None:
    """Stage times the replicas sent back with their answers to concurrent calls: each stage's slowest is added
    to the request's `reported` stages."""
    clock = _CLOCK.get()
    if clock is None:
        return
    slowest: dict[str, float] = {}
    for part in parts:
        for name, ms in (part or {}).items():
            if ms > slowest.get(name, -1.0):
                slowest[name] = ms
    for name, ms in slowest.items():
        clock.reported[name] = clock.reported.get(name, 0.0) + ms


class StageMetrics:
    """`madr_search_stage_ms{stage}` (a `ray.serve.metrics.Histogram`) of one process, and an in-process tally
    of the same observations (count and sum per stage: what tests read back)."""

    def __init__(self, histogram: Any | None) -> None:
        self.histogram = histogram
        self._tags: dict[str, dict[str, str]] = {}
        self._tally: dict[str, list[float]] = {}
        self._lock = threading.Lock()  # batches observe from worker threads, the ingress from its event loop

    def observe(self, stages: Mapping[str, float], times: int = 1) -> None:
        """Each stage's ms, observed `times` times (a batch's stages once for each of its requests)."""
        for name, ms in stages.items():
            tags = self._tags.get(name) or self._tags.setdefault(name, {"stage": name})
            with self._lock:
                tally = self._tally.setdefault(name, [0, 0.0])
                tally[0] += times
                tally[1] += ms * times
            if self.histogram is not None:
                for _ in range(times):
                    self.histogram.observe(ms, tags=tags)

    def tally(self) -> dict[str, tuple[int, float]]:
        """(observations, ms summed) per stage so far."""
        with self._lock:
            return {name: (int(n), total) for name, (n, total) in self._tally.items()}


@cache
def stage_metrics() -> StageMetrics:
    """This process's `StageMetrics`: exported through Ray when Ray is up (a replica), else a tally only."""
    import ray

    if not ray.is_initialized():
        return StageMetrics(None)
    from ray.serve.metrics import Histogram

    histogram = Histogram(STAGE_METRIC, description="Time of one /search request in each stage (ms)",
                          boundaries=BOUNDARIES_MS, tag_keys=("stage",))
    return StageMetrics(histogram)


def timed_batch(fn: Callable[[list[T]], Sequence[Any]], items: list[T]) -> tuple[list[Any], dict[str, float]]:
    """`fn(items)` with its stages collected (`madr.search.timing`) and observed once for each item: a
    replica's batch, run in its worker thread."""
    with collecting() as stages:
        out = list(fn(items))
    stage_metrics().observe(stages, times=len(items))
    return out, stages


class StageSink:
    """What happens to a finished request's clock: its own stages observed (`metrics`, 2xx only) and, when
    `log` is set, one line on `logger`: ``madr_search status=200 total=12.31 http=0.42 ...`` (ms)."""

    def __init__(self, logger: logging.Logger, log: bool, metrics: StageMetrics | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.logger, self.log, self.metrics, self.extra = logger, log, metrics, extra

    @classmethod
    def for_serve(cls, access_log: bool) -> StageSink:
        """In a Serve replica: Ray's metrics, and the line as an access-log record of Serve's logger (dropped
        where Serve's access log is off)."""
        return cls(logging.getLogger("ray.serve"), access_log, stage_metrics(), {"serve_access_log": True})

    def __call__(self, clock: RequestClock, status: int) -> None:
        if self.metrics is not None and 200 <= status < 300:
            self.metrics.observe(clock.stages)
        if self.log and self.logger.isEnabledFor(logging.INFO):
            self.logger.info(log_line(clock.breakdown(), status), extra=self.extra)


def log_line(stages: Mapping[str, float], status: int) -> str:
    """``madr_search status=<code> <stage>=<ms> ...``, stages in `ORDER`, then any other."""
    names = [n for n in ORDER if n in stages] + sorted(n for n in stages if n not in ORDER)
    return " ".join([f"{LOG_PREFIX} status={status}", *(f"{n}={stages[n]:.2f}" for n in names)])


def parse_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(status, stages) of a `log_line` found in `line` (a log file's line), else None."""
    start = line.find(LOG_PREFIX + " status=")
    if start < 0:
        return None
    pairs = dict(p.split("=", 1) for p in line[start + len(LOG_PREFIX) + 1:].split() if "=" in p)
    status = int(pairs.pop("status"))
    return status, {n: float(v) for n, v in pairs.items()}


class StageTimer:
    """Pure ASGI middleware (outermost): opens a `RequestClock` for every `/search` request, collects the stages
    its route marks, and hands the clock to `sink` once the response is sent."""

    def __init__(self, app: Any, sink: Callable[[RequestClock, int], None]) -> None:
        self.app, self.sink = app, sink

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(SEARCH_PATH):
            return await self.app(scope, receive, send)
        clock = RequestClock(perf_counter())
        status = 500  # no response sent: the app raised

        async def timed_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if clock.route_end is not None:
                    clock.stages["respond"] = 1000.0 * (perf_counter() - clock.route_end)
            await send(message)

        token = _CLOCK.set(clock)
        try:
            with collecting(clock.stages):
                await self.app(scope, receive, timed_send)
        finally:
            _CLOCK.reset(token)
            clock.stages["total"] = 1000.0 * (perf_counter() - clock.arrived)
            self.sink(clock, status)


__all__ = ["BOUNDARIES_MS", "ORDER", "STAGE_METRIC", "RequestClock", "StageMetrics", "StageSink", "StageTimer",
           "log_line", "parse_line", "report", "route_done", "route_started", "stage_metrics", "timed_batch"]
