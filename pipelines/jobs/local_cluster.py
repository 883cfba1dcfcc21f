"""A single-machine Ray cluster for job submission and Serve: `ray start --head --block` on loopback, and
worker nodes beside it (`add_node`: a raylet of its own on 127.0.0.1, `pipelines.jobs.local_node`).

Bound to 127.0.0.1 with every port chosen free, its own --temp-dir, token auth with a fresh token of its
own (never ~/.ray/auth_token), no usage stats. `ray start --block` (`local_node` for a worker node) owns the
node's processes and takes them down on SIGTERM, so stopping it never touches other Ray instances on the machine (no `ray stop`).
State (pid, ports, token file) lives in a JSON file so `up` and `down` can be separate commands.
`python` (of `start` and `add_node`) runs the nodes from another environment's `ray` and `python` (a venv made
the way a cluster node makes it) instead of this process's.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from pipelines.runtime import PRIORITY_DEFAULTS, write_bootstrap
from serve.direct_ingress import throughput_env

DEFAULT_STATE = "runs/_cluster/local.json"


@dataclass
class LocalCluster:
    pid: int
    gcs_port: int
    dashboard_port: int
    temp_dir: str
    token_file: str
    log_file: str
    owns_temp_dir: bool = False  # `start` made temp_dir (no --temp-dir given): `stop` removes it

    @property
    def address(self) -> str:
        """The dashboard (job submission, serve deploy) address."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def token(self) -> str:
        return Path(self.token_file).read_text().strip()

    def alive(self) -> bool:
        return _alive(self.pid)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> LocalCluster:
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class LocalNode:
    """A worker node that `add_node` joined to a LocalCluster: its `ray start --block` process and Ray node id."""

    pid: int
    node_id: str
    temp_dir: str
    log_file: str
    owns_temp_dir: bool = False

    def alive(self) -> bool:
        return _alive(self.pid)


QUIET_PORTS = (20000, 32767)  # above Ray's worker ports (10002-19999), below Linux's ephemeral range (32768-60999)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing holds now, drawn from `QUIET_PORTS`: not from the ephemeral range, where
    `bind(port 0)`, outgoing connections and the gRPC servers of every Ray process on the machine take their ports,
    so a server that binds it seconds later (a Ray head, Serve's proxy) rarely finds it taken by another process
    (tests running side by side start many). Falls back to a port the OS picks."""
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randint(*QUIET_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(num_cpus: int | None = None, num_gpus: int | None = None, temp_dir: str | None = None,
          object_store_memory: int | None = None, timeout_s: float = 180.0,
          resources: dict[str, float] | None = None, python: str | None = None) -> LocalCluster:
    """Start the head and wait until its dashboard answers an authenticated request. Without `temp_dir` the
    head's session files (logs, sockets, the token) go to a new /tmp/madr-ray-* directory that `stop` removes."""
    temp, owned = head_temp_dir(temp_dir)
    token_file = temp / "auth_token"
    token_file.unlink(missing_ok=True)  # a fresh token per start (a reused --temp-dir keeps the old file)
    write_secret(token_file, secrets.token_hex(24))
    gcs, dash = free_port(), free_port()
    cmd = [_ray_bin(python), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash), "--include-dashboard", "true",
           "--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
           "--temp-dir", str(temp), "--disable-usage-stats",
           *_resource_args(num_cpus, num_gpus, resources, object_store_memory)]
    log = temp / "ray-start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=cluster_env(str(token_file), python), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    cluster = LocalCluster(proc.pid, gcs, dash, str(temp), str(token_file), str(log), owned)
    try:
        _wait_ready(cluster, proc, timeout_s)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def add_node(head: LocalCluster, num_cpus: int | None = None, num_gpus: int | None = None,
             resources: dict[str, float] | None = None, object_store_memory: int | None = None,
             python: str | None = None, timeout_s: float = 120.0) -> LocalNode:
    """Join a worker node to `head`: a raylet of its own on 127.0.0.1 (every port chosen free, a new
    /tmp/madr-ray-* temp dir that `stop` removes) with the head's token, run by `pipelines.jobs.local_node`
    (`ray start --address` cannot join a loopback-only head: see there). Returns once the head lists it alive."""
    temp, owned = head_temp_dir(None)
    before = _alive_worker_ids(head)
    cmd = [python or sys.executable, "-m", "pipelines.jobs.local_node", "--address", head.gcs_address,
           "--temp-dir", str(temp)]
    for port in ("node-manager-port", "object-manager-port", "metrics-export-port", "metrics-agent-port",
                 "dashboard-agent-listen-port", "runtime-env-agent-port"):
        cmd += ["--" + port, str(free_port())]
    cmd += _resource_args(num_cpus, num_gpus, resources, object_store_memory)
    log = temp / "ray-start.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=cluster_env(head.token_file, python), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    node = LocalNode(proc.pid, "", str(temp), str(log), owned)
    try:
        deadline = time.monotonic() + timeout_s
        while not node.node_id:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker node exited with {proc.returncode}:\n{_tail(node.log_file)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker node did not join {head.address} within {timeout_s} s:\n"
                                   f"{_tail(node.log_file)}")
            new = _alive_worker_ids(head) - before
            if new:
                node.node_id = new.pop()
            else:
                time.sleep(0.5)
    except BaseException:
        stop(node)
        raise
    return node


def nodes(cluster: LocalCluster) -> list[dict]:
    """The cluster's nodes as the head's state API lists them (node_id, is_head_node, state, resources_total...)."""
    req = urllib.request.Request(cluster.address + "/api/v0/nodes?limit=1000",
                                 headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["data"]["result"]["result"]


def _alive_worker_ids(cluster: LocalCluster) -> set[str]:
    try:
        return {n["node_id"] for n in nodes(cluster) if n["state"] == "ALIVE" and not n["is_head_node"]}
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, KeyError, ValueError):
        return set()


def _resource_args(num_cpus: int | None, num_gpus: int | None, resources: dict[str, float] | None,
                   object_store_memory: int | None) -> list[str]:
    args = []
    if num_cpus is not None:
        args += ["--num-cpus", str(num_cpus)]
    if num_gpus is not None:
        args += ["--num-gpus", str(num_gpus)]
    if resources:
        args += ["--resources", json.dumps(resources)]
    if object_store_memory is not None:
        args += ["--object-store-memory", str(object_store_memory)]
    return args


# the longest socket Ray puts under its --temp-dir, and the longest path a Unix socket may have (sun_path, less NUL)
SESSION_SOCKET = "session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
UNIX_SOCKET_PATH_MAX = 107


def head_temp_dir(temp_dir: str | None) -> tuple[Path, bool]:
    """(the head's --temp-dir, whether this start created it and so owns it)."""
    if temp_dir is None:
        return Path(tempfile.mkdtemp(prefix="madr-ray-")), True
    path = Path(temp_dir).absolute()
    longest = len(f"{path}/{SESSION_SOCKET}")
    if longest > UNIX_SOCKET_PATH_MAX:
        raise ValueError(f"--temp-dir {path} is too long for Ray: its sockets' paths would be {longest} characters "
                         f"({path}/{SESSION_SOCKET}), over the {UNIX_SOCKET_PATH_MAX} a Unix socket allows; "
                         f"name a shorter directory")
    path.mkdir(parents=True, exist_ok=True)
    return path, False


def write_secret(path: str | Path, text: str) -> None:
    """Create `path` holding `text`, readable by its owner only from the first byte (never chmod after writing:
    another user could open it in between); refuses a file that already exists (it may be someone else's)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def cluster_env(token_file: str, python: str | None = None) -> dict[str, str]:
    """Environment of a node (and so of every job on it): loopback, no usage stats, token auth, Serve's
    throughput mode, workers at niceness 0 unless set (`pipelines.runtime.PRIORITY_DEFAULTS`); `python`'s bin
    directory first on PATH (the jobs' `python`), this process's by default."""
    env = dict(os.environ)
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN_PATH=token_file)
    # On SIGTERM a Ray 2.60 node first drains for up to 30 s, waiting for its work to move to other nodes. This
    # cluster is one node: nothing can move (Serve's controller and replicas stay until killed), so `stop` waited
    # the whole 30 s every time before the same graceful teardown. Set it in the environment to drain anyway.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    for key, value in PRIORITY_DEFAULTS.items():  # workers at the priority of the rest of the machine
        env.setdefault(key, value)
    throughput_env(env, override=False)  # Serve's throughput mode (serve.direct_ingress), unless set to 0
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    if python is not None:  # another environment: nothing of this process's interpreter
        env.pop("PYTHONPATH", None)
        env["VIRTUAL_ENV"] = str(Path(python).parent.parent)
    env["PATH"] = str(Path(python or sys.executable).parent) + os.pathsep + env.get("PATH", "")  # jobs' `python`
    write_bootstrap()
    return env


def stop(cluster: LocalCluster | LocalNode, timeout_s: float = 60.0) -> None:
    """SIGTERM `ray start --block` (it stops its own processes), then SIGKILL its process group if needed; then
    remove the node's temp dir when `start` / `add_node` created it (a --temp-dir given by the caller is kept).
    Stop worker nodes before their head."""
    try:
        _terminate(cluster, timeout_s)
    finally:
        if cluster.owns_temp_dir and not cluster.alive():
            shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def _terminate(cluster: LocalCluster | LocalNode, timeout_s: float) -> None:
    try:
        os.kill(cluster.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cluster.alive():
        _reap(cluster.pid)
        time.sleep(0.2)
    try:
        os.killpg(cluster.pid, signal.SIGKILL)  # the group it leads (start_new_session): its children only
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cluster.alive():
        _reap(cluster.pid)
        time.sleep(0.1)


def recorded(address: str, state: str | Path = DEFAULT_STATE) -> LocalCluster | None:
    """The `up` cluster recorded in `state` when `address` is its dashboard and it is running."""
    p = Path(state)
    if not p.exists():
        return None
    try:
        cluster = LocalCluster.load(p)
    except (ValueError, TypeError, OSError):
        return None
    address = address.rstrip("/")
    if "://" not in address:
        address = "http://" + address
    if address not in (cluster.address, cluster.address.replace("127.0.0.1", "localhost")):
        return None
    return cluster if cluster.alive() else None


def started_here(address: str, state: str | Path = DEFAULT_STATE) -> bool:
    return recorded(address, state) is not None


def token_for(address: str, state: str | Path = DEFAULT_STATE) -> str | None:
    """The token of the `up` cluster recorded in `state`, when `address` is its dashboard."""
    cluster = recorded(address, state)
    if cluster is None:
        return None
    try:
        return cluster.token
    except OSError:
        return None


def _wait_ready(cluster: LocalCluster, proc: subprocess.Popen, timeout_s: float) -> None:
    headers = {"Authorization": f"Bearer {cluster.token}"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{_tail(cluster.log_file)}")
        try:
            req = urllib.request.Request(cluster.address + "/api/version", headers=headers)
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the dashboard at {cluster.address} did not answer within {timeout_s} s:\n"
                       f"{_tail(cluster.log_file)}")


def _ray_bin(python: str | None = None) -> str:
    here = Path(python or sys.executable).parent / "ray"
    if python is not None or here.exists():
        return str(here)
    return shutil.which("ray") or "ray"


def _tail(path: str, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text().splitlines()[-n:])
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
