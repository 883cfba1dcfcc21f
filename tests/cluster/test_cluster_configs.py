"""Every YAML under cluster/ validates: the cluster-launcher configs against Ray's own autoscaler schema
(after Ray's own default filling, as `ray up` does), the KubeRay manifests against the structure of the
ray.io/v1 CRDs (field names, required fields, autoscaling, resources, GPUs), the embedded Serve config
against Serve's schema and this project's settings, and the runtime env against Ray's RuntimeEnv."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
LAUNCHER = ["aws.yaml", "gcp.yaml", "local.yaml"]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((CLUSTER / name).read_text())


def validate_launcher(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does before touching a cloud: fill Ray's provider defaults, then validate the schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


# ---------------------------------------------------------------- cluster launcher


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_config_validates_against_ray_schema(name):
    prepared = validate_launcher(load(name))
    assert prepared["head_node_type"] in prepared["available_node_types"]
    assert prepared["idle_timeout_minutes"] > 0


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_cloud_node_types_split_cpu_and_gpu_work(name):
    cfg = load(name)
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"].get("CPU") == 0, "no tasks on the head"
    workers = {n: t for n, t in types.items() if n != cfg["head_node_type"]}
    cpu = [t for t in workers.values() if not t["resources"].get("GPU")]
    gpu = [t for t in workers.values() if t["resources"].get("GPU", 0) >= 1]
    assert cpu and gpu
    for t in workers.values():
        assert 0 <= t["min_workers"] <= t["max_workers"]
    assert sum(t["min_workers"] for t in workers.values()) <= cfg["max_workers"]
    assert all(t["min_workers"] == 0 for t in gpu), "GPU nodes only while work needs them"
    for t in gpu:  # CUDA torch and the project with its gpu extra (scripts/install.sh; test_cluster_files.py)
        cmds = " ".join(t["worker_setup_commands"])
        assert "scripts/install.sh\" --torch cuda --extras gpu" in cmds, cmds
    for t in cpu:
        cmds = " ".join(t["worker_setup_commands"])
        assert "scripts/install.sh\" --torch cpu" in cmds, cmds


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_ships_and_installs_this_checkout_with_loopback_dashboard(name):
    cfg = load(name)
    assert "." in cfg["file_mounts"].values()
    assert {".venv", "runs"} <= set(cfg["rsync_exclude"])
    head = " ".join(cfg["head_start_ray_commands"])
    assert "--head" in head and "--dashboard-host=127.0.0.1" in head and "--disable-usage-stats" in head
    assert all("--disable-usage-stats" in c for c in cfg["worker_start_ray_commands"] if "ray start" in c)
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in (CLUSTER / name).read_text()  # would pin 127.0.0.1


def test_the_validator_rejects_broken_configs():
    from jsonschema import ValidationError

    cfg = load("aws.yaml")
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    with pytest.raises(ValidationError):
        validate_launcher(bad)
    bad = copy.deepcopy(cfg)
    bad["idle_timeout"] = 5  # a misspelt top-level key
    with pytest.raises(ValidationError):
        validate_launcher(bad)
    bad = copy.deepcopy(cfg)
    bad["head_node_type"] = "nope"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_launcher(bad)


def test_local_config_keeps_its_worker_ips():
    prepared = validate_launcher(load("local.yaml"))
    (node_type,) = prepared["available_node_types"].values()
    assert node_type["max_workers"] == len(load("local.yaml")["provider"]["worker_ips"]) == 2


# ---------------------------------------------------------------- KubeRay (ray.io/v1)

CLUSTER_SPEC = {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling",
                "autoscalerOptions", "headServiceAnnotations", "suspend", "managedBy",
                "gcsFaultToleranceOptions", "upgradeStrategy", "authOptions"}
HEAD_GROUP = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "rayStartParams",
                "template", "scaleStrategy", "idleTimeoutSeconds", "suspend"}
AUTOSCALER = {"resources", "image", "imagePullPolicy", "env", "envFrom", "volumeMounts", "securityContext",
              "idleTimeoutSeconds", "upscalingMode", "version"}
JOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
            "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint",
            "runtimeEnvYAML", "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus",
            "entrypointNumGpus",
            "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend", "schedule"}
SERVICE_SPEC = {"serveConfigV2", "rayClusterConfig", "upgradeStrategy", "serviceUnhealthySecondThreshold",
                "deploymentUnhealthySecondThreshold", "serveService", "excludeHeadPodFromServeSvc",
                "rayClusterDeletionDelaySeconds", "managedBy"}
CONTAINER = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports", "resources",
             "volumeMounts", "lifecycle", "securityContext", "readinessProbe", "livenessProbe", "workingDir"}
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _keys(where: str, obj: dict[str, Any], known: set[str], required: set[str] = frozenset()) -> None:
    assert isinstance(obj, dict), f"{where}: not a mapping"
    assert not set(obj) - known, f"{where}: unknown field(s) {sorted(set(obj) - known)}"
    assert not required - set(obj), f"{where}: missing {sorted(required - set(obj))}"


def _pod(where: str, template: dict[str, Any], gpu: bool) -> None:
    spec = template["spec"]
    volumes = {v["name"] for v in spec.get("volumes", [])}
    assert spec["containers"], f"{where}: no containers"
    for i, c in enumerate(spec["containers"]):
        at = f"{where}.containers[{i}]"
        _keys(at, c, CONTAINER, {"name", "image", "resources"})
        assert ":" in c["image"] and not c["image"].endswith(":latest"), f"{at}: pin the image tag"
        res = c["resources"]
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res[part]), f"{at}.resources.{part}: cpu and memory"
            for name, q in res[part].items():
                assert QUANTITY.match(str(q)), f"{at}.resources.{part}.{name}: bad quantity {q!r}"
        has_gpu = "nvidia.com/gpu" in res["limits"]
        assert has_gpu == gpu, f"{at}: GPU limit {'missing' if gpu else 'on a CPU group'}"
        if gpu:
            assert int(res["limits"]["nvidia.com/gpu"]) >= 1
            assert res["requests"].get("nvidia.com/gpu") == res["limits"]["nvidia.com/gpu"]
            assert c["image"].endswith("-gpu"), f"{at}: GPU groups run the CUDA image"
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{at}: mounts undeclared volume {m['name']}"


def validate_cluster_spec(where: str, spec: dict[str, Any]) -> None:
    """The RayClusterSpec structure (KubeRay ray-operator/apis/ray/v1/raycluster_types.go)."""
    _keys(where, spec, CLUSTER_SPEC, {"headGroupSpec", "workerGroupSpecs", "rayVersion"})
    assert spec["rayVersion"] == ray.__version__
    assert spec["enableInTreeAutoscaling"] is True
    _keys(f"{where}.autoscalerOptions", spec["autoscalerOptions"], AUTOSCALER)
    assert spec["autoscalerOptions"]["upscalingMode"] in ("Default", "Aggressive", "Conservative")
    head = spec["headGroupSpec"]
    _keys(f"{where}.headGroupSpec", head, HEAD_GROUP, {"rayStartParams", "template"})
    assert all(isinstance(v, str) for v in head["rayStartParams"].values()), "rayStartParams: strings"
    assert head["rayStartParams"]["num-cpus"] == "0"
    _pod(f"{where}.headGroupSpec.template", head["template"], gpu=False)
    ports = {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert {6379, 8265, 8000} <= ports
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(set(names)) == len(names)
    for g in spec["workerGroupSpecs"]:
        at = f"{where}.workerGroupSpecs[{g['groupName']}]"
        _keys(at, g, WORKER_GROUP, {"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"})
        assert DNS1123.match(g["groupName"])
        assert 0 <= g["minReplicas"] <= g.get("replicas", 0) <= g["maxReplicas"]
        assert all(isinstance(v, str) for v in g["rayStartParams"].values())
        _pod(f"{at}.template", g["template"], gpu=g["groupName"] == "gpu")
    assert {"cpu", "gpu"} <= set(names)
    gpu = next(g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu")
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] >= 1, "GPU pods only while work needs them"


def _manifest(name: str, kind: str) -> dict[str, Any]:
    doc = load(f"kuberay/{name}")
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == kind
    assert DNS1123.match(doc["metadata"]["name"])
    return doc


def _groups(spec: dict[str, Any]) -> dict[str, Any]:
    """What must agree across the three manifests: per group, images, resources and ray start params."""
    head = spec["headGroupSpec"]
    out = {"head": (head["rayStartParams"],
                    [(c["image"], c["resources"]) for c in head["template"]["spec"]["containers"]])}
    for g in spec["workerGroupSpecs"]:
        out[g["groupName"]] = (g["rayStartParams"], g["minReplicas"], g["maxReplicas"],
                               [(c["image"], c["resources"]) for c in g["template"]["spec"]["containers"]])
    return out


def test_raycluster_manifest():
    doc = _manifest("raycluster.yaml", "RayCluster")
    validate_cluster_spec("RayCluster.spec", doc["spec"])


def test_rayjob_runs_the_pipeline_entrypoint():
    from pipelines.jobs.cli import build_parser

    doc = _manifest("rayjob.yaml", "RayJob")
    spec = doc["spec"]
    _keys("RayJob.spec", spec, JOB_SPEC, {"entrypoint", "rayClusterSpec"})
    validate_cluster_spec("RayJob.spec.rayClusterSpec", spec["rayClusterSpec"])
    assert _groups(spec["rayClusterSpec"]) == _groups(_manifest("raycluster.yaml", "RayCluster")["spec"])
    assert spec["submissionMode"] in ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
    assert spec["shutdownAfterJobFinishes"] is True
    argv = shlex.split(spec["entrypoint"])
    assert argv[:3] == ["python", "-m", "pipelines.jobs"]
    args = build_parser().parse_args(argv[3:])  # our own CLI accepts it
    assert args.command == "pipeline" and args.address is None  # inside the cluster: stages join it
    assert (ROOT / args.config).exists()
    assert any(s.startswith("output_dir=/mnt/madr/") for s in args.set)  # outputs on the shared volume
    assert "deploy" not in args.stages.split(",")
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    ray.runtime_env.RuntimeEnv(**runtime_env)
    assert runtime_env["env_vars"]["RAY_USAGE_STATS_ENABLED"] == "0"


def test_rayservice_embeds_the_serve_config():
    from ray.serve.schema import ServeDeploySchema

    doc = _manifest("rayservice.yaml", "RayService")
    spec = doc["spec"]
    _keys("RayService.spec", spec, SERVICE_SPEC, {"serveConfigV2", "rayClusterConfig"})
    validate_cluster_spec("RayService.spec.rayClusterConfig", spec["rayClusterConfig"])
    assert _groups(spec["rayClusterConfig"]) == _groups(_manifest("raycluster.yaml", "RayCluster")["spec"])
    assert isinstance(spec["serveConfigV2"], str), "KubeRay takes serveConfigV2 as a YAML string"
    embedded = yaml.safe_load(spec["serveConfigV2"])
    ServeDeploySchema.model_validate(embedded)
    local = yaml.safe_load((ROOT / "serve" / "serve_config.yaml").read_text())
    (app,) = embedded["applications"]
    (local_app,) = local["applications"]
    assert app["import_path"] == local_app["import_path"]
    assert set(app["args"]) == set(local_app["args"])
    assert [d["name"] for d in app["deployments"]] == [d["name"] for d in local_app["deployments"]]
    assert app["args"]["manifest_path"].startswith("/mnt/madr/")
    assert embedded["http_options"]["port"] == 8000
    try:
        from serve.config import settings_from_dict
    except ImportError:  # the serve package not in this checkout
        return
    settings_from_dict(app["args"])  # the app's own settings accept the args


# ---------------------------------------------------------------- runtime env


def test_runtime_env_file():
    env = load("runtime_env.yaml")
    ray.runtime_env.RuntimeEnv(**env)  # Ray's own validation of the fields
    assert env["working_dir"] == "."
    assert {".venv/", "runs/", ".git/"} <= set(env["excludes"])
    assert env["env_vars"]["RAY_USAGE_STATS_ENABLED"] == "0"
    assert all(isinstance(v, str) for v in env["env_vars"].values())
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env["env_vars"]  # it would break multi-node clusters


# ---------------------------------------------------------------- security

TOKEN_ENV = "RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.madr/ray_auth_token"
KUBERAY = {"raycluster.yaml": ("RayCluster", ("spec",)), "rayjob.yaml": ("RayJob", ("spec", "rayClusterSpec")),
           "rayservice.yaml": ("RayService", ("spec", "rayClusterConfig"))}
KUBERAY_SERVING = ("raycluster.yaml", "rayservice.yaml")  # the clusters Serve runs on (a RayJob's is a batch job's)


def _cluster_spec(name: str) -> dict[str, Any]:
    kind, path = KUBERAY[name]
    spec = _manifest(name, kind)
    for key in path:
        spec = spec[key]
    return spec


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_starts_ray_with_token_auth_from_a_mounted_secret(name):
    """Every `ray start` runs with token auth; the token comes from outside the repository (file_mounts of
    ~/.madr/ray_auth_token, made by cluster/make_token.sh), so `ray up` fails rather than start an open cluster."""
    cfg = load(name)
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cfg[key]
              if "ray start" in c]
    assert len(starts) == 2 and all(TOKEN_ENV in c for c in starts), starts
    assert cfg["file_mounts"]["~/.madr/ray_auth_token"] == "~/.madr/ray_auth_token"
    assert "auth_token" not in " ".join(cfg["rsync_exclude"]), "the token is outside the checkout: nothing to exclude"


@pytest.mark.parametrize("name", LAUNCHER)
def test_launcher_starts_ray_in_serves_throughput_mode(name):
    """Serve's throughput mode is read when a node starts (serve/direct_ingress.py): every `ray start` sets it."""
    cfg = load(name)
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cfg[key]
              if "ray start" in c]
    assert starts and all("RAY_SERVE_THROUGHPUT_OPTIMIZED=1 " in c for c in starts), starts


@pytest.mark.parametrize("name", KUBERAY_SERVING)
def test_kuberay_ray_containers_run_in_serves_throughput_mode(name):
    for c in _containers(_cluster_spec(name)):
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1", f"{name}: {c['name']}"


def test_make_token_creates_a_private_token_once(tmp_path):
    import os
    import stat
    import subprocess

    token = tmp_path / "sub" / "ray_auth_token"
    env = {**os.environ, "MADR_RAY_TOKEN_FILE": str(token)}
    run = subprocess.run(["bash", str(CLUSTER / "make_token.sh")], env=env, capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == str(token)
    first = token.read_text().strip()
    assert len(first) == 64 and stat.S_IMODE(token.stat().st_mode) == 0o600
    subprocess.run(["bash", str(CLUSTER / "make_token.sh")], env=env, capture_output=True, check=True)
    assert token.read_text().strip() == first, "a second run keeps the cluster's token"


@pytest.mark.parametrize("name", sorted(KUBERAY))
def test_kuberay_clusters_use_generated_token_auth(name):
    spec = _cluster_spec(name)
    assert spec.get("authOptions", {}).get("mode") == "token", f"{name}: no token auth"
    for c in _containers(spec):  # the operator makes and mounts the secret: no token in the manifest
        for e in c.get("env", []):
            assert not (e["name"].startswith("RAY_AUTH") and "value" in e), f"{name}: literal {e['name']}"
    assert "networkpolicy.yaml" in (CLUSTER / "kuberay" / name).read_text(), f"{name}: header names the policy"


def test_kuberay_network_policy_keeps_the_dashboard_to_ray_pods_and_the_operator():
    doc = load("kuberay/networkpolicy.yaml")
    assert doc["apiVersion"] == "networking.k8s.io/v1" and doc["kind"] == "NetworkPolicy"
    ray_pods = {"app.kubernetes.io/created-by": "kuberay-operator"}
    spec = doc["spec"]
    assert spec["podSelector"]["matchLabels"] == ray_pods and spec["policyTypes"] == ["Ingress"]
    for rule in spec["ingress"]:
        peers = rule["from"]
        only_ray = all(p.get("podSelector", {}).get("matchLabels") == ray_pods and "namespaceSelector" not in p
                       for p in peers)
        if only_ray:
            continue
        ports = {p["port"] for p in rule.get("ports", [])}
        assert ports, f"a rule open on every port to {peers}"
        operator = all(p.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "kuberay-operator"}
                       for p in peers)
        assert ports <= ({8265, 52365} if operator else {8000}), (peers, ports)


def test_rayservice_requires_the_api_key_and_fails_closed(monkeypatch):
    from serve.config import check_exposure, settings_from_dict

    spec = _cluster_spec("rayservice.yaml")
    for c in _containers(spec):
        (key,) = [e for e in c["env"] if e["name"] == "MADR_API_KEY"]
        ref = key["valueFrom"]["secretKeyRef"]
        assert ref["optional"] is False and ref["name"] == "madr-api-key", ref
    (app,) = yaml.safe_load(_manifest("rayservice.yaml", "RayService")["spec"]["serveConfigV2"])["applications"]
    assert app["args"]["host"] == "0.0.0.0" and app["args"]["public"] is False
    settings = settings_from_dict(app["args"])
    monkeypatch.delenv("MADR_API_KEY", raising=False)
    with pytest.raises(ValueError, match="not loopback and no API key"):
        check_exposure(settings)
    monkeypatch.setenv("MADR_API_KEY", "k" * 32)
    check_exposure(settings)


def test_local_cluster_token_file_is_private_from_creation(tmp_path):
    """`python -m pipelines.jobs up` writes its token with os.open(..., 0o600): never world-readable, not even
    between the write and a chmod (under umask 0 the old write_text + chmod left a 0o666 window)."""
    import os
    import stat

    from pipelines.jobs.local_cluster import write_secret

    old = os.umask(0)
    try:
        write_secret(tmp_path / "auth_token", "s3cret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "auth_token").stat().st_mode) == 0o600
    assert (tmp_path / "auth_token").read_text() == "s3cret"
    with pytest.raises(FileExistsError):  # never writes into a file someone else made
        write_secret(tmp_path / "auth_token", "other")


def test_local_cluster_stops_without_waiting_for_a_drain(tmp_path, monkeypatch):
    """The one-node loopback cluster has nowhere to drain to: its `ray start` gets a drain timeout of 0 (Ray 2.60
    otherwise waits 30 s on SIGTERM before the same teardown), unless the environment asks for one."""
    from pipelines.jobs.local_cluster import cluster_env

    monkeypatch.delenv("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", raising=False)
    env = cluster_env(str(tmp_path / "token"))
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "token") and env["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "12")
    assert cluster_env(str(tmp_path / "token"))["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "12"


def test_local_cluster_workers_run_at_the_drivers_priority(tmp_path, monkeypatch):
    """The demo's `ray start` gets Ray's workers at niceness 0 (Ray's 15 lets any busy process starve them),
    unless the environment sets one."""
    from pipelines.jobs.local_cluster import cluster_env

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert cluster_env(str(tmp_path / "token"))["RAY_worker_niceness"] == "0"
    monkeypatch.setenv("RAY_worker_niceness", "10")
    assert cluster_env(str(tmp_path / "token"))["RAY_worker_niceness"] == "10"


def test_local_cluster_and_the_deploy_stage_start_ray_in_serves_throughput_mode(tmp_path, monkeypatch):
    """Where madr starts Ray for Serve, Serve's throughput mode is on unless the environment turns it off."""
    from pipelines.jobs.deploy import _with_throughput_mode
    from pipelines.jobs.local_cluster import cluster_env

    monkeypatch.delenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", raising=False)
    assert cluster_env(str(tmp_path / "token"))["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert _with_throughput_mode({})["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")  # a user's explicit choice stays
    assert cluster_env(str(tmp_path / "token"))["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"
    assert _with_throughput_mode({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"})["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"


@pytest.fixture()
def short_tmp():
    """A directory under /tmp short enough for Ray's sockets (tmp_path's names can be too long), removed after."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_local_cluster_removes_the_temp_dir_it_made_and_keeps_a_given_one(short_tmp, monkeypatch):
    """`start` without --temp-dir makes a /tmp/madr-ray-* directory that `stop` removes once the head is gone (every
    start used to leave one behind); a directory the caller named is the caller's, and stays."""
    import subprocess

    from pipelines.jobs.local_cluster import LocalCluster, head_temp_dir, stop

    monkeypatch.setattr("tempfile.tempdir", str(short_tmp))
    made, owned = head_temp_dir(None)
    given, given_owned = head_temp_dir(str(short_tmp / "mine"))
    assert owned and made.parent == short_tmp and made.name.startswith("madr-ray-")
    assert not given_owned and given.is_dir()
    for path, own in ((made, owned), (given, given_owned)):
        (path / "session_latest").mkdir()
        head = subprocess.Popen(["sleep", "30"], start_new_session=True)  # stands in for `ray start --block`
        cluster = LocalCluster(head.pid, 1, 2, str(path), str(path / "auth_token"), str(path / "log"), own)
        stop(cluster, timeout_s=5)
        head.wait(timeout=5)
        assert not cluster.alive() and path.exists() != own
    old = {"pid": 1, "gcs_port": 1, "dashboard_port": 2, "temp_dir": "t", "token_file": "k", "log_file": "l"}
    assert not LocalCluster(**old).owns_temp_dir  # a state file written before the field: nothing is removed


def test_a_temp_dir_too_long_for_rays_sockets_is_refused_before_ray_starts(short_tmp):
    """Ray puts Unix sockets under its --temp-dir; a socket path over 107 characters makes `ray start` fail deep in
    its logs, so `start` refuses such a directory at once, naming it."""
    from pipelines.jobs.local_cluster import SESSION_SOCKET, UNIX_SOCKET_PATH_MAX, head_temp_dir

    fits = short_tmp / ("d" * (UNIX_SOCKET_PATH_MAX - len(SESSION_SOCKET) - len(str(short_tmp)) - 2))
    assert head_temp_dir(str(fits)) == (fits, False)
    long = fits.parent / (fits.name + "x")
    with pytest.raises(ValueError, match=f"--temp-dir {long} is too long"):
        head_temp_dir(str(long))
    assert not long.exists()


def test_free_ports_come_from_outside_the_ephemeral_range_and_skip_a_held_port(monkeypatch):
    """`local_cluster.free_port`: ports of servers started seconds later (a Ray head, Serve's proxy, the test servers)
    come from `QUIET_PORTS`, where no process's `bind(port 0)` lands, and a port something holds is not given."""
    import random
    import socket

    from pipelines.jobs import local_cluster

    low, high = local_cluster.QUIET_PORTS
    ports = [local_cluster.free_port() for _ in range(50)]
    assert all(low <= p <= high for p in ports) and len(set(ports)) > 40
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))
        other = next(p for p in ports if p != ports[0])
        draws = iter([ports[0], other])  # the first draw is the held port: the next one is given
        monkeypatch.setattr(random.SystemRandom, "randint", lambda self, a, b: next(draws))
        assert local_cluster.free_port() == other
