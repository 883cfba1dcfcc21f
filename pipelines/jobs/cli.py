"""`python -m pipelines.jobs`: run the pipeline's stages here or submit them to a Ray cluster.

    python -m pipelines.jobs submit --stage pretrain --config configs/demo.yaml [--address http://HEAD:8265]
    python -m pipelines.jobs pipeline --config configs/demo.yaml [--address ...] [--stages data,pretrain]
    python -m pipelines.jobs plan --config configs/demo.yaml          # what pipeline would run / skip
    python -m pipelines.jobs submit --stage deploy --config configs/demo.yaml --address ...  # serve the index
        [--serve-arg search.nprobe=16 ...]                              # (app args: serve/config.py)
    python -m pipelines.jobs up [--num-cpus 2]                          # a loopback cluster on this machine
    python -m pipelines.jobs down
    python -m pipelines.jobs pipeline --config configs/multilingual.yaml  # paper 004's multi-task recipe

The config's top-level `recipe:` picks the stage table (`pipelines.jobs.recipes`): product_search (default:
data, pretrain, finetune, encode, tune, baseline, evaluate, deploy) or multilingual (data, train, distil,
encode, evaluate; deploy when named in --stages).

Without --address each stage runs here as `python -m <module> --config ...` on its own local Ray (loopback).
With --address it is a Ray job (`ray job submit`) whose entrypoint is `run-stage`, with the runtime env of
cluster/runtime_env.yaml. Each stage writes <state-dir>/<stage>.done.json with its key (a hash of its
config and of the stages before it) and a run id when it succeeds; a stage is skipped while its marker has the
current key and its upstream stage has not run again since.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from madr.config_overrides import apply_overrides, parse_overrides
from pipelines.jobs import deploy as deploy_mod
from pipelines.jobs import local_cluster, markers, runner, submit
from pipelines.jobs.stages import STAGES, Stage, StageUnavailable, check_available, load_table, select


def _invocation(args: argparse.Namespace) -> runner.Invocation:
    """The run: the config's recipe gives the stage table unless --stage-table replaces it."""
    table = load_table(args.stage_table) if args.stage_table else None
    inv = runner.Invocation(args.config, {}, parse_overrides(args.set), args.state_dir, table)
    inv.per_stage = runner.parse_stage_configs(args.stage_config, inv.stage_table)
    return inv


def _stages(inv: runner.Invocation, names: Sequence[str] | None) -> list[Stage]:
    return select(names, inv.stage_table)


def _forwarded(args: argparse.Namespace, stage: str, force: bool) -> list[str]:
    """run-stage arguments for the job: the same config files, overrides and state dir."""
    out = ["run-stage", "--stage", stage, "--config", args.config]
    for pair in args.stage_config:
        out += ["--stage-config", pair]
    for pair in args.set:
        out += ["--set", pair]
    if args.state_dir:
        out += ["--state-dir", args.state_dir]
    if args.stage_table:
        out += ["--stage-table", args.stage_table]
    if force:
        out.append("--force")
    return out


def _same_host(args: argparse.Namespace) -> bool:
    """Run jobs in this checkout rather than an uploaded copy: --same-host, or the cluster `up` started here.

    A loopback address alone does not mean this machine: `ray dashboard cluster/aws.yaml` tunnels a remote
    head to 127.0.0.1:8265.
    """
    if not args.address or args.upload:
        return False
    return args.same_host or local_cluster.started_here(args.address)


def _state_visible(args: argparse.Namespace, state_dir: str) -> bool:
    if not args.address or markers.is_uri(state_dir):
        return True
    return submit.is_loopback(args.address) and (_same_host(args) or Path(state_dir).is_absolute())


def _submit_stage(args: argparse.Namespace, cluster: submit.Cluster, stage: Stage, key: str,
                  force: bool) -> int:
    same_host = _same_host(args)
    entry = submit.entrypoint(_forwarded(args, stage.name, force), same_host)
    env = submit.load_runtime_env(args.runtime_env, same_host)
    job_id = cluster.submit(entry, env, submission_id=f"madr-{stage.name}-{key[:8]}-{int(time.time())}",
                            metadata={"madr_stage": stage.name, "madr_key": key})
    print(f"[madr.jobs] {stage.name}: submitted {job_id} to {cluster.address}\n    {entry}", flush=True)
    if args.no_wait:
        return 0
    try:
        status = cluster.wait(job_id, follow=not args.no_follow, timeout_s=args.timeout)
    except KeyboardInterrupt:
        print(f"\n[madr.jobs] {job_id} keeps running on the cluster; stop it with `ray job stop {job_id} "
              f"--address {cluster.address}`", file=sys.stderr)
        return 130
    print(f"[madr.jobs] {stage.name}: {job_id} {status}", flush=True)
    if status != "SUCCEEDED" and args.no_follow:
        print(cluster.logs(job_id)[-5000:], flush=True)
    return 0 if status == "SUCCEEDED" else 1


def _serve_args(args: argparse.Namespace) -> dict:
    """The app args: those of the run (`--config`, its recipe's index manifest), then every --serve-arg."""
    derived: dict = {}
    if getattr(args, "config", None):
        try:
            derived = _invocation(args).serve_args()
        except ValueError as err:  # not an experiment config (e.g. a custom stage table's): no derived args
            print(f"[madr.jobs] deploy: {args.config} is not an experiment config ({err}); "
                  f"using the Serve config's args", flush=True)
    return apply_overrides(derived, parse_overrides(args.serve_arg))


def _deploy(args: argparse.Namespace) -> int:
    if args.address:
        same = _same_host(args)
        cfg = deploy_mod.load_serve_config(args.serve_config, _serve_args(args), absolute_paths=same,
                                           port=args.serve_port)
        address = submit.normalise_address(args.address)
        statuses = deploy_mod.deploy_to_cluster(address, submit.auth_headers(address, _token(args)), cfg,
                                                timeout_s=args.timeout or 600.0)
        print(f"[madr.jobs] deploy: {statuses} on {address}", flush=True)
        return 0
    cfg = deploy_mod.load_serve_config(args.serve_config, _serve_args(args), port=args.serve_port)
    if not os.environ.get("RAY_ADDRESS"):  # `serve run` starts a Ray of this machine's size
        deploy_mod.check_placement_here(cfg)
    return deploy_mod.serve_run_here(cfg, blocking=not os.environ.get("RAY_ADDRESS"))


def _token(args: argparse.Namespace) -> str | None:
    return Path(args.token_file).read_text().strip() if args.token_file else None


def _run(args: argparse.Namespace, names: Sequence[str] | None) -> int:
    """Run the stages `names` (None: the table's non-optional ones) in order (here or as jobs), skipping complete
    ones; stop at the first failure."""
    if not args.config:
        raise ValueError("--config is required")
    inv = _invocation(args)
    assert inv.state_dir is not None
    stages = _stages(inv, names)
    missing = []
    for s in stages:
        try:
            check_available(s)
        except StageUnavailable as err:
            missing.append(str(err))
    if missing:
        print("error: " + "\n       ".join(missing), file=sys.stderr)
        return 2
    runner.check(inv, stages, here=not args.address)  # what a stage would reject fails before the first runs
    cluster = submit.Cluster(args.address, _token(args)) if args.address else None
    visible = _state_visible(args, inv.state_dir)
    if cluster is not None and not _same_host(args) and not markers.is_uri(inv.state_dir) \
            and not Path(inv.state_dir).is_absolute():
        print(f"[madr.jobs] warning: {inv.state_dir} is relative: on the cluster it lands in each job's "
              f"copy of the working_dir; put output_dir on shared storage "
              f"(--set output_dir=s3://... or /mnt/...)",
              file=sys.stderr)
    print(f"[madr.jobs] recipe {inv.recipe.name}; state dir {inv.state_dir}; "
          f"stages {', '.join(s.name for s in stages)}", flush=True)
    for stage in stages:
        if stage.kind == "deploy":
            rc = _deploy(args)
        elif cluster is None:
            rc = runner.run_stage_here(stage, inv, force=args.force)
        else:
            key = inv.keys([stage])[stage.name]
            complete, why = runner.status(stage, inv, key) if visible else (False, "")
            if complete and not args.force:
                print(f"[madr.jobs] {stage.name}: skip, {why}", flush=True)
                continue
            if visible and inv.not_applicable(stage, inv.parsed()[stage.name], inv.configs.path(stage.name)):
                rc = runner.run_stage_here(stage, inv, force=args.force)  # only a marker to write: no job for it
            else:
                rc = _submit_stage(args, cluster, stage, key, args.force)
        if rc != 0:
            print(f"[madr.jobs] stopped at {stage.name} (exit code {rc})", file=sys.stderr)
            return rc
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    table = _invocation(args).stage_table if args.config else load_table(args.stage_table)
    if args.stage in table and table[args.stage].kind == "deploy":
        return _deploy(args)
    return _run(args, [args.stage])


def cmd_pipeline(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.stages.split(",") if n.strip()] if args.stages else None
    return _run(args, names)


def cmd_plan(args: argparse.Namespace) -> int:
    if not args.config:
        raise ValueError("--config is required")
    inv = _invocation(args)
    assert inv.state_dir is not None
    names = [n.strip() for n in args.stages.split(",") if n.strip()] if args.stages else None
    stages = _stages(inv, names)
    runner.check(inv, stages, here=not getattr(args, "address", None))  # plan refuses what pipeline would
    print(f"recipe: {inv.recipe.name}")
    print(f"state dir: {inv.state_dir}")
    for item in runner.plan(inv, stages, visible=_state_visible(args, inv.state_dir)):
        stage = inv.stage_table.get(item.stage)
        print(f"{item.stage:<9} {item.action:<7} key {item.key}  {item.reason}"
                + ("" if stage is None or stage.kind != "module" else f"  [python -m {stage.module}]"))
    for stage in inv.stage_table.values():
        if stage.optional and stage not in stages:
            print(f"{stage.name:<9} {'-':<7} optional, not in this run (name it in --stages): {stage.help}")
    return 0


def cmd_run_stage(args: argparse.Namespace) -> int:
    """The entrypoint of a submitted job (also usable by hand): one stage, here."""
    inv = _invocation(args)
    table = inv.stage_table
    if args.stage not in table or table[args.stage].kind != "module":
        raise ValueError(f"run-stage: {args.stage!r} is not a module stage of the table "
                         f"({', '.join(n for n, s in table.items() if s.kind == 'module')})")
    return runner.run_stage_here(table[args.stage], inv, force=args.force)


def cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state_file)
    if state.exists():
        old = local_cluster.LocalCluster.load(state)
        if old.alive():
            print(f"already running: {old.address} (pid {old.pid}); `python -m pipelines.jobs down` first")
            return 1
    cluster = local_cluster.start(args.num_cpus, args.num_gpus, args.temp_dir, args.object_store_memory)
    cluster.save(state)
    print(f"Ray head on 127.0.0.1 (pid {cluster.pid}); dashboard and job API: {cluster.address}\n"
          f"  python -m pipelines.jobs pipeline --config configs/demo.yaml --address {cluster.address}\n"
          f"  RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={cluster.token_file} \\\n"
          f"    ray job list --address {cluster.address}\n"
          f"  stop it: python -m pipelines.jobs down")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state = Path(args.state_file)
    if not state.exists():
        print(f"no cluster recorded in {state}")
        return 0
    cluster = local_cluster.LocalCluster.load(state)
    local_cluster.stop(cluster)
    state.unlink()
    print(f"stopped the Ray head (pid {cluster.pid})")
    return 0


def _common(p: argparse.ArgumentParser, with_cluster: bool = True) -> None:
    p.add_argument("--config", required=not with_cluster, help="experiment YAML passed to every stage")
    p.add_argument("--stage-config", action="append", default=[], metavar="STAGE=PATH",
                   help="a different config file for one stage (e.g. encode=configs/encode.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of --config (dotted key); the stages read a materialised copy")
    p.add_argument("--state-dir", default=None,
                   help="where completion markers go (default: <output_dir>/_stages, local path or URI)")
    p.add_argument("--force", action="store_true", help="run even when complete")
    p.add_argument("--stage-table", default=None,
                   help="YAML stage table replacing the built-in one (stages: [{name, module, args}])")
    if not with_cluster:
        return
    p.add_argument("--address", default=None,
                   help="Ray dashboard address (http://HEAD:8265); none: run here on a local Ray")
    p.add_argument("--runtime-env", default=submit.DEFAULT_RUNTIME_ENV, help="runtime env YAML of the jobs")
    p.add_argument("--same-host", action="store_true",
                   help="the cluster runs on this machine: jobs run in this checkout (default: `up` cluster)")
    p.add_argument("--upload", action="store_true",
                   help="ship the working_dir even to the `up` cluster (default elsewhere)")
    p.add_argument("--token-file", default=None,
                   help="the cluster's auth token (default: RAY_AUTH_TOKEN[_PATH])")
    p.add_argument("--no-follow", action="store_true", help="do not stream job logs")
    p.add_argument("--no-wait", action="store_true", help="submit and return (single stages)")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait per job")
    p.add_argument("--serve-config", default=deploy_mod.DEFAULT_SERVE_CONFIG,
                   help="deploy: Serve config YAML")
    p.add_argument("--serve-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="deploy: set an application arg (e.g. manifest_path=runs/demo/index/manifest.json)")
    p.add_argument("--serve-port", type=int, default=None, help="deploy: HTTP port (default: the Serve config's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="run or submit one stage")
    p.add_argument("--stage", required=True, help=f"one of {', '.join(STAGES)} (or of the config's recipe, or of "
                                                  f"--stage-table)")
    _common(p)
    p.set_defaults(fn=cmd_submit)
    p = sub.add_parser("pipeline", help="all stages in order, skipping complete ones")
    p.add_argument("--stages", default=None, help="comma-separated subset (default: all but optional ones)")
    _common(p)
    p.set_defaults(fn=cmd_pipeline)
    p = sub.add_parser("plan", help="show what pipeline would run and skip")
    p.add_argument("--stages", default=None)
    _common(p)
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("run-stage", help="run one stage here (the entrypoint of submitted jobs)")
    p.add_argument("--stage", required=True)
    _common(p, with_cluster=False)
    p.set_defaults(fn=cmd_run_stage)
    p = sub.add_parser("up", help="start a loopback Ray cluster on this machine (token auth, own temp dir)")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--num-gpus", type=int, default=None)
    p.add_argument("--object-store-memory", type=int, default=None, help="bytes")
    p.add_argument("--temp-dir", default=None)
    p.add_argument("--state-file", default=local_cluster.DEFAULT_STATE)
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("down", help="stop the cluster that `up` started")
    p.add_argument("--state-file", default=local_cluster.DEFAULT_STATE)
    p.set_defaults(fn=cmd_down)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, StageUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
