"""Child process of test_serve_direct_ingress.py: its own local Ray in Ray Serve's throughput mode (the mode is
read when Serve's processes start, so it cannot join the test session's Ray), the co-located app on the given
index with an API key; asks every query through Serve's proxy and through the replica's own port, and prints
what it saw as one JSON line.

    python direct_ingress_child.py MANIFEST PROXY_PORT QUERY [QUERY ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipelines.runtime import apply_ray_env

apply_ray_env(offline=True)

KEY = "direct-ingress-test-key"


def listening_addresses(port: int) -> list[str]:
    """Local IPv4 addresses (hex, as /proc/net/tcp writes them) with a socket listening on `port`."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(address)
    return found


def main(manifest: str, proxy_port: int, queries: list[str]) -> dict:
    import ray
    import requests

    from serve.app import run_local
    from serve.config import DeploymentSettings, ServeSettings
    from serve.direct_ingress import throughput_env, wait_for_replica_urls

    throughput_env()
    # Serve restarts a proxy that is not ready within 5 s, three times over, then gives up; on a loaded 2-core box
    # the proxy's start takes longer than that (seen beside a training run)
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    settings = ServeSettings(manifest_path=manifest, port=proxy_port, api_key=KEY, topology="colocated",
                             colocated=DeploymentSettings(num_cpus=0.2), log_level="WARNING", access_log=False)
    run_local(settings)
    urls = wait_for_replica_urls("madr")
    key = {"X-API-Key": KEY}
    out: dict = {"urls": urls}
    for name, base in (("proxy", f"http://127.0.0.1:{proxy_port}"), ("direct", urls[0] if urls else None)):
        if base is None:
            continue
        out[name] = [requests.post(base + "/search", json={"query": q, "k": 5}, headers=key, timeout=30).json()
                     for q in queries]
        out[name + "_no_key"] = requests.post(base + "/search", json={"query": queries[0]}, timeout=30).status_code
        out[name + "_bad"] = requests.post(base + "/search", json={"query": ""}, headers=key, timeout=30).status_code
    if urls:
        out["direct_listens_on"] = listening_addresses(int(urls[0].rsplit(":", 1)[1].split("/")[0]))
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
    print("RESULT " + json.dumps(result), flush=True)
