"""A worker node of a loopback cluster on this machine: what `ray start --address HEAD --block` does, through
Ray's Node API (as `ray.cluster_utils` starts its nodes). `local_cluster.add_node` runs it.

    python -m pipelines.jobs.local_node --address 127.0.0.1:GCS_PORT --temp-dir DIR [--num-cpus N]
        [--resources JSON] [--node-manager-port P ...]

`ray start --address` cannot join a loopback-only head: with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which keeps
every address Ray picks on 127.0.0.1) it refuses to start a worker node, and without it rewrites 127.0.0.1, in
--address and --node-ip-address alike, to the machine's outward address. Here the node binds 127.0.0.1 and
joins the head at the address given. It blocks until SIGTERM, which stops the node's processes (Ray's own
handler); when one of them dies unexpectedly it stops the others and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections.abc import Sequence

PORTS = ("node_manager_port", "object_manager_port", "metrics_export_port", "metrics_agent_port",
         "dashboard_agent_listen_port", "runtime_env_agent_port")
EXPECTED_EXIT = (0, signal.SIGTERM, -signal.SIGTERM, 128 + signal.SIGTERM)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.jobs.local_node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", required=True, help="the head's GCS address, 127.0.0.1:PORT")
    p.add_argument("--temp-dir", required=True, help="this node's session files (logs, sockets)")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    p.add_argument("--resources", default=None, help="custom resources, JSON: {\"name\": quantity}")
    p.add_argument("--object-store-memory", type=int, default=None, help="bytes")
    for port in PORTS:
        p.add_argument("--" + port.replace("_", "-"), type=int, default=0, help="0: any free port")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import ray._private.node
    from ray._private.parameter import RayParams

    params = RayParams(gcs_address=args.address, node_ip_address="127.0.0.1", temp_dir=args.temp_dir,
                       num_cpus=args.num_cpus, num_gpus=args.num_gpus,
                       resources=json.loads(args.resources) if args.resources else None,
                       object_store_memory=args.object_store_memory, min_worker_port=0, max_worker_port=0,
                       **{port: getattr(args, port) for port in PORTS})
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    print(f"node {node.node_id} joined {args.address} (pid {os.getpid()})", flush=True)
    while True:
        time.sleep(1)
        died = [(kind, proc.returncode) for kind, proc in node.dead_processes()
                if proc.returncode not in EXPECTED_EXIT]
        if died:
            print(f"Ray processes exited unexpectedly: {died}; stopping the node", flush=True)
            node.kill_all_processes(check_alive=False, allow_graceful=False)
            return 1


if __name__ == "__main__":
    raise SystemExit(main())
