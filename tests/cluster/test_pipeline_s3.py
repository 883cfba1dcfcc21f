"""The demo pipeline at the e2e test's tiny size with `output_dir: s3://<bucket>/demo` on a real S3 API server
(moto on 127.0.0.1), trained from a raw click log (`data.clicks`: impressions simulated over a generated catalog's
training queries) instead of judgments: the data stage estimates the log's examination curve and writes it with
the run; a stage killed mid-way leaves no marker and nothing pushed; the rerun, from an empty local mirror (as on
another node), takes every earlier stage's outputs from the bucket with their checksums and skips those stages;
Serve downloads the index and model from the bucket and answers a query."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from madr import storage
from madr.config import load_config
from madr.data.synthetic.catalog import generate_catalog
from pipelines.jobs import cli, markers
from pipelines.jobs.experiment import serve_args
from pipelines.jobs.local_cluster import free_port
from tests.cluster.test_pipeline_e2e import tiny_experiment
from tests.pipelines.test_click_training import click_log

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]
STAGES = "data,pretrain,finetune,encode,tune,evaluate"


def s3_experiment(out: str, catalog_dir: Path | None = None, clicks: Path | None = None) -> dict:
    """`tiny_experiment` on `out`, without the untrained reference and the aspect heads (no baseline or aspects
    stage: a shorter run); with `catalog_dir` and `clicks`, its training judgments come from the click log `clicks`
    over that catalog (dev and test keep the catalog's judgments)."""
    cfg = tiny_experiment(out)  # type: ignore[arg-type]
    if catalog_dir is not None and clicks is not None:
        cfg["data"] = {"catalog_dir": str(catalog_dir),
                       "clicks": {"path": str(clicks), "format": "impressions", "max_rank": 8}}
    cfg["eval"] = {"references": ["bm25", "dense"]}
    cfg["train"]["aspects"] = {"epochs": 0}
    cfg["index"]["model_stage"] = "finetune"
    return cfg


def kill_when_running(cmd: list[str], stage: str, after_s: float) -> str:
    """Start `cmd` in its own process group; SIGKILL the group `after_s` after it reports `stage` running."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if f"[madr.jobs] {stage}: run" in line:
            time.sleep(after_s)
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    return "".join(lines)


def test_demo_pipeline_on_s3_resumes_after_a_killed_stage_and_serves_from_the_bucket(s3_bucket, tmp_path,
                                                                                       monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    uri = s3_bucket + "/demo"
    config = tmp_path / "demo-s3.yaml"
    catalog = generate_catalog(num_products=300, num_queries=120, seed=0, languages=["en", "de"])
    catalog.write(tmp_path / "catalog")
    clicks = click_log(catalog, tmp_path / "clicks.jsonl")
    config.write_text(yaml.safe_dump(s3_experiment(uri, tmp_path / "catalog", clicks)))
    state = uri + "/_stages"

    assert cli.main(["pipeline", "--config", str(config), "--stages", "data,pretrain"]) == 0
    pushed = storage.remote_checksums(uri)
    assert {"data/clicks/examination.json", "data/clicks/examination.png"} <= set(pushed), sorted(pushed)
    log = kill_when_running([sys.executable, "-m", "pipelines.jobs", "run-stage", "--stage", "finetune",
                             "--config", str(config)], "finetune", after_s=8.0)
    assert "finetune: done" not in log, log
    assert markers.read_marker(state, "finetune") is None, "a killed stage leaves no marker"
    assert not any(rel.startswith("finetune/") for rel in storage.remote_checksums(uri)), "nor pushed outputs"

    shutil.rmtree(storage.staging_root())  # the rerun starts from the bucket alone, as on another node
    capsys.readouterr()
    started = time.time()
    assert cli.main(["pipeline", "--config", str(config), "--stages", STAGES]) == 0
    out = capsys.readouterr().out
    print(f"S3 pipeline (finetune..evaluate after the resume): {time.time() - started:.1f} s")
    print("\n".join(line for line in out.splitlines() if ": pull s3://" in line or ": push s3://" in line))
    assert "[madr.jobs] data: skip" in out and "[madr.jobs] pretrain: skip" in out
    assert "[madr.jobs] finetune: run (no completion marker)" in out
    for stage in STAGES.split(","):
        assert markers.read_marker(state, stage) is not None, stage
    record = storage.remote_checksums(uri)
    assert {"index/manifest.json", "evaluation/results.md", "tune/fusion.json"} <= set(record), sorted(record)
    assert any(rel.startswith("finetune/model/") for rel in record), sorted(record)
    summary = json.loads((storage.local_dir(uri) / "data" / "summary.json").read_text())  # pulled for finetune
    assert summary["origin"].startswith(f"click log {clicks}"), summary["origin"]
    assert len(summary["clicks"]["examination"]["propensity"]) == 8  # the run's report carries the bias estimate

    shutil.rmtree(storage.staging_root())  # Serve on a host with nothing of the run
    served = serve_from_bucket(load_config(str(config)))
    assert len(served["results"]) == 3, served
    mirror = storage.local_dir(uri)
    assert (mirror / "index" / "manifest.json").is_file() and (mirror / "finetune" / "model").is_dir()
    assert not (mirror / "evaluation").exists(), "Serve downloads the index and its model, not the whole run"


def serve_from_bucket(cfg) -> dict:
    """Deploy the experiment's Serve app (its manifest_path is the bucket's) on a local Ray started with this test's
    AWS variables (the session's Ray, if any, comes back after); one search."""
    import ray
    from ray import serve

    from serve.app import run_local, url
    from serve.client import MadrClient
    from serve.config import settings_from_dict
    from tests.conftest import LOCAL_RAY

    args = serve_args(cfg)
    assert args["manifest_path"].startswith("s3://"), args
    small = {"num_cpus": 0.2, "max_ongoing_requests": 8}
    settings = settings_from_dict({**args, "port": free_port(), "encoder": small, "searcher": small,
                                   "ingress": small})
    had_session_ray = ray.is_initialized()  # started before the bucket's AWS variables were set: its workers lack them
    if had_session_ray:
        ray.shutdown()
    ray.init(**LOCAL_RAY)
    try:
        run_local(settings)
        client = MadrClient(url(settings))
        client.wait_ready(timeout=120)
        result = client.search("red shoes", k=3)
        client.close()
        return result
    finally:
        serve.shutdown()
        ray.shutdown()
        if had_session_ray:
            ray.init(**LOCAL_RAY)
