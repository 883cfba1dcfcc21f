"""Run stages where this process is: a stage's module as a child process, skipped when already complete.

This is both the no-address path of `python -m pipelines.jobs` (each stage starts its own local Ray,
loopback only) and the entrypoint of every submitted job (`run-stage`, on the cluster, where RAY_ADDRESS
makes the stage join the cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from madr import storage
from madr.config import config_hash
from madr.config_overrides import apply_overrides as dotted
from pipelines.jobs import markers
from pipelines.jobs.recipes import Recipe, recipe_of
from pipelines.jobs.stages import STAGES, Stage, StageConfigs, check_available, load_yaml, stage_keys
from pipelines.runtime import write_bootstrap


def parse_stage_configs(pairs: Sequence[str], table: Mapping[str, Stage] = STAGES) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or name not in table:
            raise ValueError(f"--stage-config expects STAGE=PATH with STAGE one of {', '.join(table)}, "
                             f"got {pair!r}")
        out[name] = path
    return out


def apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `data` with the dotted-key `overrides` set (`madr.config_overrides.apply_overrides`)."""
    return dotted(yaml.safe_load(yaml.safe_dump(data)), dict(overrides))  # deep copy of plain YAML data


@dataclass
class Invocation:
    """What the user asked for: config file(s), `--set` overrides of the default config, and the state dir.

    With overrides, the default config is written out (materialised) next to the markers and the stages
    read that file, so the module entry points need no override syntax of their own. The config's `recipe:`
    (`pipelines.jobs.recipes`) gives the stage table, unless `table` replaces it (a --stage-table file).
    """

    config: str
    per_stage: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    state_dir: str | None = None
    table: Mapping[str, Stage] | None = None

    def __post_init__(self) -> None:
        base = load_yaml(self.config)
        self._default_data = apply_overrides(base, self.overrides) if self.overrides else base
        self.recipe: Recipe = recipe_of(self._default_data, self.config)
        if self.table is None:
            self.table = self.recipe.table
        if self.state_dir is None:
            self.state_dir = markers.default_state_dir(self._default_data, self.config)
        self._default_path: str | None = None if self.overrides else self.config

    def _materialise(self) -> str:
        stem = Path(self.config).stem
        name = f"{stem}-{config_hash(self._default_data)[:8]}.yaml"
        assert self.state_dir is not None
        folder = (Path(self.state_dir) / "configs" if not markers.is_uri(self.state_dir)
                  else Path(os.environ.get("TMPDIR", "/tmp")) / "madr-configs")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(f"# {self.config} with --set {self.overrides}\n"
                        + yaml.safe_dump(self._default_data, sort_keys=False))
        return str(path)

    @property
    def configs(self) -> StageConfigs:
        """The config file of each stage (the materialised copy is written on first use)."""
        if self._default_path is None:
            self._default_path = self._materialise()
        return StageConfigs(self._default_path, dict(self.per_stage))

    @property
    def stage_table(self) -> Mapping[str, Stage]:
        assert self.table is not None
        return self.table

    def parsed(self) -> dict[str, dict[str, Any]]:
        """The parsed config of every stage of the table (overrides applied)."""
        return {name: load_yaml(self.per_stage[name]) if name in self.per_stage else self._default_data
                for name in self.stage_table}

    def keys(self, stages: Sequence[Stage]) -> dict[str, str]:
        return stage_keys(stages, self.parsed(), self.stage_table)

    def builtin(self, stage: Stage) -> bool:
        """`stage` is the recipe's own (not one of a --stage-table file, whose stages check themselves)."""
        return self.recipe.table.get(stage.name) == stage

    def not_applicable(self, stage: Stage, data: Mapping[str, Any], where: str) -> str | None:
        """Why the recipe leaves the recipe stage `stage` out of the run of config `data` (None: it runs)."""
        return self.recipe.not_applicable(stage.name, data, where) if self.builtin(stage) else None

    def serve_args(self) -> dict[str, Any]:
        """The deploy stage's Serve app args derived from the default config (overrides applied)."""
        return self.recipe.serve_args(self._default_data, self.config)


def upstream_of(stage: Stage, table: Mapping[str, Stage]) -> Stage | None:
    """The stage whose outputs this one reads: the previous non-optional module stage of the table."""
    previous = None
    for s in table.values():
        if s.name == stage.name:
            return previous
        if s.kind == "module" and not s.optional:
            previous = s
    return None


def status(stage: Stage, inv: Invocation, key: str) -> tuple[bool, str]:
    """(complete, why): the marker has the current key, and the upstream stage has not run again since."""
    assert inv.state_dir is not None
    marker = markers.read_marker(inv.state_dir, stage.name)
    if marker is None:
        return False, "no completion marker"
    if marker.get("key") != key:
        return False, f"config changed (marker key {marker.get('key')}, now {key})"
    up = upstream_of(stage, inv.stage_table)
    if up is not None:
        up_marker = markers.read_marker(inv.state_dir, up.name)
        up_run = None if up_marker is None else up_marker.get("run_id")
        if up_run != marker.get("upstream_run"):
            return False, f"{up.name} ran again since" if up_marker else f"{up.name} is not complete"
    return True, f"complete ({marker.get('finished_at', '?')}, key {key})"


def run_stage_here(stage: Stage, inv: Invocation, force: bool = False, python: str | None = None,
                   extra_env: Mapping[str, str] | None = None) -> int:
    """Run one stage in a child process unless complete; write its marker when it exits 0. Returns its rc."""
    assert inv.state_dir is not None
    key = inv.keys([stage])[stage.name]
    complete, why = status(stage, inv, key)
    if complete and not force:
        print(f"[madr.jobs] {stage.name}: skip, {why}", flush=True)
        return 0
    config = inv.configs.path(stage.name)
    skipped = inv.not_applicable(stage, load_yaml(config), config)
    if skipped:  # recorded as done, so the stages after it run on the stage before it
        markers.clear_marker(inv.state_dir, stage.name)
        up = upstream_of(stage, inv.stage_table)
        up_marker = markers.read_marker(inv.state_dir, up.name) if up is not None else None
        markers.write_marker(inv.state_dir, stage.name, key, config=config, command=[], duration_s=0.0,
                             ray_job=current_job_id(), run_id=uuid.uuid4().hex, skipped=skipped,
                             upstream_run=None if up_marker is None else up_marker.get("run_id"))
        print(f"[madr.jobs] {stage.name}: not in this recipe ({skipped})", flush=True)
        return 0
    check_available(stage)
    markers.clear_marker(inv.state_dir, stage.name)  # a crash from here on must not leave an old marker
    remote = remote_output_dir(config)
    child_config = on_local_mirror(config, remote) if remote else config
    cmd = [python or sys.executable, "-m", stage.module, *stage.argv(child_config)]
    print(f"[madr.jobs] {stage.name}: run ({'forced' if complete else why}): {' '.join(cmd)}", flush=True)
    up = upstream_of(stage, inv.stage_table)
    up_marker = markers.read_marker(inv.state_dir, up.name) if up is not None else None
    started = time.time()
    if remote:
        sync(stage.name, "pull", remote)
    rc = run_stage_process(cmd, stage_env(extra_env))
    if rc != 0:
        print(f"[madr.jobs] {stage.name}: failed with exit code {rc}; no marker written", flush=True)
        return rc
    if remote:
        sync(stage.name, "push", remote)
    path = markers.write_marker(inv.state_dir, stage.name, key, config=config, command=cmd,
                                duration_s=round(time.time() - started, 3), ray_job=current_job_id(),
                                run_id=uuid.uuid4().hex,
                                upstream_run=None if up_marker is None else up_marker.get("run_id"))
    print(f"[madr.jobs] {stage.name}: done in {time.time() - started:.1f} s; marker {path}", flush=True)
    return 0


def run_stage_process(cmd: list[str], env: dict[str, str]) -> int:
    """The stage's exit code. A SIGTERM to the runner while it waits is passed on to the stage, which stops itself
    (a stage with a local Ray exits through Python, `pipelines.runtime.exit_on_sigterm`), and the runner reports
    it as failed: a stopped runner leaves no stage running on."""
    with subprocess.Popen(cmd, env=env) as proc:
        if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
            return _wait_or_kill(proc)
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
        try:
            return _wait_or_kill(proc)
        finally:
            signal.signal(signal.SIGTERM, previous)


def _wait_or_kill(proc: subprocess.Popen) -> int:
    """`proc`'s exit code; killed when the wait is interrupted (Ctrl-C in the runner), as `subprocess.call` does."""
    try:
        return proc.wait()
    except BaseException:
        proc.kill()
        raise


def remote_output_dir(config: str) -> str | None:
    """The stage config's `output_dir` when it is an object-store URI (the stage then runs on its local mirror)."""
    out = load_yaml(config).get("output_dir")
    return out if isinstance(out, str) and storage.is_uri(out) else None


def on_local_mirror(config: str, uri: str) -> str:
    """A copy of the stage config whose `output_dir` is the local mirror of `uri`, written in the mirror's
    `_stages/` (never pushed): the stage reads and writes local files; the runner syncs them with `uri`."""
    data = load_yaml(config)
    data["output_dir"] = str(storage.local_dir(uri).resolve())
    folder = storage.local_dir(uri) / "_stages" / "local-configs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{Path(config).stem}-{config_hash(data)[:8]}.yaml"
    path.write_text(f"# {config} with output_dir {uri} on its local mirror\n" + yaml.safe_dump(data, sort_keys=False))
    return str(path)


def sync(stage: str, direction: str, uri: str) -> None:
    """Pull `uri` into its local mirror before a stage, or push the mirror to it after (`madr.storage`)."""
    local = storage.local_dir(uri)
    started = time.time()
    counts = storage.pull(uri, local) if direction == "pull" else storage.push(local, uri)
    print(f"[madr.jobs] {stage}: {direction} {uri} <-> {local}: {counts} in {time.time() - started:.1f} s",
          flush=True)


def current_job_id() -> str | None:
    """The Ray job submission id when this runs as a job's entrypoint (from the job config Ray passes)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        return json.loads(raw).get("metadata", {}).get("job_submission_id")
    except (ValueError, AttributeError):
        return None


def stage_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: no usage stats anywhere; loopback-only Ray when no cluster is joined."""
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not env.get("RAY_ADDRESS"):
        env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        write_bootstrap()
    env.update(extra or {})
    return env


def plan(inv: Invocation, stages: Sequence[Stage], visible: bool = True) -> list[markers.PlanItem]:
    """What `pipeline` will do per stage: a stage runs when it is not complete, or when its upstream runs."""
    keys = inv.keys(stages)
    configs = inv.parsed()
    items: list[markers.PlanItem] = []
    running: set[str] = set()
    for stage in stages:
        key = keys[stage.name]
        up = upstream_of(stage, inv.stage_table)
        if stage.kind == "deploy":
            items.append(markers.PlanItem(stage.name, key, "run", "deploy always runs (idempotent)"))
            continue
        if not visible:
            items.append(markers.PlanItem(stage.name, key, "unknown", "state dir not visible: job decides"))
            continue
        complete, why = status(stage, inv, key)
        if complete and up is not None and up.name in running:
            complete, why = False, f"{up.name} runs first"
        if not complete:
            running.add(stage.name)
            skipped = inv.not_applicable(stage, configs[stage.name], inv.configs.path(stage.name))
            if skipped:
                items.append(markers.PlanItem(stage.name, key, "skip", f"not in this recipe: {skipped}"))
                continue
        items.append(markers.PlanItem(stage.name, key, "skip" if complete else "run", why))
    return items


def check(inv: Invocation, stages: Sequence[Stage], here: bool = True) -> None:
    """Every stage's config as the stage will load it (`pipelines.jobs.checks`); a ValueError naming the file
    and key when one would fail. `here`: the stages run on this machine (its backbone packages are checked)."""
    configs = inv.parsed()
    builtin = [s for s in stages if inv.builtin(s)]  # a table file's own stages check themselves
    paths = {s.name: inv.per_stage.get(s.name, inv.config) for s in builtin}  # the files the user named
    inv.recipe.check(configs, paths, [s.name for s in builtin
                                      if inv.not_applicable(s, configs[s.name], paths[s.name]) is None], here)
