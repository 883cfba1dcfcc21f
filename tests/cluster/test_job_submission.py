"""Real job submission (`ray job submit`'s REST API) to a real `ray start --head` cluster started here:
loopback only, 1 CPU, its own --temp-dir and its own auth token (token auth on, as Ray 2.60 local clusters
do), stopped at the end without touching other Ray instances.

The pipeline command submits each stage as a Ray job whose entrypoint is `run-stage`: a project entry point
(`python -m pipelines.data sources`) and a stage that runs a Ray task in the cluster;
both must SUCCEED with their logs readable, their markers written, and a second run must skip both without
submitting anything. One job ships this checkout as working_dir (cluster/runtime_env.yaml, excludes
honoured)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from pipelines.jobs import cli, local_cluster, submit

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def head():
    cluster = local_cluster.start(num_cpus=1, object_store_memory=150 * 2**20)  # its own short --temp-dir
    try:
        yield cluster
    finally:
        local_cluster.stop(cluster, timeout_s=5)  # then SIGKILL to its own process group
        assert not cluster.alive()


def test_wrong_token_is_refused(head):
    with pytest.raises(Exception, match="(?i)auth|forbidden|401|403"):
        submit.Cluster(head.address, token="not-the-token").client.list_jobs()


def test_pipeline_submits_stages_as_jobs_then_skips_them(head, toy, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    table = tmp_path / "table.yaml"
    table.write_text(yaml.safe_dump({"stages": [
        {"name": "sources", "module": "pipelines.data", "args": ["sources"]},
        {"name": "check", "module": "toy_stage",
         "args": ["--config", "{config}", "--name", "check", "--ray"]}]}))
    env = tmp_path / "runtime_env.yaml"
    env.write_text(yaml.safe_dump({"env_vars": {"PYTHONPATH": str(toy["mods"]),
                                                "RAY_USAGE_STATS_ENABLED": "0"}}))
    argv = ["pipeline", "--config", str(toy["config"]), "--stage-table", str(table),
            "--address", head.address, "--runtime-env", str(env), "--token-file", head.token_file,
            "--same-host", "--no-follow", "--timeout", "240"]
    cluster = submit.Cluster(head.address, token=head.token)
    assert cluster.client.list_jobs() == []

    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    jobs = {j.metadata["madr_stage"]: j for j in cluster.client.list_jobs()}
    assert set(jobs) == {"sources", "check"} and all(j.status == "SUCCEEDED" for j in jobs.values()), out
    assert jobs["sources"].entrypoint.startswith(f"cd {ROOT} && ")  # same host: in this checkout
    assert " run-stage --stage sources " in jobs["sources"].entrypoint
    log = cluster.logs(jobs["sources"].submission_id)
    assert "-m pipelines.data sources" in log and "[madr.jobs] sources: done in" in log
    assert "snli" in log and "task=nli" in log  # the data CLI's own output, from the job's log
    seen = json.loads((toy["out"] / "check.json").read_text())
    assert seen["ray_address"] and seen["cluster_cpus"] == 1.0, "the stage joined the 1-CPU cluster"
    assert seen["task_node"]
    for stage in ("sources", "check"):
        marker = json.loads((toy["out"] / "_stages" / f"{stage}.done.json").read_text())
        assert marker["ray_job"] == jobs[stage].submission_id

    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "sources: skip" in out and "check: skip" in out
    assert len(cluster.client.list_jobs()) == 2  # nothing submitted the second time


def test_working_dir_job_gets_this_checkout_without_excluded_dirs(head, monkeypatch):
    monkeypatch.chdir(ROOT)
    cluster = submit.Cluster(head.address, token=head.token)
    env = submit.load_runtime_env(str(ROOT / "cluster" / "runtime_env.yaml"), same_host=False)
    probe = ("import json, os, pipelines.jobs as j; "
             "print('PROBE', json.dumps({'files': sorted(os.listdir('.')), 'module': j.__file__, "
             "'usage': os.environ.get('RAY_USAGE_STATS_ENABLED')}))")
    job_id = cluster.submit(submit.entrypoint(["--help"], same_host=False).replace(
        "python -m pipelines.jobs --help", "python -c " + json.dumps(probe)), env)
    assert cluster.wait(job_id, timeout_s=180) == "SUCCEEDED", cluster.logs(job_id)[-3000:]
    line = next(x for x in cluster.logs(job_id).splitlines() if x.startswith("PROBE "))
    probe_out = json.loads(line[len("PROBE "):])
    assert {"madr", "pipelines", "serve", "cluster", "pyproject.toml"} <= set(probe_out["files"])
    assert not {".venv", "runs", ".git"} & set(probe_out["files"])
    assert not probe_out["module"].startswith(str(ROOT)), "imported the uploaded copy, not this checkout"
    assert probe_out["usage"] == "0"
    assert os.path.isdir(ROOT / ".venv")  # (the exclusion above is meaningful: it exists here)


HELLO_APP = """
from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class Hello:
    def __init__(self, greeting, manifest_path):
        self.reply = {"greeting": greeting, "manifest_path": manifest_path}

    async def __call__(self, request):
        return self.reply


def build(args):
    return Hello.bind(args["greeting"], args["manifest_path"])
"""


def test_deploy_stage_serves_over_http(head, tmp_path, capsys):
    import urllib.request

    from pipelines.jobs.local_cluster import free_port

    (tmp_path / "hello_app.py").write_text(HELLO_APP)
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": "hello", "route_prefix": "/", "import_path": "hello_app:build",
                          "runtime_env": {"env_vars": {"PYTHONPATH": str(tmp_path)}},
                          "args": {"greeting": "hi", "manifest_path": "runs/demo/index/manifest.json"}}]}))
    assert cli.main(["submit", "--stage", "deploy", "--address", head.address,
                     "--token-file", head.token_file, "--same-host", "--serve-config", str(config),
                     "--serve-arg", "greeting=hello", "--timeout", "240"]) == 0
    assert "{'hello': 'RUNNING'}" in capsys.readouterr().out
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
        reply = json.loads(resp.read())
    # --serve-arg applied; a relative path made absolute for replicas that do not run in this directory
    assert reply == {"greeting": "hello", "manifest_path": str(Path.cwd() / "runs/demo/index/manifest.json")}


def test_submitted_stages_sync_an_s3_output_dir(head, toy, s3_bucket, tmp_path, capsys, monkeypatch):
    """Stages submitted as jobs with `output_dir: s3://...`: each job's runner runs its stage on the job's
    local mirror and pushes it; the markers and outputs are in the bucket, where the next run finds them."""
    from madr import storage
    from pipelines.jobs import markers
    from tests.s3_server import CREDENTIALS

    monkeypatch.chdir(ROOT)
    uri = s3_bucket + "/toy"
    toy["config"].write_text(yaml.safe_dump({"output_dir": uri, "lr": 0.1}))
    job_mirror = tmp_path / "job-staging"  # the jobs' own mirror, not the driver's
    env = tmp_path / "runtime_env.yaml"
    env.write_text(yaml.safe_dump({"env_vars": {
        "PYTHONPATH": str(toy["mods"]), "RAY_USAGE_STATS_ENABLED": "0", **CREDENTIALS,
        "AWS_ENDPOINT_URL_S3": os.environ["AWS_ENDPOINT_URL_S3"], "MADR_STAGING_DIR": str(job_mirror)}}))
    argv = ["pipeline", "--config", str(toy["config"]), "--stage-table", str(toy["table"]), "--address",
            head.address, "--runtime-env", str(env), "--token-file", head.token_file, "--same-host",
            "--no-follow", "--timeout", "240"]

    assert cli.main(argv) == 0
    for stage in ("prep", "train", "index"):
        marker = markers.read_marker(uri + "/_stages", stage)
        assert marker is not None and marker["ray_job"], stage
    record = storage.remote_checksums(uri)
    assert {"runs.log", "prep.json", "train.json", "index.json"} <= set(record), sorted(record)
    seen = json.loads((job_mirror / "s3" / uri.removeprefix("s3://") / "index.json").read_text())
    assert seen["config"]["output_dir"] == str((job_mirror / "s3" / uri.removeprefix("s3://")).resolve())
    assert not list(ROOT.glob("s3:*"))

    capsys.readouterr()
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "prep: skip" in out and "index: skip" in out


def test_a_worker_node_joins_on_loopback_and_runs_tasks(head):
    """`local_cluster.add_node` (what `ray start --address` cannot do on a loopback-only head): a raylet with
    its own resources, listed alive by the head, bound to 127.0.0.1 only; a task that needs its resource runs
    on it, and `stop` takes its processes down and leaves the head running."""
    import subprocess

    node = local_cluster.add_node(head, num_cpus=1, resources={"second_node": 1}, object_store_memory=80 * 2**20)
    try:
        listed = {n["node_id"]: n for n in local_cluster.nodes(head)}
        assert listed[node.node_id]["state"] == "ALIVE" and not listed[node.node_id]["is_head_node"]
        assert listed[node.node_id]["resources_total"]["second_node"] == 1
        pids = subprocess.run(["pgrep", "-g", str(node.pid)], capture_output=True, text=True).stdout.split()
        sockets = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        bound = [line.split()[3] for line in sockets if any(f"pid={p}," in line for p in pids)]
        assert bound and all(a.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for a in bound), bound

        entry = ("python -c \"import ray; ray.init(); print('ran on', ray.get(ray.remote(resources="
                 "{'second_node': 1})(lambda: ray.get_runtime_context().get_node_id()).remote()))\"")
        cluster = submit.Cluster(head.address, head.token)
        job = cluster.submit(entry, submit.load_runtime_env(None, same_host=True))
        assert cluster.wait(job, timeout_s=120) == "SUCCEEDED", cluster.logs(job)
        assert f"ran on {node.node_id}" in cluster.logs(job)
    finally:
        local_cluster.stop(node, timeout_s=10)
    assert not node.alive() and not Path(node.temp_dir).exists() and head.alive()
