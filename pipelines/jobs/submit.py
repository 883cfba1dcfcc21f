"""Submit stages to a Ray cluster as Ray jobs (the REST API behind `ray job submit`).

Each job's entrypoint is `python -m pipelines.jobs run-stage ...`, so the completion check and the marker
happen on the cluster, next to the outputs. The runtime env comes from cluster/runtime_env.yaml. When the
cluster runs on this machine (`same_host`: the `up` cluster, or --same-host), the job runs in this checkout
instead of an uploaded copy, so relative output paths land in ./runs as they do without a cluster.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
DEFAULT_RUNTIME_ENV = "cluster/runtime_env.yaml"


def normalise_address(address: str) -> str:
    """The dashboard's HTTP address; `host:port` gets http://. Ray Client (ray://) addresses are refused."""
    if address.startswith("ray://"):
        raise ValueError(f"{address}: job submission talks to the dashboard's HTTP address "
                         f"(e.g. http://<head>:8265), not a Ray Client address")
    if "://" not in address:
        address = "http://" + address
    if urlparse(address).scheme not in ("http", "https"):
        raise ValueError(f"{address}: expected an http(s):// dashboard address")
    return address.rstrip("/")


def is_loopback(address: str) -> bool:
    return urlparse(normalise_address(address)).hostname in LOOPBACK


def auth_headers(address: str, token: str | None = None) -> dict[str, str]:
    """The bearer token for a token-auth cluster (Ray 2.60 local clusters turn token auth on by themselves).

    Order: `token`, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, the token of a `pipelines.jobs up` cluster at this
    address, ~/.ray/auth_token (loopback addresses only). No token: no header (clusters without auth).
    """
    token = token or os.environ.get("RAY_AUTH_TOKEN")
    if not token and os.environ.get("RAY_AUTH_TOKEN_PATH"):
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).expanduser().read_text().strip()
    if not token:
        from pipelines.jobs.local_cluster import token_for

        token = token_for(address)
    default = Path.home() / ".ray" / "auth_token"
    if not token and is_loopback(address) and default.exists():
        token = default.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def load_runtime_env(path: str | None, same_host: bool) -> dict[str, Any]:
    """The runtime env file (a mapping); same_host: without working_dir/excludes (runs in the checkout)."""
    env: dict[str, Any] = {}
    if path:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a runtime env must be a mapping, got {type(data).__name__}")
        env = data
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    env["env_vars"] = env_vars
    if same_host:
        env.pop("working_dir", None)
        env.pop("excludes", None)
    return env


def entrypoint(args: Sequence[str], same_host: bool, cwd: str | None = None) -> str:
    """The job's shell command: `run-stage` of this package (same_host: in this checkout, this Python)."""
    tail = " ".join(shlex.quote(a) for a in ["-m", "pipelines.jobs", *args])
    if same_host:
        return f"cd {shlex.quote(cwd or os.getcwd())} && {shlex.quote(sys.executable)} {tail}"
    return f"python {tail}"


class Cluster:
    """A Ray cluster's job API: submit, wait (optionally streaming the logs), logs."""

    def __init__(self, address: str, token: str | None = None):
        from ray.job_submission import JobSubmissionClient

        self.address = normalise_address(address)
        self.headers = auth_headers(self.address, token)
        self.client = JobSubmissionClient(self.address, headers=dict(self.headers))

    def submit(self, entry: str, runtime_env: dict[str, Any], submission_id: str | None = None,
               metadata: dict[str, str] | None = None, entrypoint_num_cpus: float | None = None,
               agent_wait_s: float = 120.0) -> str:
        """Submit; retried while the head's job agent is not up (a fresh head answers before its agent)."""
        deadline = time.monotonic() + agent_wait_s
        while True:
            try:
                return self.client.submit_job(entrypoint=entry, runtime_env=runtime_env,
                                              submission_id=submission_id, metadata=metadata,
                                              entrypoint_num_cpus=entrypoint_num_cpus)
            except RuntimeError as err:
                if "No available agent" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def wait(self, job_id: str, follow: bool = False, timeout_s: float | None = None,
             poll_s: float = 0.5, out: Any = None) -> str:
        """Block until the job ends; returns its status (TimeoutError past `timeout_s`)."""
        if follow:
            asyncio.run(self._follow(job_id, out or sys.stdout))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = str(self.client.get_job_status(job_id).value)
            if status in TERMINAL:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status} after {timeout_s} s")
            time.sleep(poll_s)

    async def _follow(self, job_id: str, out: Any) -> None:
        async for lines in self.client.tail_job_logs(job_id):
            out.write(lines)
            out.flush()

    def logs(self, job_id: str) -> str:
        return self.client.get_job_logs(job_id)

    def info(self, job_id: str) -> Any:
        return self.client.get_job_info(job_id)

    def stop(self, job_id: str) -> bool:
        return self.client.stop_job(job_id)
