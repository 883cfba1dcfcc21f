"""The stage planner and runner of `python -m pipelines.jobs`, with real child processes (toy stage modules)
and no Ray: completed stages are skipped, a changed config reruns its stage and the ones after it, a failed
stage leaves no marker, and a stage whose module is missing fails with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines.jobs import cli, markers
from pipelines.jobs.runner import Invocation, plan
from pipelines.jobs.stages import (
    STAGES,
    Stage,
    StageUnavailable,
    check_available,
    load_table,
    load_yaml,
    select,
    stage_keys,
)


def runs(out: Path) -> list[str]:
    log = out / "runs.log"
    return log.read_text().split() if log.exists() else []


def pipeline(toy: dict[str, Path], *extra: str) -> int:
    return cli.main(["pipeline", "--config", str(toy["config"]), "--stage-table", str(toy["table"]), *extra])


def actions(toy: dict[str, Path], config: Path | None = None) -> dict[str, str]:
    table = load_table(toy["table"])
    inv = Invocation(str(config or toy["config"]), table=table)
    return {i.stage: i.action for i in plan(inv, select(None, table))}


def test_pipeline_skips_complete_stages_and_reruns_on_config_change(toy):
    assert actions(toy) == {"prep": "run", "train": "run", "index": "run"}
    assert pipeline(toy) == 0
    assert runs(toy["out"]) == ["prep", "train", "index"]
    marker = json.loads((toy["out"] / "_stages" / "train.done.json").read_text())
    assert marker["stage"] == "train" and len(marker["key"]) == 16 and marker["duration_s"] >= 0

    assert actions(toy) == {"prep": "skip", "train": "skip", "index": "skip"}
    assert pipeline(toy) == 0
    assert runs(toy["out"]) == ["prep", "train", "index"]  # nothing ran again

    cfg = yaml.safe_load(toy["config"].read_text())
    toy["config"].write_text(yaml.safe_dump({**cfg, "lr": 0.2}))
    assert actions(toy) == {"prep": "run", "train": "run", "index": "run"}
    assert pipeline(toy) == 0
    assert runs(toy["out"]) == ["prep", "train", "index"] * 2
    assert json.loads((toy["out"] / "train.json").read_text())["config"]["lr"] == 0.2


def test_an_upstream_rerun_makes_the_later_stages_stale(toy):
    assert pipeline(toy) == 0
    (toy["out"] / "_stages" / "prep.done.json").unlink()  # e.g. its outputs were deleted with it
    table = load_table(toy["table"])
    items = {i.stage: i for i in plan(Invocation(str(toy["config"]), table=table), select(None, table))}
    assert items["prep"].reason == "no completion marker"
    assert items["train"].action == "run" and items["train"].reason == "prep is not complete"
    assert items["index"].action == "run" and items["index"].reason == "train runs first"
    assert cli.main(["submit", "--stage", "prep", "--config", str(toy["config"]),
                     "--stage-table", str(toy["table"])]) == 0
    items = {i.stage: i for i in plan(Invocation(str(toy["config"]), table=table), select(None, table))}
    assert (items["prep"].action, items["train"].reason) == ("skip", "prep ran again since")
    assert pipeline(toy) == 0
    assert runs(toy["out"]) == ["prep", "train", "index", "prep", "train", "index"]
    assert actions(toy) == {"prep": "skip", "train": "skip", "index": "skip"}


def test_stage_config_change_reruns_that_stage_and_later_ones(toy, tmp_path):
    assert pipeline(toy) == 0
    own = tmp_path / "train.yaml"
    own.write_text(yaml.safe_dump({"output_dir": str(toy["out"]), "lr": 0.5}))
    assert pipeline(toy, "--stage-config", f"train={own}") == 0
    assert runs(toy["out"]) == ["prep", "train", "index", "train", "index"]
    assert json.loads((toy["out"] / "train.json").read_text())["config"]["lr"] == 0.5
    assert json.loads((toy["out"] / "index.json").read_text())["config"]["lr"] == 0.1


def test_failed_stage_leaves_no_marker_and_the_rerun_resumes_there(toy, capsys):
    cfg = yaml.safe_load(toy["config"].read_text())
    failing = toy["config"].with_name("failing.yaml")
    failing.write_text(yaml.safe_dump({**cfg, "fail": "train"}))
    state = str(toy["out"] / "_stages")
    assert pipeline(toy, "--config", str(failing)) == 3
    assert "stopped at train (exit code 3)" in capsys.readouterr().err
    assert runs(toy["out"]) == ["prep", "train"]
    assert markers.read_marker(state, "prep") is not None
    assert markers.read_marker(state, "train") is None and markers.read_marker(state, "index") is None

    # the same config again after the cause is fixed (here the toy fails on purpose, so it fails again),
    # resumes at train: prep is complete and skipped
    assert pipeline(toy, "--config", str(failing)) == 3
    assert runs(toy["out"]) == ["prep", "train", "train"]
    # --set changes the config, so its hash: every stage reruns, on the materialised copy
    assert pipeline(toy, "--config", str(failing), "--set", "fail=none") == 0
    assert runs(toy["out"]) == ["prep", "train", "train", "prep", "train", "index"]
    copies = list((toy["out"] / "_stages" / "configs").glob("failing-*.yaml"))
    assert len(copies) == 1 and yaml.safe_load(copies[0].read_text())["fail"] == "none"


def test_a_crashed_rerun_does_not_leave_the_old_marker(toy):
    assert pipeline(toy) == 0
    cfg = yaml.safe_load(toy["config"].read_text())
    toy["config"].write_text(yaml.safe_dump({**cfg, "fail": "prep"}))
    assert pipeline(toy) == 3
    toy["config"].write_text(yaml.safe_dump(cfg))  # back to the config of the old marker
    assert actions(toy)["prep"] == "run"  # the crashed run cleared it: its outputs are not the old ones


def test_single_stage_submit_and_force(toy):
    assert cli.main(["submit", "--stage", "train", "--config", str(toy["config"]),
                     "--stage-table", str(toy["table"])]) == 0
    assert runs(toy["out"]) == ["train"]
    assert cli.main(["submit", "--stage", "train", "--config", str(toy["config"]),
                     "--stage-table", str(toy["table"])]) == 0
    assert runs(toy["out"]) == ["train"]
    assert cli.main(["submit", "--stage", "train", "--config", str(toy["config"]),
                     "--stage-table", str(toy["table"]), "--force"]) == 0
    assert runs(toy["out"]) == ["train", "train"]
    assert pipeline(toy) == 0  # prep had not run: it runs, and so does everything after it
    assert runs(toy["out"]) == ["train", "train", "prep", "train", "index"]


def test_missing_entry_point_is_a_clear_error(toy, tmp_path, capsys):
    table = tmp_path / "missing.yaml"
    table.write_text(yaml.safe_dump({"stages": [
        {"name": "prep", "module": "toy_stage", "args": ["--config", "{config}", "--name", "prep"]},
        {"name": "encode", "module": "pipelines.no_such_module"}]}))
    rc = cli.main(["pipeline", "--config", str(toy["config"]), "--stage-table", str(table)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "stage 'encode' runs `python -m pipelines.no_such_module`" in err and "not in this checkout" in err
    assert runs(toy["out"]) == []  # checked before anything runs
    with pytest.raises(StageUnavailable, match="package without __main__"):
        check_available(Stage("x", "madr"))  # a package without __main__.py
    check_available(Stage("data", "pipelines.data"))


def test_stage_table_and_config_errors_name_the_file(tmp_path, toy, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"stages": [{"name": "a", "module": "m", "argz": []}]}))
    with pytest.raises(ValueError, match=r"bad.yaml: stages\[0\]: unknown field\(s\) argz"):
        load_table(bad)
    with pytest.raises(ValueError, match="unknown stage"):
        select(["prep", "nope"], load_table(toy["table"]))
    assert cli.main(["plan", "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml does not exist" in capsys.readouterr().err


def test_builtin_table_maps_every_stage_of_the_issue():
    assert list(STAGES) == ["data", "pretrain", "finetune", "distill", "aspects", "encode", "tune", "baseline",
                            "mine", "evaluate", "deploy"]
    assert STAGES["pretrain"].argv("c.yaml") == ["--config", "c.yaml", "--stage", "pretrain"]
    assert [s.name for s in select(None)] == ["data", "pretrain", "finetune", "aspects", "encode", "tune", "baseline",
                                              "evaluate", "deploy"]
    assert STAGES["encode"].argv("c.yaml") == ["encode", "--config", "c.yaml"]
    for stage in STAGES.values():  # every entry point of the built-in table exists in this checkout
        check_available(stage)
    # one stage alone has the key it has inside the pipeline (keys chain over the whole table)
    inv = Invocation("configs/demo.yaml")
    assert inv.keys([STAGES["encode"]]) == {"encode": inv.keys(select(None))["encode"]}


def test_a_stage_key_changes_only_with_the_sections_it_reads():
    """A new `serve:` section redeploys without retraining; an index change re-encodes; a training change
    reruns from the training stage on (keys chain)."""
    base = load_yaml("configs/demo.yaml")
    keys = stage_keys(list(STAGES.values()), {n: base for n in STAGES})

    def changed(section: str, value: object) -> list[str]:
        cfg = {**base, section: value}
        new = stage_keys(list(STAGES.values()), {n: cfg for n in STAGES})
        return [n for n in STAGES if new[n] != keys[n]]

    assert changed("serve", {"port": 8123}) == ["deploy"]
    assert changed("evaluate", {"k": 20}) == ["evaluate", "deploy"]
    assert changed("index", {**base.get("index", {}), "nlist": 7}) == ["encode", "tune", "baseline", "mine", "evaluate",
                                                                       "deploy"]
    assert changed("tune", {"lambda_step": 0.05}) == ["tune", "baseline", "mine", "evaluate", "deploy"]
    assert changed("train", {**base["train"], "seed": 123}) == list(STAGES)[1:]
    after_training = ["aspects", "encode", "tune", "baseline", "mine", "evaluate", "deploy"]
    assert changed("train", {**base["train"], "aspects": {"epochs": 5}}) == after_training  # no retraining
    assert changed("data", {**base["data"], "seed": 99}) == list(STAGES)


def test_a_sigterm_to_the_runner_stops_the_running_stage(toy):
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = yaml.safe_load(toy["config"].read_text())
    toy["config"].write_text(yaml.safe_dump({**cfg, "sleep_in": "train"}))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy["mods"]), str(root)])}
    runner = subprocess.Popen([sys.executable, "-m", "pipelines.jobs", "pipeline", "--config", str(toy["config"]),
                               "--stage-table", str(toy["table"])], cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    pid_file = toy["out"] / "train.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), runner.communicate()[0]
    stage = int(pid_file.read_text())
    runner.send_signal(signal.SIGTERM)
    out = runner.communicate(timeout=30)[0]
    assert runner.returncode != 0 and "train: failed" in out, out
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(stage, 0)  # the stage stopped with the runner
    assert runs(toy["out"]) == ["prep", "train"], "the stages after it did not start"
    assert not (toy["out"] / "_stages" / "train.done.json").exists()


def test_stage_table_ignores_must_be_a_list(tmp_path):
    table = tmp_path / "t.yaml"
    table.write_text(yaml.safe_dump({"stages": [{"name": "a", "module": "m", "ignores": "serve"}]}))
    with pytest.raises(ValueError, match=r"t.yaml: stages\[0\]: `ignores` must be a list"):
        load_table(table)
    table.write_text(yaml.safe_dump({"stages": [{"name": "a", "module": "m", "ignores": ["serve"]}]}))
    assert load_table(table)["a"].ignores == ("serve",)
    table.write_text(yaml.safe_dump({"stages": [{"name": "a", "module": "m", "reads": ["serve"]}]}))
    with pytest.raises(ValueError, match=r"`reads` must be a list of SECTION.KEY"):
        load_table(table)


def test_a_stage_keeps_the_keys_it_reads_of_a_section_it_ignores():
    from pipelines.jobs.stages import Stage, stage_keys

    table = {"a": Stage("a", "m", ignores=("serve",), reads=("serve.encoder_precision",))}

    def key(serve: dict) -> str:
        return stage_keys(list(table.values()), {"a": {"seed": 0, "serve": serve}}, table)["a"]

    base = key({"encoder_precision": "fp32", "log_level": "INFO"})
    assert key({"encoder_precision": "fp32", "log_level": "DEBUG"}) == base, "an ignored key changes nothing"
    assert key({"encoder_precision": "int8", "log_level": "INFO"}) != base, "a read key changes the stage's key"


@pytest.mark.parametrize("key,value,named", [
    ("serve.route_timeot_s", "3", "serve.route_timeot_s"),
    ("encode.num_shrds", "3", "encode.num_shrds"),
    ("evaluate.kk", "5", "evaluate.kk"),
    ("distributed.num_wrkers", "2", "distributed.num_wrkers"),
    ("serve.colocated.num_replicas", "two", "serve.colocated.num_replicas"),
    ("encode.device", "gpu", "encode.device"),
    ("train.finetune.freeze_layer", "2", "train.finetune.freeze_layer"),
    ("tune.normalisations", "[softmax]", "tune.normalisations"),
    ("model.backbone.name_or_path", "runs/nowhere/e5", "model.backbone.name_or_path"),
    ("data.catalog_dir", "runs/nowhere/catalog", "data.catalog_dir"),
    ("data.clicks", "{path: runs/nowhere/events.parquet, format: ubi}", "data.clicks.path"),
    ("data.clicks", "{path: events.parquet, format: clickstream}", "data.clicks.format"),
    ("data.clicks", "{path: events.parquet, format: impressions, estimator: harvst}", "data.clicks.estimator"),
])
def test_plan_refuses_what_a_stage_would_refuse_naming_the_file_and_key(tmp_path, capsys, key, value, named):
    """A typo in any section (typed or derived job settings) or a backbone that cannot load fails at `plan` and
    before `pipeline` runs its first stage, not after training."""
    base = ["--config", "configs/product_search.yaml", "--set", f"output_dir={tmp_path}", "--set", f"{key}={value}"]
    assert cli.main(["plan", *base]) == 2
    err = capsys.readouterr().err
    assert named in err and "configs/product_search.yaml" in err, err
    assert cli.main(["pipeline", *base]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "_stages" / "data.done.json").exists(), "no stage may run before the check"


def test_a_serve_typo_fails_before_training_whatever_stages_run(tmp_path, capsys):
    """The `serve:` section is checked when the experiment loads, so planning (or running) the training stages
    alone refuses it too: it does not wait for the deploy stage."""
    base = ["--config", "configs/product_search.yaml", "--set", f"output_dir={tmp_path}",
            "--set", "serve.max_ongoing_requsts=3", "--stages", "data,finetune"]
    assert cli.main(["plan", *base]) == 2
    err = capsys.readouterr().err
    assert "serve.max_ongoing_requsts" in err and "configs/product_search.yaml" in err, err


def test_a_stage_the_recipe_leaves_out_is_recorded_not_run(tmp_path, capsys):
    """`train.pretrain.steps: 0` (the product-search recipe) skips pretraining with its reason, in `plan` and
    when run, and the stages after it take the stage before it as their input; a tune stage without a BM25
    part is left out the same way."""
    from pipelines.jobs.runner import run_stage_here

    inv = Invocation("configs/product_search.yaml", overrides={"output_dir": str(tmp_path)})
    items = {i.stage: i for i in plan(inv, select(None))}
    assert items["pretrain"].action == "skip" and "train.pretrain.steps is 0" in items["pretrain"].reason
    assert items["tune"].action == "run" and items["finetune"].action == "run"
    assert run_stage_here(STAGES["pretrain"], inv) == 0
    marker = json.loads((tmp_path / "_stages" / "pretrain.done.json").read_text())
    assert marker["skipped"] == "train.pretrain.steps is 0" and marker["command"] == []
    assert "not in this recipe" in capsys.readouterr().out
    dense_only = Invocation("configs/product_search.yaml", overrides={"output_dir": str(tmp_path / "d"),
                                                                      "index.lexical": None,
                                                                      "index.lexical_tokenizer": None})
    tune = {i.stage: i for i in plan(dense_only, select(None))}["tune"]
    assert tune.action == "skip" and "index.lexical is null" in tune.reason
    assert items["baseline"].action == "run", "the recipe evaluates the untrained e5 + BM25 beside it"
    for overrides, reason in (({"eval.references": ["bm25"]}, "eval.references has no untrained"),
                              ({"train.finetune.steps": 0, "train.aspects.epochs": 0, "index.model_stage": "finetune"},
                               "no training stage runs")):
        untrained = Invocation("configs/product_search.yaml", overrides={"output_dir": str(tmp_path / "u"),
                                                                         **overrides})
        baseline = {i.stage: i for i in plan(untrained, select(None))}["baseline"]
        assert baseline.action == "skip" and reason in baseline.reason


def test_plan_refuses_a_normalisation_the_index_cannot_serve(tmp_path, capsys):
    """A SPLADE-hybrid index (no BM25 part) sums raw scores across shards: min-max is refused at plan."""
    sets = ["--set", f"output_dir={tmp_path}", "--set", "model.name=hybrid", "--set", "index.lexical=null"]
    assert cli.main(["plan", "--config", "configs/experiment.yaml", *sets, "--set", "search.normalisation=minmax"]) == 2
    assert "search.normalisation" in capsys.readouterr().err
    assert cli.main(["plan", "--config", "configs/experiment.yaml", *sets, "--set", "search.normalisation=none"]) == 0
