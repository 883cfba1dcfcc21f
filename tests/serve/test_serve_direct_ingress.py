"""Ray Serve's throughput mode (`serve.direct_ingress`): the co-located replica serves HTTP on its own
port, with no Serve proxy in the path, and answers exactly what the proxy path answers, with the same key check
and validation, listening on loopback only. It runs in a child process with its own Ray (the mode is fixed when
Serve's processes start; the session's Ray runs without it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import free_port

from serve.direct_ingress import replica_urls

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def test_replica_urls_keep_the_apps_replica_ports_not_the_proxy():
    details = {"http_options": {"port": 8000}, "target_groups": [
        {"app_name": "madr", "route_prefix": "/", "protocol": "HTTP",
         "targets": [{"ip": "10.0.0.5", "port": 30001}, {"ip": "10.0.0.5", "port": 30000}]},
        {"app_name": "madr", "route_prefix": "/", "protocol": "gRPC", "targets": [{"ip": "10.0.0.5", "port": 40000}]},
        {"app_name": "other", "route_prefix": "/other/", "protocol": "HTTP", "targets": [{"ip": "x", "port": 30002}]},
        {"app_name": "late", "route_prefix": "/late", "protocol": "HTTP", "targets": [{"ip": "x", "port": 8000}]},
    ]}
    assert replica_urls("madr", details=details) == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert replica_urls("other", host="::1", details=details) == ["http://::1:30002/other"]
    assert replica_urls("late", details=details) == []  # no replica up yet: only the proxy is listed


def test_direct_ingress_answers_as_the_proxy_does_with_the_key_and_on_loopback(served_index):
    queries = served_index["queries"][:4]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "serve")])}
    child = subprocess.run([sys.executable, str(ROOT / "tests" / "serve" / "direct_ingress_child.py"),
                            str(served_index["manifest"]), str(free_port()), *queries],
                           capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith("RESULT ")]
    assert child.returncode == 0 and lines, child.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert len(out["urls"]) == 1, out["urls"]
    for proxy, direct in zip(out["proxy"], out["direct"], strict=True):
        assert direct["results"] and [r["id"] for r in direct["results"]] == [r["id"] for r in proxy["results"]]
        assert [r["score"] for r in direct["results"]] == pytest.approx([r["score"] for r in proxy["results"]],
                                                                        abs=1e-5)
    assert out["proxy_no_key"] == out["direct_no_key"] == 401
    assert out["proxy_bad"] == out["direct_bad"] == 422
    assert out["direct_listens_on"] == ["0100007F"]  # 127.0.0.1 only
