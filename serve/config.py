"""Serving settings at run time: the settings themselves (`ServeSettings`, `DeploymentSettings`) are defined and
checked in `madr.serve_config`; this module loads them from the `args:` of `serve_config.yaml` or a YAML file
(`settings_from_dict`, `load_settings`) and does what needs Ray Serve, the network or the index: each deployment's
`Deployment.options(...)` (`deployment_options`), the API key and the fail-closed check of where the app binds
(`resolved_api_key`, `check_exposure`), and the local manifest of `manifest_path` (`require_manifest`, pulling an
index on object storage). Paths are resolved on the replica that opens them: `model_dir` defaults to the manifest's
`model_dir`, relative paths in the manifest are relative to it.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import yaml

from madr.config import from_dict
from madr.serve_config import (
    DEFAULT_API_KEY_ENV,
    ENCODER_BACKENDS,
    ENCODER_PRECISIONS,
    TOPOLOGIES,
    DeploymentSettings,
    ServeSettings,
)
from madr.storage import is_uri, pull_index

__all__ = ["DEFAULT_API_KEY_ENV", "ENCODER_BACKENDS", "ENCODER_PRECISIONS", "MAX_BACKOFF_S", "RETRY_AFTER_S", "ROUTER_CLASS",
           "TOPOLOGIES", "DeploymentSettings", "ServeSettings", "check_exposure", "deployment_options", "is_loopback",
           "load_settings", "require_manifest", "resolved_api_key", "router_config", "settings_from_dict"]

ROUTER_CLASS = "serve.routing:LiveReplicaRouter"  # routes every call to a deployment of the app
RETRY_AFTER_S = 1.0  # the Retry-After of every 503 and 504 the app answers
# The longest a router's routing task sleeps between two looks for a free replica slot. Serve's default, 0.5 s,
# with its two routing tasks per replica, let a queue behind a replica that had been full for a second drain at
# four calls a second, whatever the replica's speed: a burst's admitted calls waited out their bound.
MAX_BACKOFF_S = 0.05


def deployment_options(d: DeploymentSettings, route_timeout_s: float | None = None,
                       queue_timeout_s: float | None = None, max_wait_s: float | None = None) -> dict[str, Any]:
    """`Deployment.options(...)` keyword arguments of a deployment with settings `d`. Calls to the deployment are
    routed by `serve.routing.LiveReplicaRouter`: they wait for a busy replica (refused on arrival when they would
    wait over `queue_timeout_s`; at most `max_wait_s`, None: `queue_timeout_s`, None: as long as it takes), and fail
    after `route_timeout_s` (None: never) while no replica is alive, unless the deployment may scale to zero."""
    actor = {"num_cpus": d.num_cpus, **({"num_gpus": d.num_gpus} if d.num_gpus else {})}
    opts: dict[str, Any] = {"ray_actor_options": actor,
                            "max_ongoing_requests": d.max_ongoing_requests,
                            "max_queued_requests": -1 if d.max_queued_requests is None
                            else d.max_queued_requests,
                            "backpressure_config": {"status_code": 503, "retry_after_s": RETRY_AFTER_S},
                            "request_router_config": router_config(d, route_timeout_s, queue_timeout_s, max_wait_s)}
    if d.autoscaling:
        opts["autoscaling_config"] = dict(d.autoscaling)
    else:
        opts["num_replicas"] = d.num_replicas
    for name in ("health_check_period_s", "health_check_timeout_s", "max_replicas_per_node"):
        if getattr(d, name) is not None:
            opts[name] = getattr(d, name)
    return opts


def router_config(d: DeploymentSettings, route_timeout_s: float | None, queue_timeout_s: float | None = None,
                  max_wait_s: float | None = None) -> dict[str, Any]:
    """Serve's `request_router_config` for `LiveReplicaRouter`."""
    scales_to_zero = bool(d.autoscaling) and (d.autoscaling or {}).get("min_replicas", 1) == 0
    return {"request_router_class": ROUTER_CLASS, "max_backoff_s": MAX_BACKOFF_S,
            "request_router_kwargs": {"no_replica_timeout_s": None if scales_to_zero else route_timeout_s,
                                      "max_queue_wait_s": queue_timeout_s, "max_wait_s": max_wait_s}}


def resolved_api_key(s: ServeSettings) -> str | None:
    """The key requests to the app of `s` must carry (`api_key`, else the environment variable `api_key_env`), or
    None when the API is open."""
    key = s.api_key if s.api_key is not None else os.environ.get(s.api_key_env, "")
    return key or None


def check_exposure(s: ServeSettings) -> None:
    """ValueError when the API of `s` would listen beyond loopback without a key and `public` is not set."""
    if s.public or is_loopback(s.host) or resolved_api_key(s) is not None:
        return
    raise ValueError(f"serve.host {s.host!r} is not loopback and no API key is set (api_key, or "
                     f"the environment variable {s.api_key_env}); refusing to serve an open API. Set the "
                     "key, bind 127.0.0.1, or set public: true to serve without a key on purpose")


def require_manifest(s: ServeSettings) -> Path:
    """The local manifest file of `s.manifest_path` (its directory's manifest.json; a URI: pulled into the run's
    local mirror first, with its model)."""
    if not s.manifest_path:
        raise ValueError("serve.manifest_path is required (a madr.index manifest JSON)")
    if is_uri(s.manifest_path):  # an index on object storage: into the run's local mirror first
        return pull_index(s.manifest_path)
    path = Path(s.manifest_path).expanduser()
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise ValueError(f"serve.manifest_path {str(path)!r} does not exist")
    return path


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) only accepts connections from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def settings_from_dict(data: dict[str, Any] | None) -> ServeSettings:
    """Settings from a plain mapping (the Serve application `args`). A `config` key names a YAML file whose
    mapping is loaded first; the other keys override it (a mapping such as `search` key by key)."""
    data = dict(data or {})
    base: dict[str, Any] = {}
    if "config" in data:
        path = Path(str(data.pop("config")))
        base = yaml.safe_load(path.read_text()) or {}
        if not isinstance(base, dict):
            raise ValueError(f"{path}: top level must be a mapping, got {type(base).__name__}")
    for key, value in data.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        base[key] = {**base[key], **value} if both else value
    return from_dict(ServeSettings, base)


def load_settings(path: str | Path) -> ServeSettings:
    return settings_from_dict({"config": str(path)})
