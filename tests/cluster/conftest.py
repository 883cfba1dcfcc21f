"""Fixtures of the cluster tests: toy stage modules (real child processes) and a stage table file for them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

TOY_STAGE = '''
"""A toy pipeline stage: reads --config, appends a line per run to <output_dir>/runs.log, writes output."""
import argparse, json, os, sys
from pathlib import Path

import yaml

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--name", required=True)
p.add_argument("--ray", action="store_true", help="run one Ray task (joins the cluster of RAY_ADDRESS)")
a = p.parse_args()
cfg = yaml.safe_load(Path(a.config).read_text())
out = Path(cfg["output_dir"])
out.mkdir(parents=True, exist_ok=True)
with open(out / "runs.log", "a") as f:
    f.write(a.name + "\\n")
if str(cfg.get("sleep_in", "")) == a.name:  # a long stage: its pid for the test, then it waits
    (out / f"{a.name}.pid").write_text(str(os.getpid()))
    import time

    time.sleep(120)
if str(cfg.get("fail", "")) == a.name:
    print(f"{a.name}: failing as configured", file=sys.stderr)
    sys.exit(3)
record = {"config": cfg, "ray_address": os.environ.get("RAY_ADDRESS")}
if a.ray:
    import ray

    ray.init()
    record["task_node"] = ray.get(ray.remote(lambda: ray.get_runtime_context().get_node_id()).remote())
    record["cluster_cpus"] = ray.cluster_resources().get("CPU")
(out / f"{a.name}.json").write_text(json.dumps(record))
print(f"{a.name}: ok")
'''


@pytest.fixture()
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A module `toy_stage` on PYTHONPATH, a three-stage table using it, and an experiment config."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "toy_stage.py").write_text(textwrap.dedent(TOY_STAGE))
    monkeypatch.setenv("PYTHONPATH", str(mods))  # the stages (child processes)
    monkeypatch.syspath_prepend(str(mods))  # the availability check in this process
    table = tmp_path / "stages.yaml"
    table.write_text(yaml.safe_dump({"stages": [
        {"name": n, "module": "toy_stage", "args": ["--config", "{config}", "--name", n]}
        for n in ("prep", "train", "index")]}))
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "lr": 0.1}))
    return {"table": table, "config": config, "out": tmp_path / "out", "mods": mods}

