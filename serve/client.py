"""A small Python client for the madr search API (requests, one session with keep-alive).

    from serve.client import MadrClient
    client = MadrClient("http://127.0.0.1:8000", api_key="...")   # api_key: None when the API is open
    client.wait_ready()
    hits = client.search("red running shoes", k=5, filters={"brand": "acme"})
    for hit in hits["results"]:
        print(hit["id"], hit["score"], hit["doc"])

Errors (4xx / 5xx) raise `MadrAPIError` with the status and the server's message.
"""

from __future__ import annotations

import time
from typing import Any

import requests


class MadrAPIError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class MadrClient:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
                 timeout: float = 30.0) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.session = requests.Session()
        if api_key:
            self.session.headers["X-API-Key"] = api_key

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        resp = self.session.request(method, self.base_url + path, json=body, timeout=self.timeout)
        if resp.status_code >= 400:
            try:
                message = resp.json().get("error", resp.text)
            except ValueError:
                message = resp.text
            raise MadrAPIError(resp.status_code, message)
        return resp.json()

    def search(self, query: str, k: int = 10, filters: dict[str, str | list[str]] | None = None,
               lam: float | None = None, include_docs: bool = True, fields: list[str] | None = None) -> dict:
        body: dict[str, Any] = {"query": query, "k": k, "include_docs": include_docs}
        for name, value in (("filters", filters), ("lam", lam), ("fields", fields)):
            if value is not None:
                body[name] = value
        return self._request("POST", "/search", body)

    def explain(self, query: str, doc_id: int | None = None, doc_text: str | None = None) -> dict:
        body: dict[str, Any] = {"query": query}
        body.update({"doc_id": doc_id} if doc_id is not None else {"doc_text": doc_text})
        return self._request("POST", "/explain", body)

    def encode(self, texts: list[str], top_terms: int = 20, include_dense: bool = True) -> dict:
        return self._request("POST", "/encode", {"texts": texts, "top_terms": top_terms,
                                                 "include_dense": include_dense})

    def health(self) -> dict:
        return self._request("GET", "/healthz")

    def ready(self) -> dict:
        return self._request("GET", "/ready")

    def wait_ready(self, timeout: float = 120.0, interval: float = 0.5) -> dict:
        """Poll `/ready` until it answers 200; the last error after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.ready()
            except (MadrAPIError, requests.ConnectionError) as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.base_url} not ready after {timeout} s: {e}") from e
                time.sleep(interval)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> MadrClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
