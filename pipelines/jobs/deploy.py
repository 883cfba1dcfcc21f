"""The deploy stage: put the Ray Serve app of serve/serve_config.yaml on a cluster, or run it here.

With an address: `serve deploy` (the dashboard's REST API, with the cluster's token), then wait until every
application is RUNNING. The app's code must be importable on the cluster's nodes (installed by the cluster
launcher's setup commands or baked into the KubeRay image; on a same-host cluster, this checkout's venv).
Without an address: `serve run` in the foreground (Ctrl-C / SIGTERM stops it), or `--non-blocking` into
the cluster of RAY_ADDRESS when this runs inside a Ray job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipelines.jobs.stages import load_yaml
from serve.direct_ingress import throughput_env

DEFAULT_SERVE_CONFIG = "serve/serve_config.yaml"
PATH_ARG_SUFFIXES = ("_path", "_dir", "_file")


def load_serve_config(path: str, args: Mapping[str, Any] | None = None, absolute_paths: bool = False,
                      root: str | None = None, port: int | None = None) -> dict[str, Any]:
    """The Serve config with `args` set in every application's args, validated by Serve's own schema.

    absolute_paths: relative path-like args (`*_path`, `*_dir`, `*_file`) resolved against `root`, for a
    cluster on this machine whose replicas do not run in this directory. port: the HTTP port instead of
    the file's `http_options.port`. Each app's `host` arg is set to `http_options.host`, so an app served
    beyond loopback refuses to start without an API key (unless its args say `public: true`).
    """
    cfg = load_yaml(path)
    if port is not None:
        cfg["http_options"] = {**(cfg.get("http_options") or {}), "port": int(port)}
    apps = cfg.get("applications")
    if not isinstance(apps, list) or not apps:
        raise ValueError(f"{path}: no applications list")
    for i, app in enumerate(apps):
        if not isinstance(app, dict) or "import_path" not in app:
            raise ValueError(f"{path}: applications[{i}] has no import_path")
        app_args = dict(app.get("args") or {})
        for key, value in (args or {}).items():  # a mapping (e.g. `search`) key by key
            both = isinstance(value, dict) and isinstance(app_args.get(key), dict)
            app_args[key] = {**app_args[key], **value} if both else value
        if absolute_paths:
            base = Path(root or os.getcwd())
            for key, value in app_args.items():
                if (key.endswith(PATH_ARG_SUFFIXES) and isinstance(value, str) and value
                        and "://" not in value and not Path(value).is_absolute()):
                    app_args[key] = str(base / value)
        proxy_host = (cfg.get("http_options") or {}).get("host")
        if proxy_host:  # the app's fail-closed check (serve.config.check_exposure) sees where the proxy binds
            app_args["host"] = proxy_host
        app["args"] = app_args
    validate_serve_config(cfg, path)
    return cfg


def validate_serve_config(cfg: dict[str, Any], where: str = "serve config") -> None:
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(cfg)
    except Exception as err:  # pydantic.ValidationError: keep Serve's message, name the file
        raise ValueError(f"{where}: not a valid Serve config: {err}") from None


def deploy_to_cluster(address: str, headers: dict[str, str], cfg: dict[str, Any], timeout_s: float = 600.0,
                      poll_s: float = 1.0) -> dict[str, str]:
    """`serve deploy` over REST; returns {app: status} once all are RUNNING (RuntimeError on a failure)."""
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    client = ServeSubmissionClient(address, headers=dict(headers))
    client.deploy_applications(cfg)
    names = [a.get("name", "default") for a in cfg["applications"]]
    deadline = time.monotonic() + timeout_s
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        details = client.get_serve_details()
        apps = details.get("applications") or {}
        statuses = {n: str((apps.get(n) or {}).get("status", "NOT_STARTED")) for n in names}
        failed = {n: s for n, s in statuses.items() if s in ("DEPLOY_FAILED", "UNHEALTHY")}
        if failed:
            messages = {n: (apps.get(n) or {}).get("message", "") for n in failed}
            raise RuntimeError(f"serve deploy failed: {failed}: {messages}")
        if all(s == "RUNNING" for s in statuses.values()):
            return statuses
        time.sleep(poll_s)
    raise TimeoutError(f"Serve applications not RUNNING after {timeout_s} s: {statuses}")


def check_placement_here(cfg: dict[str, Any]) -> None:
    """Before a `serve run` that starts its own Ray on this machine: ValueError when that Ray could never place
    some replica of an application, with the YAML's `deployments:` overrides applied (`serve.placement`; Serve
    would wait for it forever, e.g. an autoscaled encoder on 2 CPUs stuck UPSCALING). Each application is
    checked alone."""
    from serve.placement import Capacity, check_placement, serve_config_deployments

    capacity = Capacity.of_machine()
    for app in cfg["applications"]:
        try:
            check_placement(serve_config_deployments(app), capacity)
        except ValueError as err:
            raise ValueError(f"application {app.get('name', 'default')!r} on this machine's {capacity.total['CPU']:g} "
                             f"CPUs: {err}") from None


def _with_throughput_mode(env: dict[str, str]) -> dict[str, str]:
    throughput_env(env, override=False)
    return env


def serve_run_here(cfg: dict[str, Any], blocking: bool) -> int:
    """`serve run <config>` as a child process (foreground when blocking), its Ray in Serve's throughput mode
    unless the environment turns it off (`serve.direct_ingress`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="madr-serve-", delete=False) as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    cmd = [sys.executable, "-m", "ray.serve.scripts", "run", f.name]
    if not blocking:
        cmd.append("--non-blocking")
    print(f"[madr.jobs] deploy: {' '.join(cmd)}", flush=True)
    try:
        return subprocess.call(cmd, env=_with_throughput_mode(dict(os.environ)))
    except KeyboardInterrupt:
        return 130
