"""Which GPUs the connected Ray cluster can give a stage's workers: those up now, and the ones its autoscaler can add;
and the CPUs of a cluster of one node (`single_node_cpus`), where a stage's work may use every CPU of the machine.

An autoscaling cluster starts its GPU node types at `min_workers: 0` (cluster/*.yaml), so `ray.cluster_resources()`
shows no GPU until a task, actor or placement group asks for one. `cluster_can_have_gpus` therefore also reads the
node types the autoscaler declared, as Ray's GCS records them (`ray._private.state.state.get_cluster_config()`, the
record Ray Train and Ray Data read too). The autoscaler writes that record only where it reports its node types;
Ray 2.60's default autoscaler (the one `ray up` starts from cluster/aws.yaml, gcp.yaml) writes none, so a stage's
config can say so itself (`encode.gpu_nodes: true`).
"""

from __future__ import annotations


def gpus_now() -> float:
    """GPUs of the cluster's live nodes."""
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


def declared_gpu_nodes() -> bool | None:
    """Whether a node type of the autoscaler's has GPUs, as the GCS records the types; None when it records none
    (no autoscaler, or one that does not report its node types). Reads Ray's private GCS accessor (2.60): if Ray
    drops it, the answer is None."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - private API: absent or changed
        return None
    groups = list(config.node_group_configs) if config is not None else []
    if not groups:
        return None
    return any(g.max_count != 0 and g.resources.get("GPU", 0) > 0 for g in groups)


def cluster_can_have_gpus(gpu_nodes: bool | None = None) -> bool:
    """Whether the cluster has a GPU now or can add a GPU node: `gpu_nodes` when a config says so (True: its
    autoscaler adds GPU nodes; False: it never does), else what the GCS records of the autoscaler's node types."""
    if gpus_now() > 0:
        return True
    if gpu_nodes is not None:
        return gpu_nodes
    return bool(declared_gpu_nodes())


def single_node_cpus() -> int | None:
    """The CPUs of the connected cluster when it has one live node (a laptop, one VM, the tests), else None. There a
    stage's actors all run on this machine: a CPU stage may give its one worker every CPU as torch threads (or work
    in the driver) instead of the worker's logical CPU share, which would leave the rest of the machine idle."""
    import ray

    if sum(1 for node in ray.nodes() if node["Alive"]) != 1:
        return None
    return max(1, int(ray.cluster_resources().get("CPU", 1)))
