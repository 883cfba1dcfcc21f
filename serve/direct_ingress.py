"""Direct ingress: each co-located replica answers HTTP on its own port, with no Serve proxy in the path.

Ray Serve (2.56+) has a throughput-optimised mode, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (Ray's "Enable High
Throughput" guide): among other things every ingress replica starts its own HTTP server (on
``http_options.host``, ports from 30000, allocated by Serve's controller) besides the usual proxy on
``http_options.port``. With the co-located topology the ingress replica *is* the whole app (encoder + every
shard, `serve.colocated`), so a client that calls the replica's port skips the proxy -> replica hop, most of
what Serve adds to the latency of the same code run in one process.

The mode is read by every Serve process when it imports Serve, so it must be in the environment **before the
Ray cluster starts** (`throughput_env` before `ray.init` / ``ray start``); it cannot be switched per app.
Where madr starts Ray for Serve (the deploy stage's ``serve run``, `pipelines.jobs.local_cluster`, the cluster
YAMLs and KubeRay manifests) the mode is on unless the environment says ``RAY_SERVE_THROUGHPUT_OPTIMIZED=0``:
its proxy routes in an event loop of its own, which is what lets a burst's excess be refused on arrival. The
same API key, limits and error handling apply on both paths (they live in the app, not in the proxy).
The proxy port keeps working and stays the one to give clients when there are several replicas: a replica's
port routes to that replica only (Ray's HAProxy ingress, ``RAY_SERVE_ENABLE_HA_PROXY=1``, balances over them
on a node with the ``haproxy`` binary; not used here).
"""

from __future__ import annotations

import os
import time
from typing import Any

THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def throughput_env(environ: dict[str, str] | None = None, override: bool = True) -> dict[str, str]:
    """Set Ray Serve's throughput-optimised mode (direct ingress on) in `environ` (default: os.environ);
    call before the Ray cluster starts. `override=False` keeps a value the environment already has (``0``
    turns the mode off where madr starts Ray for Serve). Returns the variables as set."""
    target = os.environ if environ is None else environ
    for key, value in THROUGHPUT_ENV.items():
        if override:
            target[key] = value
        else:
            target.setdefault(key, value)
    return {key: target[key] for key in THROUGHPUT_ENV}


def replica_urls(app_name: str, host: str = "127.0.0.1", details: dict[str, Any] | None = None) -> list[str]:
    """Base URLs (``http://host:port/route_prefix``) of the running replicas of `app_name` that serve HTTP
    themselves, from Serve's instance details (``target_groups``: the proxy's port when direct ingress is off or
    no replica is up yet, which is left out). `host`: where the replicas listen (``http_options.host``).
    `details`: Serve's instance details (default: asked from the running Serve controller)."""
    if details is None:
        from ray.serve.context import _get_global_client

        details = _get_global_client().get_serve_details()
    proxy_port = (details.get("http_options") or {}).get("port")
    urls = []
    for group in details.get("target_groups", []):
        protocol = group.get("protocol", "")
        if group.get("app_name") != app_name or str(getattr(protocol, "value", protocol)).upper() != "HTTP":
            continue
        prefix = "" if group["route_prefix"] == "/" else group["route_prefix"].rstrip("/")
        urls += [f"http://{host}:{t['port']}{prefix}" for t in group["targets"] if t["port"] != proxy_port]
    return sorted(urls)


def wait_for_replica_urls(app_name: str, timeout_s: float = 60.0, host: str = "127.0.0.1") -> list[str]:
    """`replica_urls` once Serve lists at least one (a replica allocates its port after it starts), polled every
    0.5 s; empty when none is listed within `timeout_s` (direct ingress off, or no replica up)."""
    deadline = time.monotonic() + timeout_s
    while not (urls := replica_urls(app_name, host)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return urls


__all__ = ["THROUGHPUT_ENV", "replica_urls", "throughput_env", "wait_for_replica_urls"]
