"""Helpers shared by the serving tests (imported as a plain module: tests/serve is on sys.path)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import requests

from pipelines.jobs.local_cluster import free_port  # noqa: F401  (the serve tests import it from here)

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
ID_OFFSET, ID_STEP = 5, 3  # global ids are not row numbers


@contextmanager
def running_plain_app(settings) -> Iterator[str]:
    """`serve.api.plain_app(settings)` on uvicorn in a daemon thread at 127.0.0.1:`settings.port`; yields its
    base URL once started (30 s at most) and stops it on exit."""
    from serve.api import plain_app

    with running_asgi(plain_app(settings), settings.port) as url:
        yield url


@contextmanager
def running_asgi(app, port: int) -> Iterator[str]:
    """Any ASGI `app` on uvicorn in a daemon thread at 127.0.0.1:`port` (as `running_plain_app`)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def docs_table(catalog, ids: np.ndarray) -> pa.Table:
    """doc_id, text (what the towers encode), title and the aspect fields (brand: a string, color and
    category: lists) that the filters act on."""
    ps = catalog.products
    return pa.table({
        "doc_id": pa.array(ids, pa.int64()),
        "text": [catalog.product_text(p) for p in ps],
        "title": [p.title for p in ps],
        "brand": [(p.aspects.get("brand") or [None])[0] for p in ps],
        "color": [list(p.aspects.get("color") or []) for p in ps],
        "category": [list(p.aspects.get("category") or []) for p in ps],
    })


def assert_same_ranking(got_scores, got_ids, ref_scores, ref_ids, what):
    """Scores equal to 1e-4; ids equal wherever the reference score is not within 1e-4 of a neighbour
    (batched vs single encoding moves scores by ~1e-6, which may swap exact near-ties)."""
    ref_scores, ref_ids = np.asarray(ref_scores), np.asarray(ref_ids)
    live = ref_ids >= 0
    ref_scores, ref_ids = ref_scores[live], ref_ids[live]
    assert len(got_ids) == len(ref_ids), f"{what}: {len(got_ids)} results, offline {len(ref_ids)}"
    np.testing.assert_allclose(got_scores, ref_scores, rtol=1e-4, atol=1e-4, err_msg=what)
    gaps = np.abs(np.diff(ref_scores))
    isolated = np.ones(len(ref_ids), bool)
    isolated[:-1] &= gaps > 1e-4
    isolated[1:] &= gaps > 1e-4
    assert np.array_equal(np.asarray(got_ids)[isolated], ref_ids[isolated]), f"{what}: {got_ids} != {ref_ids}"


# ---- load with a record of every answer (replica death / hang tests) ----

@dataclass
class Answer:
    sent: float  # time.monotonic()
    took_s: float
    status: int  # 0: no HTTP answer (connection error or a 30 s client timeout); -1: a 200 short of its hits
    retry_after: str | None
    body: str = ""  # the start of the answer (or of the client's error)


class Load:
    """`clients` threads sending POST /search in a closed loop until stopped; every answer is recorded."""

    def __init__(self, url: str, queries: list[str], clients: int = 4) -> None:
        self.url, self.queries, self.clients = url, queries, clients
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, i: int) -> None:
        with requests.Session() as http:
            n = i
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    r = http.post(self.url + "/search", json={"query": self.queries[n % len(self.queries)], "k": 5},
                                  timeout=30)
                    status, retry, body = r.status_code, r.headers.get("Retry-After"), r.text[:300]
                    if status == 200 and len(r.json()["results"]) != 5:
                        status = -1  # an answer without its 5 hits
                except requests.RequestException as e:
                    status, retry, body = 0, None, repr(e)[:300]
                self.answers.append(Answer(t, time.monotonic() - t, status, retry, body))
                n += self.clients

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=40)

    def since(self, t0: float) -> list[Answer]:
        """Answers that arrived after `t0` (requests in flight at `t0` included)."""
        return [a for a in list(self.answers) if a.sent + a.took_s >= t0]


def wait_for(check, timeout_s: float, message: str) -> float:
    """Seconds until `check()` is true (polled every 0.2 s); fails with `message` after `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - not yet: keep polling
            pass
        time.sleep(0.2)
    pytest.fail(f"{message} after {timeout_s} s")


def describe(answers: list[Answer]) -> str:
    by = {}
    for a in answers:
        by.setdefault(a.status, []).append(a.took_s)
    return ", ".join(f"{s}: {len(t)} (max {max(t):.2f} s)" for s, t in sorted(by.items()))


def latency_lines(app: str, deployment: str, n: int, timeout_s: float = 20.0) -> list[tuple[int, dict[str, float]]]:
    """(status, stages) of the `/search` latency lines (`serve.latency`) in the Serve log files of `app`'s
    `deployment` replicas on this test's Ray; polled until there are `n` or `timeout_s` has passed."""
    import ray

    from serve.latency import parse_line

    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [p for f in sorted(logs.glob(f"replica_{app}_{deployment}_*.log"))
                 for p in map(parse_line, f.read_text(errors="replace").splitlines()) if p is not None]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)
