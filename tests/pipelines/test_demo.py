"""pipelines.demo's HTTP side: plain JSON over HTTP (no `serve` import), readiness polling with a deadline."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.demo import http_json, wait_ready


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._send({"path": self.path})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send({"path": self.path, "body": body, "type": self.headers["Content-Type"]})

    def _send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def echo_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_http_json_posts_json_and_decodes_the_answer(echo_url):
    assert http_json(f"{echo_url}/ready") == {"path": "/ready"}
    reply = http_json(f"{echo_url}/search", {"query": "weiße socken", "k": 3})
    assert reply == {"path": "/search", "body": {"query": "weiße socken", "k": 3}, "type": "application/json"}
    wait_ready(echo_url, timeout=5)


def test_wait_ready_gives_up_after_its_deadline_naming_the_url():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(TimeoutError, match="not ready after 0.3 s"):
        wait_ready(url, timeout=0.3, interval=0.05)


def test_demo_does_not_import_serve():
    """`pipelines` is a Ray layer over `madr`; the served API is reached over HTTP, not through `serve`."""
    code = "import sys, pipelines.demo; print(sorted(m for m in sys.modules if m.split('.')[0] == 'serve'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"pipelines.demo imported {out.strip()}"
