"""Replicas the cluster can never place are refused before deploying, naming the deployment and the
resource (Serve itself waits for them forever: `serve.run` never returns, or an autoscaled deployment stays
UPSCALING). Capacities by hand, then the session's real 2-CPU Ray with the encoder sizing of
serve/serve_config.yaml (autoscaling to 4 x 0.5 CPU beside 2 searchers x 0.5 and the ingress 0.25)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from serve_helpers import free_port

from serve.config import DeploymentSettings, ServeSettings, deployment_options
from serve.placement import Capacity, app_deployments, check_placement, largest_scale

REPO = Path(__file__).resolve().parents[2]
TWO_CPUS = Capacity(largest_node={"CPU": 2.0}, total={"CPU": 2.0})
AUTOSCALED = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}


def settings(**kw) -> ServeSettings:
    base = {"topology": "fanout", "shard_groups": 2, "encoder": DeploymentSettings(num_cpus=0.5, autoscaling=AUTOSCALED),
            "searcher": DeploymentSettings(num_cpus=0.5), "ingress": DeploymentSettings(num_cpus=0.25)}
    return ServeSettings(**{**base, **kw})


def test_an_autoscaled_encoder_that_cannot_reach_max_replicas_is_named_with_what_fits():
    with pytest.raises(ValueError) as err:
        check_placement(app_deployments(settings(), 3), TWO_CPUS)
    msg = str(err.value)
    assert "3.25 CPU" in msg and "has 2" in msg and "cannot grow" in msg, msg
    assert "QueryEncoder 4 x 0.5, searcher-0 1 x 0.5, searcher-1 1 x 0.5, SearchIngress 1 x 0.25" in msg, msg
    assert "QueryEncoder autoscales to max_replicas 4 but at most 1 of its replicas fit" in msg, msg
    assert "encoder.autoscaling.max_replicas <= 1" in msg, msg
    # max_replicas 1 fits (0.5 + 2 x 0.5 + 0.25 = 1.75); so does 4 when an autoscaler can add 2 more CPUs
    one = DeploymentSettings(num_cpus=0.5, autoscaling={**AUTOSCALED, "max_replicas": 1})
    check_placement(app_deployments(settings(encoder=one), 3), TWO_CPUS)
    check_placement(app_deployments(settings(), 3), Capacity({"CPU": 2.0}, {"CPU": 4.0}, can_grow=True))
    # one shard, an ingress of 0 CPU: 4 x 0.5 + 0.5 = 2.5, still too much; 3 encoders would fit
    with pytest.raises(ValueError, match="at most 3 of its replicas fit"):
        check_placement(app_deployments(settings(ingress=DeploymentSettings(num_cpus=0.0)), 1), TWO_CPUS)


def test_a_replica_larger_than_any_node_and_too_many_fixed_replicas_are_refused():
    with pytest.raises(ValueError, match=r"searcher-0: one replica asks for 3 CPU but the largest node has 2: it "
                                         r"can never be placed; lower searcher.num_cpus"):
        check_placement(app_deployments(settings(searcher=DeploymentSettings(num_cpus=3)), 3),
                        Capacity({"CPU": 2.0}, {"CPU": 8.0}))
    spread = DeploymentSettings(num_cpus=0.25, num_replicas=2, max_replicas_per_node=1)
    with pytest.raises(ValueError, match=r"searcher-0: 2 replicas at most 1 per node, but the cluster has 1 node"):
        check_placement(app_deployments(settings(searcher=spread), 3), Capacity({"CPU": 8.0}, {"CPU": 8.0}))
    check_placement(app_deployments(settings(searcher=spread), 3), Capacity({"CPU": 4.0}, {"CPU": 8.0}, nodes=2))
    # the defaults (1 CPU each) ask for 3.5 CPUs: today's warning became an error
    with pytest.raises(ValueError, match=r"ask for 3.5 CPU .* lower num_replicas or num_cpus"):
        check_placement(app_deployments(ServeSettings(topology="fanout", shard_groups=2), 3), TWO_CPUS)
    colocated = ServeSettings(colocated=DeploymentSettings(num_cpus=1.0, num_replicas=3))  # the default topology
    assert list(app_deployments(colocated, 3)) == ["Colocated"]
    with pytest.raises(ValueError, match=r"ask for 3 CPU \(Colocated 3 x 1\)"):
        check_placement(app_deployments(colocated, 3), TWO_CPUS)


def test_gpu_replicas_ask_ray_for_gpus_and_need_a_cluster_that_has_them():
    """`num_gpus` of the query tower's deployment is a real request (its replicas' `ray_actor_options`), checked
    against the cluster's GPUs like CPUs; deployments that never use a GPU, and CPU-only encoders, refuse it."""
    from serve.placement import replica_resources

    gpu = DeploymentSettings(num_cpus=0.5, num_gpus=1)
    assert deployment_options(gpu)["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 1}
    assert deployment_options(DeploymentSettings())["ray_actor_options"] == {"num_cpus": 1.0}, "no GPU key unless asked"
    assert replica_resources(gpu) == {"CPU": 0.5, "GPU": 1.0}
    with pytest.raises(ValueError, match=r"QueryEncoder: one replica asks for 1 GPU but the largest node has 0: .* "
                                         r"lower encoder.num_gpus"):
        check_placement(app_deployments(settings(encoder=gpu), 3), Capacity({"CPU": 8.0}, {"CPU": 8.0}))
    gpu_type = Capacity({"CPU": 8.0, "GPU": 1.0}, {"CPU": 16.0, "GPU": 2.0}, can_grow=True, nodes=2)
    check_placement(app_deployments(settings(encoder=gpu), 3), gpu_type)
    autoscaled = DeploymentSettings(num_cpus=0.5, num_gpus=1, autoscaling=AUTOSCALED)
    with pytest.raises(ValueError, match=r"ask for 4 GPU .* at most 2 of its replicas fit: .* or lower num_gpus"):
        check_placement(app_deployments(settings(encoder=autoscaled), 3), gpu_type)
    colocated = ServeSettings(colocated=gpu)
    assert list(app_deployments(colocated, 3)) == ["Colocated"]
    check_placement(app_deployments(colocated, 3), gpu_type)
    with pytest.raises(ValueError, match="searcher.num_gpus must be 0"):
        settings(searcher=gpu)
    with pytest.raises(ValueError, match="needs encoder_backend 'torch' and encoder_precision 'fp32'"):
        settings(encoder=gpu, encoder_precision="int8")
    settings(colocated=gpu, encoder_backend="onnx")  # the fan-out topology's encoder holds the tower, not colocated


def test_the_serve_yaml_with_its_deployment_overrides_is_checked_before_a_local_serve_run(served_index):
    """serve/serve_config.yaml's `deployments:` overrides (which the app builder never sees) are what is checked:
    as shipped the app fits a 2-CPU machine at its largest scale; the sizing of the issue's probe (the encoder
    autoscaling to 4 x 0.5 CPU beside 2 searchers x 0.5 and the ingress 0.25) is refused."""
    from pipelines.jobs.deploy import check_placement_here, load_serve_config
    from serve.placement import serve_config_deployments

    cfg = load_serve_config(str(REPO / "serve" / "serve_config.yaml"), {"manifest_path": str(served_index["manifest"])})
    (app,) = cfg["applications"]
    shipped = serve_config_deployments(app)
    assert {n: (largest_scale(d), d.num_cpus) for n, d in shipped.items()} == {
        "QueryEncoder": (2, 0.25), "searcher-0": (1, 0.5), "searcher-1": (1, 0.5), "SearchIngress": (1, 0.25)}
    check_placement(shipped, TWO_CPUS)
    (encoder,) = [d for d in app["deployments"] if d["name"] == "QueryEncoder"]
    encoder["autoscaling_config"]["max_replicas"], encoder["ray_actor_options"]["num_cpus"] = 4, 0.5
    with pytest.raises(ValueError, match="at most 1 of its replicas fit"):
        check_placement(serve_config_deployments(app), TWO_CPUS)
    encoder["ray_actor_options"]["num_gpus"] = 1  # read like num_cpus: a GPU this machine does not have
    assert serve_config_deployments(app)["QueryEncoder"].num_gpus == 1
    with pytest.raises(ValueError, match="asks for 1 GPU .* lower encoder.num_gpus"):
        check_placement(serve_config_deployments(app), TWO_CPUS)
    del encoder["ray_actor_options"]["num_gpus"]
    if Capacity.of_machine().total["CPU"] < 3.25:  # the deploy stage's own check, on this machine
        with pytest.raises(ValueError, match="application 'madr' on this machine's .* QueryEncoder autoscales"):
            check_placement_here(cfg)


@pytest.mark.ray
def test_run_local_refuses_the_unplaceable_encoder_on_the_real_2_cpu_cluster(ray_local, served_index):
    from ray import serve

    from serve.app import run_local

    capacity = Capacity.of_cluster()
    assert capacity == Capacity({**capacity.largest_node, "CPU": 2.0}, {**capacity.total, "CPU": 2.0}), capacity
    assert not capacity.can_grow, "a local ray.init has no autoscaler"
    s = settings(manifest_path=str(served_index["manifest"]), port=free_port())
    name = "madr_unplaceable"
    t = time.monotonic()
    try:
        with pytest.raises(ValueError, match="QueryEncoder autoscales to max_replicas 4 but at most 1"):
            run_local(s, name=name)
    finally:
        serve.shutdown()  # nothing to stop unless the check let the app (and Serve's proxy) start
    assert time.monotonic() - t < 10, "the refusal should come before anything starts"
