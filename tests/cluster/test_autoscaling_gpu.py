"""Resources follow the config on an autoscaling cluster: a stage that asks for GPUs makes the autoscaler add a GPU
node, its workers run there, and the node goes once idle.

The cluster is Ray's fake autoscaling cluster (`ray.cluster_utils.AutoscalingCluster`): the autoscaler's monitor with
the `fake_multinode` node provider, which starts every node it adds as a raylet on this machine with its node type's
logical resources. A head of 1 CPU and no GPU, and a `gpu_worker` type {CPU: 1, GPU: 1} at min_workers 0, removed
after 3 s idle. The GPU is logical: nothing here calls CUDA. The encode stage's actors are started with the job's own
decision (`encode_on_gpu`, `device: auto` with `gpu_nodes: true`: no GPU is up when it decides) and its own resource
request (`encode_actor_resources`), but run a probe in place of the encoder (a CUDA model load); the training stage is
a one-worker Ray Train `TorchTrainer` fit over the product's `scaling_config` (`use_gpu`), whose loop takes an SGD
step on CPU tensors over gloo (the product's trainer picks nccl for GPU workers, which needs CUDA).

`LoopbackAutoscalingCluster` keeps `AutoscalingCluster`'s cluster config and environment and changes three things:
the wheel lacks the `fake_multi_node/example.yaml` its config starts from (the same keys are written here); its
`start` and `shutdown` run `ray stop --force`, which ends every Ray of the machine (other work shares it); and its
head listens on port 6379. Here the head is a `ray.cluster_utils.Cluster` head on a free port whose processes the
fixture ends itself, with its files under a temp dir of its own (`RAY_TMPDIR`). Isolation from the session's Ray as
in tests/multinode/conftest.py: it is shut down for the module and started again afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import AutoscalingCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HEAD = {"CPU": 1}
GPU_TYPE = "gpu_worker"
NODE_TYPES = {GPU_TYPE: {"resources": {"CPU": 1, "GPU": 1, "object_store_memory": 150 * 1024 ** 2},
                         "node_config": {}, "min_workers": 0, "max_workers": 1}}
IDLE_MINUTES = 0.05  # a GPU node with nothing on it goes after 3 s
WAIT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackAutoscalingCluster(AutoscalingCluster):
    """`AutoscalingCluster` with a head on a free loopback port that ends only its own processes (module
    docstring)."""

    def __init__(self, head_resources: dict, worker_node_types: dict, temp: Path, **config: Any) -> None:
        self.port, self.temp, self.cluster = _free_port(), temp, None
        super().__init__(head_resources, worker_node_types, **config)

    def _generate_config(self, head_resources: dict, worker_node_types: dict, autoscaler_v2: bool = False,
                         **config_kwargs: Any) -> dict:
        """The fake_multi_node example config (ray/autoscaler/_private/fake_multi_node/example.yaml) with these
        node types, the provider pointed at this head's GCS."""
        config = {"cluster_name": "fake_multinode", "max_workers": 8, "head_node_type": "ray.head.default",
                  "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                               "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{self.port}"},
                  "available_node_types": {**worker_node_types, "ray.head.default": {
                      "resources": head_resources, "node_config": {}, "max_workers": 0}},
                  "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": 0.1, "docker": {},
                  "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
                  "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
                  "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
                  "rsync_exclude": [], "rsync_filter": []}
        config.update(config_kwargs)
        return config

    def start(self, _system_config: dict | None = None, override_env: dict | None = None) -> None:
        """The head (and its autoscaler's monitor, which inherits this environment) as `AutoscalingCluster.start`
        configures it, without `ray stop --force`."""
        from ray.cluster_utils import Cluster

        path = self.temp / "autoscaling.json"
        path.write_text(json.dumps(self._config))
        env = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", **(override_env or {})}
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": self._head_resources.get("CPU", 0), "num_gpus": self._head_resources.get("GPU", 0),
                "node_ip_address": "127.0.0.1", "gcs_server_port": self.port, "include_dashboard": False,
                "autoscaling_config": str(path), "_system_config": _system_config})

    @property
    def address(self) -> str:
        return self.cluster.address

    def shutdown(self) -> None:
        """End the head's processes, then any process of the nodes the autoscaler started still holding a file of
        this cluster's temp dir."""
        if self.cluster is not None:
            self.cluster.shutdown()
        for pid in _processes_under(self.temp):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _processes_under(root: Path) -> list[int]:
    """Living processes (not this one) with a file open under `root`."""
    from pipelines.reaper import alive

    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(t.startswith(str(root)) for t in targets) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def autoscaling(ray_local_args) -> Iterator[LoopbackAutoscalingCluster]:
    """The fake autoscaling cluster, the driver connected to it (module docstring)."""
    import ray

    had_session_ray = ray.is_initialized()
    if had_session_ray:
        ray.shutdown()
    temp = Path(tempfile.mkdtemp(prefix="madr-as-"))  # short: raylet socket paths must stay under 107 bytes
    cluster = LoopbackAutoscalingCluster(dict(HEAD), NODE_TYPES, temp, idle_timeout_minutes=IDLE_MINUTES)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", str(temp))
        env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
        try:
            cluster.start()
            ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    if had_session_ray:
        ray.init(**ray_local_args)


def _gpu_nodes() -> dict[str, dict[str, float]]:
    """{node id: resources} of the live nodes with a GPU."""
    import ray

    return {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")}


def _node_ids() -> set[str]:
    """Every node the cluster has had, alive or gone."""
    import ray

    return {n["NodeID"] for n in ray.nodes()}


def _wait(what: str, done: Callable[[], bool], timeout: float = WAIT_S) -> float:
    """Seconds until `done()`; a TimeoutError naming `what` after `timeout`."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not after {timeout:g} s")
        time.sleep(0.25)
    return time.monotonic() - start


class Probe:
    """Stands in for an encode actor: says where it runs and which GPUs Ray gave it."""

    def where(self) -> tuple[str, list]:
        import ray

        return ray.get_runtime_context().get_node_id(), list(ray.get_gpu_ids())


def test_encode_actors_add_a_gpu_node_and_it_goes_when_idle(autoscaling):
    """With no GPU up, `device: auto` + `gpu_nodes: true` decides on GPUs; an actor with the encode actors' request
    (1 GPU, 0 CPU) makes the autoscaler add a GPU node and runs there; once it is gone the node goes."""
    import ray

    from madr.encode_config import EncodeConfig
    from pipelines.encode.executors import encode_actor_resources, encode_on_gpu

    _wait("no GPU node at the start", lambda: not _gpu_nodes())
    assert ray.cluster_resources().get("GPU", 0) == 0
    cfg = EncodeConfig(device="auto", gpu_nodes=True, encode_actors=1)
    gpu = encode_on_gpu(cfg)
    assert gpu, "device auto asks for a GPU where the autoscaler adds GPU nodes, though none is up"
    assert not encode_on_gpu(EncodeConfig(device="auto", gpu_nodes=False))
    before, start = _node_ids(), time.monotonic()
    actor = ray.remote(Probe).options(**encode_actor_resources(cfg, gpu)).remote()
    node, gpus = ray.get(actor.where.remote(), timeout=WAIT_S)
    added = time.monotonic() - start
    nodes = _gpu_nodes()
    assert node not in before, "the actor runs on a node added for it"
    assert node in nodes and nodes[node]["GPU"] == 1 and gpus == [0], (node, nodes, gpus)
    ray.kill(actor)
    gone = _wait("the idle GPU node removed", lambda: not _gpu_nodes())
    print(f"\nencode actor: GPU node added and actor placed in {added:.1f} s, removed {gone:.1f} s after the actor")


def _train_loop(config: dict) -> None:
    """One SGD step of a linear layer on CPU tensors; reports (with a checkpoint: Ray Train keeps the metrics
    reported with one) where the worker ran, the resources Ray gave it and its GPUs."""
    import tempfile

    import ray
    import torch
    from ray import train

    layer = torch.nn.Linear(4, 1)
    loss = layer(torch.ones(8, 4)).pow(2).mean()
    loss.backward()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    context = ray.get_runtime_context()
    with tempfile.TemporaryDirectory() as ckpt:
        torch.save(layer.state_dict(), Path(ckpt) / "layer.pt")
        train.report({"node": context.get_node_id(), "resources": context.get_assigned_resources(),
                      "gpus": list(ray.get_gpu_ids()), "loss": float(loss)},
                     checkpoint=train.Checkpoint.from_directory(ckpt))


def test_training_workers_add_a_gpu_node_and_it_goes_when_idle(autoscaling, tmp_path):
    """A `use_gpu` Ray Train fit over the product's `scaling_config` makes the autoscaler add a GPU node for its
    worker, which runs there with a GPU; after the fit the node goes."""
    from ray.train import RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from pipelines.train.trainer import TrainerSettings, scaling_config, worker_resources

    _wait("no GPU node at the start", lambda: not _gpu_nodes())
    settings = TrainerSettings(num_workers=1, use_gpu=True, cpus_per_worker=1, run_name="gpu-demand",
                               storage_path=str(tmp_path))
    assert worker_resources(settings) == {"CPU": 1, "GPU": 1}
    before, start = _node_ids(), time.monotonic()
    trainer = TorchTrainer(_train_loop, scaling_config=scaling_config(settings),
                           torch_config=TorchConfig(backend="gloo"),
                           run_config=RunConfig(name=settings.run_name, storage_path=settings.storage_path))
    result = trainer.fit()
    fit = time.monotonic() - start
    assert result.error is None, result.error
    metrics = result.metrics
    assert metrics["node"] not in before, "the worker ran on a node added for it"
    assert metrics["resources"].get("GPU") == 1 and metrics["gpus"] == [0], metrics
    gone = _wait("the idle GPU node removed", lambda: not _gpu_nodes())
    print(f"\ntraining: fit with a GPU node added in {fit:.1f} s, node removed {gone:.1f} s after the fit")
