"""The API's answers when its backend is down or slow: 503 and 504 both carry
``Retry-After: 1`` and come within their deadlines. The backend here is a plain `Backend` whose calls fail or
sleep (no Ray); the Ray side (a SIGKILLed replica -> `BackendUnavailable`) is tests/serve/test_serve_replica_death."""

from __future__ import annotations

import asyncio
import time

import requests
from serve_helpers import free_port, running_asgi

from serve.api import create_api
from serve.backend import BackendUnavailable, Docs, EncodedQuery
from serve.config import ServeSettings


class BrokenBackend:
    """A `serve.backend.Backend` whose encoder is down ("down") or never answers ("slow")."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def encode(self, text: str, aspects: bool = True) -> EncodedQuery:
        if self.mode == "down":
            raise BackendUnavailable("QueryEncoder: ActorDiedError: the replica died")
        await asyncio.sleep(30)
        raise AssertionError("the request deadline did not fire")


def test_down_backend_is_503_and_slow_backend_is_504_both_with_retry_after(served_index):
    for mode, status in (("down", 503), ("slow", 504)):
        settings = ServeSettings(manifest_path=str(served_index["manifest"]), port=free_port(),
                                 request_timeout_s=0.5)
        app = create_api(BrokenBackend(mode), settings, Docs(None, [], None))
        with running_asgi(app, settings.port) as url:
            t = time.monotonic()
            r = requests.post(url + "/search", json={"query": "red shoes"}, timeout=10)
            took = time.monotonic() - t
        assert r.status_code == status, (mode, r.status_code, r.text)
        assert r.headers.get("Retry-After") == "1", (mode, dict(r.headers))
        assert took < 2.0, f"{mode}: answered after {took:.2f} s"
        if mode == "down":
            assert "ActorDiedError" in r.json()["error"], r.text
