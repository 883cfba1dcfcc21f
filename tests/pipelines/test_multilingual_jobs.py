"""The multilingual recipe (paper 004) through the runner of `python -m pipelines.jobs`: `recipe: multilingual`
picks its stage table (data -> train -> distil -> encode -> evaluate, deploy on request), `plan` lists it and
refuses an unknown key naming it, stage keys follow the sections each stage reads, and a run end to end (real
child processes, each on its own local Ray) writes the evaluate stage's metrics, after which a second run
skips every stage by its completion marker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from madr.config import load_config
from pipelines.jobs import cli, markers
from pipelines.jobs.local_cluster import free_port
from pipelines.jobs.runner import Invocation, plan
from pipelines.jobs.stages import select

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multilingual.yaml"
STAGES = ["data", "train", "distil", "encode", "evaluate"]


def _sets(**values: object) -> list[str]:
    return sum((["--set", f"{k}={json.dumps(v)}"] for k, v in values.items()), [])


def _actions(out: Path, **overrides: object) -> dict[str, tuple[str, str]]:
    inv = Invocation(str(CONFIG), overrides={"output_dir": str(out), **overrides})
    return {i.stage: (i.action, i.reason) for i in plan(inv, select(None, inv.stage_table))}


def test_plan_lists_the_multilingual_stages(tmp_path, capsys):
    assert cli.main(["plan", "--config", str(CONFIG), *_sets(output_dir=str(tmp_path / "run"))]) == 0
    out = capsys.readouterr().out
    assert "recipe: multilingual" in out, out
    listed = [line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["run"]]
    assert listed == STAGES, out
    assert "pipelines.multitask.stage" in out and "deploy" in out and "optional" in out, \
        f"deploy is listed as an optional stage: {out}"
    assert _actions(tmp_path / "run", **{"student.enabled": False})["distil"] == \
        ("skip", "not in this recipe: student.enabled is false"), "no student: the distil stage is left out"


@pytest.mark.parametrize("key, value, named", [
    ("bogus", 1, "bogus"), ("scaling.workers", 2, "scaling.workers"), ("student.foo", 1, "student.foo"),
    ("recipe", "nope", "recipe"), ("serve.no_such_setting", 1, "no_such_setting")])
def test_plan_refuses_an_unknown_key_naming_it(tmp_path, capsys, key, value, named):
    stages = ["--stages", "data,train,distil,encode,evaluate,deploy"]
    assert cli.main(["plan", "--config", str(CONFIG), *stages, *_sets(output_dir=str(tmp_path), **{key: value})]) == 2
    err = capsys.readouterr().err
    assert named in err and "error:" in err, f"the error must name {named!r}: {err}"


def test_product_search_configs_name_their_recipe_or_none():
    assert load_config(ROOT / "configs" / "demo.yaml").recipe == "product_search"
    with pytest.raises(ValueError, match="recipe"):
        load_config(ROOT / "configs" / "demo.yaml", {"recipe": "multilingual"})


def test_a_stage_key_changes_only_with_the_sections_it_reads(tmp_path):
    def keys(**overrides: object) -> dict[str, str]:
        inv = Invocation(str(CONFIG), overrides={"output_dir": str(tmp_path), **overrides})
        return inv.keys(select(None, inv.stage_table))

    base = keys()
    changed = {name: [s for s in STAGES if keys(**{name: value})[s] != base[s]]
               for name, value in {"student.steps": 5, "index.num_shards": 1, "eval.batch_size": 64,
                                   "serve.encoder_backend": "onnx", "serve.log_level": "INFO",
                                   "steps": 10}.items()}
    assert changed == {"student.steps": ["distil", "encode", "evaluate"], "index.num_shards": ["encode", "evaluate"],
                       "eval.batch_size": ["evaluate"], "serve.encoder_backend": ["evaluate"], "serve.log_level": [],
                       "steps": ["train", "distil", "encode", "evaluate"]}, changed


def test_sets_round_trip_through_parquet(tmp_path):
    from madr.recipes.multitask.data import build_data
    from pipelines.multitask.config import load_pipeline_config
    from pipelines.multitask.data import read_sets, write_sets

    cfg = load_pipeline_config(CONFIG, {"data.click_queries": 10, "data.click_products": 30, "data.nli_train": 40,
                                        "data.nli_eval": 20, "data.parallel_train": 40, "data.parallel_eval": 20})
    sets = build_data(cfg.recipe)
    write_sets(sets, tmp_path)
    assert read_sets(tmp_path) == sets, "a later stage reads exactly the data stage's sets"


RUN_SETS = {"steps": 40, "student.steps": 20}


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory) -> tuple[Path, str]:
    """The recipe run once end to end by the README's command (a child process, each stage on its own local
    Ray): (output_dir, what it printed)."""
    out = tmp_path_factory.mktemp("multilingual") / "run"
    cmd = [sys.executable, "-m", "pipelines.jobs", "pipeline", "--config", str(CONFIG),
           *_sets(output_dir=str(out), **RUN_SETS)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


@pytest.mark.ray
@pytest.mark.slow
def test_pipeline_runs_the_stages_then_skips_them(pipeline_run, capfd):
    out, first = pipeline_run
    args = ["pipeline", "--config", str(CONFIG), *_sets(output_dir=str(out), **RUN_SETS)]
    for stage in STAGES:
        assert f"[madr.jobs] {stage}: done" in first, f"{stage} did not run: {first[-3000:]}"

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["rows"]) == {"untrained", "multitask", "served"}, metrics["rows"].keys()
    index = metrics["index"]
    assert index["shards"] == 2 and index["documents"] > 0 and 0.0 <= index["index_xling_top1"] <= 1.0, index
    summary = json.loads((out / "pipeline.json").read_text())
    assert summary["stages"] == STAGES and sum(summary["train"]["steps_per_task"].values()) == 40, summary["train"]
    run_ids = {s: markers.read_marker(str(out / "_stages"), s)["run_id"] for s in STAGES}

    assert cli.main(args) == 0
    second = capfd.readouterr().out
    for stage in STAGES:
        assert f"[madr.jobs] {stage}: skip, complete" in second, f"{stage} was not skipped: {second[-3000:]}"
    assert {s: markers.read_marker(str(out / "_stages"), s)["run_id"] for s in STAGES} == run_ids
    later = _actions(out, steps=40, **{"student.steps": 10})
    assert {s: a for s, (a, _) in later.items()} == {"data": "skip", "train": "skip", "distil": "run",
                                                     "encode": "run", "evaluate": "run"}, later


@pytest.mark.ray
@pytest.mark.slow
def test_the_deploy_stage_serves_the_index_through_the_int8_query_tower(pipeline_run, ray_local):
    """The deploy stage's Serve app (the args `serve_args` derives, as `--stages deploy` deploys them) answers
    `/search` over HTTP with the query tower in int8, as the recipe's config asks; its cross-lingual top-1 over
    the held-out sentences stays within 0.05 of the evaluate stage's fp32 search of the same index."""
    from ray import serve

    from madr.export.quantize import Int8QueryEncoder
    from pipelines.multitask.data import SETS_DIR, read_sets
    from pipelines.multitask.encode import candidates
    from pipelines.multitask.evaluate import index_top1
    from serve.app import run_local
    from serve.backend import LocalBackend
    from serve.config import settings_from_dict

    out, _ = pipeline_run
    args = Invocation(str(CONFIG), overrides={"output_dir": str(out), **RUN_SETS}).serve_args()
    assert args["encoder_precision"] == "int8", f"the recipe serves its query tower in int8: {args}"
    settings = settings_from_dict({**args, "port": free_port()})
    assert isinstance(LocalBackend(settings.manifest_path, encoder_precision="int8").encoder, Int8QueryEncoder)

    sets = read_sets(out / SETS_DIR)
    fp32 = json.loads((out / "metrics.json").read_text())["index"]
    try:
        run_local(settings)
        top = []
        for record in sets.parallel_eval:
            r = requests.post(f"http://127.0.0.1:{settings.port}/search", json={"query": record.source, "k": 1,
                                                                             "include_docs": False}, timeout=60)
            assert r.status_code == 200, r.text
            top.append([h["id"] for h in r.json()["results"]])
    finally:
        serve.shutdown()
    served = index_top1(np.array(top), sets.parallel_eval, candidates(sets))
    assert abs(served["index_xling_top1"] - fp32["index_xling_top1"]) <= 0.05, (served, fp32)
