"""A Ray cluster of separate raylets on this machine (`ray.cluster_utils.Cluster`: a head and two worker nodes on
127.0.0.1), for the tests that need work on different nodes and a node that dies.

Isolation from the rest of the suite: one driver can join one Ray at a time, so the module fixture shuts the
session's single-node Ray (tests/conftest.py `ray_local`) down when it is running, starts the cluster, and
after the module stops the cluster and starts the session Ray again with the same arguments: a later test
that asks for `ray_local` (a session fixture, already set up) still finds its Ray. The cluster keeps its files
and its address file under a temp dir of its own (`RAY_TMPDIR`): an argument-less `ray.init()` elsewhere on
this machine must not find and join it through /tmp/ray/ray_current_cluster.

Resources: every node has 1 logical CPU except the head, which has 2: it runs the driver's Ray Data tasks
(1 CPU each) and, after a worker node is removed, one training worker too (0.5 CPU).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HEAD_CPUS = 2
WORKER_CPUS = 1
# The head notices a killed raylet by missed health checks: every 3 s, dead after 5 misses by default (15 s)
NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 4}


@dataclass
class MultiNode:
    """The running cluster: its head and worker nodes (ray._private.node.Node), and their Ray node ids."""

    cluster: Any
    workers: list[Any] = field(default_factory=list)

    @property
    def head_id(self) -> str:
        return self.cluster.head_node.node_id

    def node_ids(self) -> set[str]:
        return {self.head_id} | {w.node_id for w in self.workers}

    def alive_ids(self) -> set[str]:
        import ray

        return {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    def worker_with(self, node_id: str) -> Any:
        return next(w for w in self.workers if w.node_id == node_id)

    def remove(self, node: Any, timeout: float = 30.0) -> None:
        """Kill a worker node's raylet and everything on it, and wait until the cluster sees it dead."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        deadline = time.monotonic() + timeout
        while node.node_id in self.alive_ids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.node_id} still alive {timeout} s after its removal")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(ray_local_args) -> Iterator[MultiNode]:
    """A head (2 CPUs) and two worker nodes (1 CPU each), the driver connected to it; see the module docstring."""
    import ray
    from ray.cluster_utils import Cluster

    had_session_ray = ray.is_initialized()
    if had_session_ray:
        ray.shutdown()
    temp = Path(tempfile.mkdtemp(prefix="madr-mn-"))  # short: raylet socket paths must stay under 107 bytes
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(temp))
        env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # inherited by the raylets and Train's controller
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": HEAD_CPUS, "include_dashboard": False,
                                                          "node_ip_address": "127.0.0.1",
                                                          "_system_config": NODE_DEATH})
        try:
            workers = [c.add_node(num_cpus=WORKER_CPUS, node_ip_address="127.0.0.1") for _ in range(2)]
            ray.init(address=c.address, log_to_driver=False, configure_logging=False)
            ray.data.DataContext.get_current().enable_progress_bars = False
            yield MultiNode(c, workers)
        finally:
            ray.shutdown()
            c.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    if had_session_ray:
        ray.init(**ray_local_args)
