"""The README's cluster command, run as written, on two Ray nodes that were set up the way the launcher configs
set up a node.

1. A copy of the checkout stands for ~/madr (the launcher's file mount). A fresh venv gets this project through
   cluster/local.yaml's own setup commands, read from the YAML: `python3 -m venv ~/madr-venv` and
   `scripts/install.sh --python ~/madr-venv/bin/python --torch auto --warm`, as written. `--warm` is a good
   part of the install's time: it builds DeepSpeed's CPU op, which the demo's DDP training never loads, and the
   sparse kernels, which the Serve searchers then load instead of compiling.
2. Both nodes run from that venv, with token auth, on 127.0.0.1 only. The head has no CPUs, like aws.yaml's head.
   The worker node has 2 CPUs. So every task or actor that needs a CPU (Ray Data, the Train workers, encoding,
   the Serve replicas) can only run on the worker node. The head runs the job drivers.
3. The README's `python -m pipelines.jobs pipeline --config configs/product_search.yaml --set
   output_dir=/mnt/shared/... --address ... --token-file ...` command (its "On a cluster" section) is read from
   README.md and run by the venv's `python` in the copy. Its output_dir is a directory both nodes see (standing
   for /mnt/shared); its address and token are the head's. The test appends `--set` overrides that shrink the
   recipe (the generated sample, a tiny random backbone, a few steps), and `--serve-port` because the machine is
   shared.

Asserts: every stage ran as a Ray job that SUCCEEDED with its driver on the head, and the worker node ran the
tasks and actors of the stages that use Ray's workers. The index and the evaluation exist. The Serve app that
the command deployed has its replicas on the worker node and answers /search over HTTP (as a client of the API
would: after /ready, retrying a 503 / 504 that carries Retry-After).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from madr.index import Manifest
from pipelines.jobs import local_cluster

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("data", "finetune", "aspects", "encode", "tune", "baseline", "evaluate")  # the recipe leaves pretraining out
# the stages whose work runs in Ray tasks and actors (the data stage prepares a catalog this small in its driver:
# pipelines.data.batched)
RAY_WORK = ("finetune", "encode")
SMALL = ["data.synthetic_products=300", "data.synthetic_queries=120", "model.backbone.name_or_path=null",
         "model.max_doc_length=32", "index.lexical_tokenizer=null", "train.finetune.steps=12",
         "train.finetune.batch_size=16", "train.finetune.learning_rate=1e-3", "train.finetune.freeze_layers=1",
         "train.finetune.checkpoint_every=0", "distributed.cpus_per_worker=0.5", "distributed.torch_threads=1",
         "tune.lambda_step=0.25"]
OBJECT_STORE = 400 * 2**20


def readme_cluster_command() -> list[str]:
    """The README's command that runs the whole pipeline on a launcher cluster (the `--token-file` one)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## On a cluster", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            if line.startswith("python -m pipelines.jobs pipeline") and "--token-file" in line:
                return shlex.split(line, comments=True)
    raise AssertionError("README.md: no `python -m pipelines.jobs pipeline ... --token-file` command in its "
                         "'On a cluster' section")


def with_cluster(command: list[str], shared: Path, address: str, token_file: str) -> list[str]:
    """The README's command, with this cluster's address and token and output_dir under `shared` (everything
    else as written). Fails when the command no longer has the options this replaces."""
    out, replaced = list(command), set()
    for i, arg in enumerate(out[:-1]):
        value = out[i + 1]
        if arg == "--set" and value.startswith("output_dir=/mnt/shared/"):
            out[i + 1] = "output_dir=" + str(shared / value.removeprefix("output_dir=/mnt/shared/"))
        elif arg == "--address":
            out[i + 1] = address
        elif arg == "--token-file":
            out[i + 1] = token_file
        else:
            continue
        replaced.add(arg if arg != "--set" else "output_dir")
    missing = {"output_dir", "--address", "--token-file"} - replaced
    assert not missing, f"the README's cluster command {shlex.join(command)} lacks {missing}"
    assert out[:4] == ["python", "-m", "pipelines.jobs", "pipeline"], out
    return out


def setup_commands(home: Path) -> list[str]:
    """cluster/local.yaml's setup commands that make the venv and install into it, with ~ = `home`."""
    commands = [c for c in yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())["setup_commands"]
                if "madr-venv" in c and ".bashrc" not in c]
    assert commands[0].startswith("python3 -m venv ") and "scripts/install.sh" in commands[1], commands
    return [c.replace('"$HOME/', f'"{home}/').replace("~/", f"{home}/") for c in commands]


def copy_checkout(dest: Path) -> None:
    """The checkout's files as the launcher syncs them (git's tracked files; no .venv, runs or caches)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def plain_env(venv: Path | None = None) -> dict[str, str]:
    """This environment less what belongs to the test's own interpreter and Ray; `venv` first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def api(cluster: local_cluster.LocalCluster, path: str) -> dict:
    req = urllib.request.Request(cluster.address + path, headers={"Authorization": f"Bearer {cluster.token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def state(cluster: local_cluster.LocalCluster, kind: str) -> list[dict]:
    return api(cluster, f"/api/v0/{kind}?limit=10000&detail=true")["data"]["result"]["result"]


def run_logged(cmd: list[str] | str, log: Path, timeout: float, **kwargs) -> None:
    """Run `cmd` with its output in `log`; on a failure the assertion shows the log's tail."""
    with open(log, "a") as out:
        out.write(f"$ {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            timeout=timeout, **kwargs).returncode
    assert rc == 0, f"exit code {rc}:\n" + "\n".join(log.read_text().splitlines()[-60:])


def test_the_readme_and_local_yaml_still_have_what_the_e2e_test_runs(tmp_path):
    """In `make test`: the cluster command and the setup commands are found and rewritten (the e2e test below
    runs them)."""
    command = with_cluster(readme_cluster_command(), tmp_path, "http://127.0.0.1:1", str(tmp_path / "token"))
    assert command[command.index("--address") + 1] == "http://127.0.0.1:1"
    assert any(a.startswith(f"output_dir={tmp_path}/") for a in command), command
    venv, install = setup_commands(tmp_path)
    assert venv == f"python3 -m venv {tmp_path}/madr-venv"
    assert install.startswith(f'bash "{tmp_path}/madr/scripts/install.sh" --python {tmp_path}/madr-venv/bin/python')


# e2e: `make test` leaves it out; .ci/run runs `make test-e2e` as its own required step
@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.e2e
def test_readme_cluster_command_on_two_nodes_installed_like_the_launcher(tmp_path, capsys):
    root = Path(tempfile.mkdtemp(prefix="madr-rc-"))  # its own, removed after: the venv is ~2.6 GB (logs: tmp_path)
    head = worker = None
    timings: dict[str, float] = {}
    try:
        home, shared = root / "home", root / "shared"
        checkout, venv = home / "madr", home / "madr-venv"
        checkout.mkdir(parents=True)
        shared.mkdir()
        copy_checkout(checkout)

        start = time.monotonic()
        for command in setup_commands(home):  # from the home dir, as the launcher runs them
            run_logged(command, tmp_path / "install.log", timeout=1200, shell=True, executable="/bin/bash",
                       cwd=home, env=plain_env())
        timings["install"] = time.monotonic() - start
        python = str(venv / "bin" / "python")

        start = time.monotonic()
        head = local_cluster.start(num_cpus=0, object_store_memory=OBJECT_STORE, python=python)
        worker = local_cluster.add_node(head, num_cpus=2, object_store_memory=OBJECT_STORE, python=python)
        timings["cluster"] = time.monotonic() - start

        command = with_cluster(readme_cluster_command(), shared, head.address, head.token_file)
        command += [a for pair in SMALL for a in ("--set", pair)]
        command += ["--serve-port", str(serve_port := local_cluster.free_port())]
        out_dir = Path(next(a.removeprefix("output_dir=") for a in command if a.startswith("output_dir=")))
        start = time.monotonic()
        run_logged(command, tmp_path / "pipeline.log", timeout=1500, cwd=checkout, env=plain_env(venv))
        timings["pipeline"] = time.monotonic() - start
        log = (tmp_path / "pipeline.log").read_text()

        jobs = {}
        for stage in STAGES:  # each stage a Ray job that succeeded, its driver on the head
            marker = json.loads((out_dir / "_stages" / f"{stage}.done.json").read_text())
            assert f"[madr.jobs] {stage}: {marker['ray_job']} SUCCEEDED" in log, stage
            info = api(head, f"/api/jobs/{marker['ray_job']}")
            assert info["status"] == "SUCCEEDED" and info["driver_node_id"] == head_id(head), (stage, info)
            jobs[info["job_id"]] = stage
        assert "[madr.jobs] deploy: {'madr': 'RUNNING'}" in log

        ran_on: dict[str, set[str]] = {stage: set() for stage in STAGES}
        for kind in ("tasks", "actors"):
            for item in state(head, kind):
                if item.get("job_id") in jobs and item.get("node_id"):
                    ran_on[jobs[item["job_id"]]].add(item["node_id"])
        for stage in RAY_WORK:
            assert worker.node_id in ran_on[stage], f"{stage}: no task or actor on the worker node ({ran_on})"

        manifest = Manifest.load(out_dir / "index" / "manifest.json")
        assert manifest.num_docs == 300 and len(manifest.shards) == 2
        assert Path(manifest.model_dir).resolve() == (out_dir / "aspects" / "model").resolve()  # the recipe's heads
        results = (out_dir / "evaluation" / "results.md").read_text()
        assert results.startswith("| run | index | queries | recall@10"), results

        app = api(head, "/api/serve/applications/")["applications"]["madr"]
        replicas = [r for d in app["deployments"].values() for r in d["replicas"]]
        assert replicas and {r["node_id"] for r in replicas} == {worker.node_id}, replicas
        query = pq.read_table(out_dir / "data" / "eval" / "queries.parquet").to_pylist()[0]["text"]
        start = time.monotonic()
        hits = search(f"http://127.0.0.1:{serve_port}", query, k=3)
        timings["first answer"] = time.monotonic() - start
        assert len(hits) == 3 and all(0 <= h["id"] < manifest.num_docs for h in hits), hits
    finally:
        for node in (worker, head):
            if node is not None:
                local_cluster.stop(node, timeout_s=30)
        shutil.rmtree(root, ignore_errors=True)
        with capsys.disabled():
            print(f"\n[readme cluster command] {', '.join(f'{k} {v:.0f} s' for k, v in timings.items())}")
    assert not worker.alive() and not head.alive()


def search(url: str, query: str, k: int, timeout_s: float = 90.0) -> list[dict]:
    """POST /search as the API's clients do: once GET /ready answers, and again after a 503 / 504 with
    Retry-After (a fresh searcher replica loads its shards and kernels on its first call, which can outlast the
    app's call deadline on a loaded machine)."""
    from pipelines.demo import wait_ready

    wait_ready(url, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        req = urllib.request.Request(f"{url}/search", method="POST", data=json.dumps({"query": query, "k": k}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())["results"]
        except urllib.error.HTTPError as err:
            if err.code not in (503, 504) or "Retry-After" not in err.headers or time.monotonic() > deadline:
                raise
            time.sleep(float(err.headers["Retry-After"]))


def head_id(cluster: local_cluster.LocalCluster) -> str:
    return next(n["node_id"] for n in local_cluster.nodes(cluster) if n["is_head_node"])
