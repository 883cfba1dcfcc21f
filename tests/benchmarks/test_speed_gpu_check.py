"""The GPU check (scripts/device/gpu_check.sh, scripts/device/gpu_check.py): its scripts parse, its overrides and
encode config load as the product's own configs, its FLOPs and throughput arithmetic by hand, and (slow) its CPU
dry run end to end: fine-tune through `python -m pipelines.jobs`, encode, Serve, one JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.device import gpu_check
from scripts.device.gpu_check import DRY, FULL

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / "device" / "gpu_check.sh", ROOT / "scripts" / "device" / "gpu_check_prepare.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_device_scripts_are_valid_bash(script):
    run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_full_check_is_the_issue_sized_gpu_run():
    assert FULL.use_gpu and FULL.docs >= 1_000_000 and 100 <= FULL.steps <= 1000
    assert FULL.model["num_hidden_layers"] == 12 and FULL.model["hidden_size"] == 384, "e5-small's shape"
    assert not DRY.use_gpu and DRY.docs < 10_000


@pytest.mark.parametrize("sizes", [FULL, DRY], ids=["full", "dry"])
def test_finetune_overrides_load_into_the_recipe(sizes, tmp_path):
    from madr.config import load_config
    from pipelines.cli import _overrides
    from pipelines.jobs.cli import build_parser
    from pipelines.train.config import distributed_config

    cmd = gpu_check.finetune_command(tmp_path / "run", tmp_path / "backbone", sizes)
    assert cmd[1:3] == ["-m", "pipelines.jobs"], "the product's own entry"
    args = build_parser().parse_args(cmd[3:])
    cfg = load_config(args.config, _overrides(args.set))
    d = distributed_config(cfg)
    assert (d.use_gpu, d.resolved_backend, d.zero_stage, d.bf16) == (sizes.use_gpu, "deepspeed", 2, True)
    assert cfg.model.backbone.name_or_path == str(tmp_path / "backbone")
    assert cfg.train.finetune.steps == sizes.steps and cfg.train.finetune.batch_size == sizes.batch_size
    assert cfg.train.finetune.freeze_layers < sizes.model["num_hidden_layers"], "the recipe's freezing fits"
    assert args.stages == "data,finetune"


@pytest.mark.parametrize("sizes", [FULL, DRY], ids=["full", "dry"])
def test_encode_config_is_a_valid_encode_job(sizes, tmp_path):
    from pipelines.encode.cli import build_parser, load

    path = gpu_check.encode_config(tmp_path / "encode.yaml", tmp_path / "corpus", tmp_path / "index",
                                   tmp_path / "model", sizes)
    cfg = load(build_parser().parse_args(["--config", str(path)]))
    assert cfg.device == ("cuda" if sizes.use_gpu else "cpu") and cfg.lexical is None
    assert cfg.dtype == ("bfloat16" if sizes.use_gpu else "float32")
    assert sizes.docs // cfg.rows_per_read >= 2 * cfg.num_shards, "every shard gets pieces"


def test_flops_per_pair_by_hand():
    model = {"hidden_size": 2, "intermediate_size": 4, "num_hidden_layers": 3}
    # per token and layer: 2 * (4*2*2 + 2*2*4) + 4 * S * h = 64 + 16 = 80 at S = 2; 1 frozen layer forward only,
    # 2 trained layers forward + backward (3 passes): 1 + 6 = 7 passes; 2 tokens
    assert gpu_check.flops_per_pair(model, {"query": 2}, frozen_layers=1) == 2 * 80 * 7
    assert gpu_check.flops_per_pair(model, {"query": 2, "doc": 2}, 1) == 2 * 2 * 80 * 7


def test_throughput_leaves_out_the_warm_up_window():
    rows = [{"step": 0}, {"step": 25, "pairs_per_s": 10.0}, {"step": 50, "pairs_per_s": 100.0},
            {"step": 75, "pairs_per_s": 120.0}, {"step": 100, "pairs_per_s": 110.0}]
    speed = gpu_check.throughput(rows)
    assert speed["pairs_per_s"] == 110.0 and speed["pairs_per_s_mean"] == pytest.approx(110.0)
    assert speed["windows_pairs_per_s"] == [10.0, 100.0, 120.0, 110.0]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.e2e
def test_dry_run_end_to_end(tmp_path):
    """The whole check at tiny sizes on the CPU, through the device script: four Ray starts, a DeepSpeed fit and a
    Serve app, minutes on 2 cores, so `make test` leaves it out (e2e): pytest -m e2e tests/benchmarks."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(SCRIPTS[0]), "--dry-run"], env=env, capture_output=True, text=True,
                         timeout=900)
    report = json.loads((out / gpu_check.JSON_NAME).read_text())
    assert sorted(p.name for p in out.iterdir()) == ["encode.log", "finetune.log", gpu_check.JSON_NAME], \
        "only small files in the results folder"
    assert run.returncode == 0 and report["ok"], json.dumps(report, indent=1)[-3000:]
    assert report["finetune"]["pairs_per_s"] > 0 and 0 < report["finetune"]["mfu"] < 1
    assert report["encode"]["docs"] == DRY.docs and report["encode"]["docs_per_s_job"] > 0
    for level in report["serve"]["levels"].values():
        assert level["n"] > 0 and level["errors"] == 0 and level["p99_ms"] >= level["p50_ms"] > 0
