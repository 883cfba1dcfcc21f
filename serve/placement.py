"""Whether the Serve app's replicas can ever be placed on the cluster, checked before anything is deployed.

Ray Serve waits without limit for a replica the cluster cannot hold: at deploy time `serve.run` never returns;
later, an autoscaled deployment that wants one more replica than fits stays "UPSCALING" forever (e.g. the
encoder on a 2-CPU cluster). `check_placement` turns both into a `ValueError` naming the deployment, the
resource and what to lower:

- one replica asks for more of a resource than the largest node (or, with an autoscaler, node type) has;
- the app at its largest scale (`max_replicas` of autoscaled deployments, `num_replicas` of the others) asks
  for more than the cluster has in all (with an autoscaler: more than its configured maximum);
- a deployment with `max_replicas_per_node` wants more replicas than that many per node of the cluster.

Totals are compared, not a bin packing of replicas onto nodes, so a fragmented multi-node cluster can still
leave a replica pending; on one node (the local case) the check is exact. A cluster without an autoscaler
configuration in its GCS (a local `ray.init`, `ray start` without the cluster launcher) cannot grow.

Checked by `serve.app.run_local` (the settings' deployments) and by the deploy stage before a local `serve run`
(`serve_config_deployments`: the Serve YAML's `deployments:` overrides applied, which the app builder never
sees; `pipelines/jobs/deploy.py`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from serve.backend import shard_groups
from serve.config import DeploymentSettings, ServeSettings, require_manifest, settings_from_dict

SETTING = {"QueryEncoder": "encoder", "SearchIngress": "ingress", "Colocated": "colocated"}  # searcher-<g>: searcher


@dataclass(frozen=True)
class Capacity:
    """What the cluster can ever offer: `largest_node` (resources of its largest node or node type), `total`
    (all of them; with an autoscaler its maximum), whether it `can_grow` (an autoscaler adds nodes) and how many
    `nodes` it has (at most)."""

    largest_node: dict[str, float]
    total: dict[str, float]
    can_grow: bool = False
    nodes: int = 1

    @classmethod
    def of_cluster(cls) -> Capacity:
        """The connected Ray cluster's capacity (alive nodes, or the autoscaler's node types when it has one)."""
        import ray

        nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
        groups = _autoscaler_node_groups()
        if groups:
            largest = {k: max(float(r.get(k, 0)) for r, _ in groups) for r, _ in groups for k in r}
            total = {k: sum(float(r.get(k, 0)) * n for r, n in groups) for r, _ in groups for k in r}
            return cls(largest, total, can_grow=True, nodes=sum(n for _, n in groups))
        largest = {k: max(float(r.get(k, 0)) for r in nodes) for r in nodes for k in r}
        total = {k: sum(float(r.get(k, 0)) for r in nodes) for r in nodes for k in r}
        return cls(largest, total, nodes=len(nodes))


    @classmethod
    def of_machine(cls) -> Capacity:
        """A local Ray that `serve run` would start on this machine: one node with the CPUs this process may use."""
        cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        return cls({"CPU": cpus}, {"CPU": cpus})


def _autoscaler_node_groups() -> list[tuple[dict[str, float], int]]:
    """(resources, max count) of each node type the autoscaler may start; [] without an autoscaler config.
    Reads Ray's private GCS accessor (2.60); if Ray drops it the cluster is taken as fixed."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - private API: absent or changed
        return []
    if config is None:
        return []
    return [(dict(g.resources), int(g.max_count)) for g in config.node_group_configs if g.max_count]


def replica_resources(d: DeploymentSettings) -> dict[str, float]:
    """What one replica of `d` asks for: its CPUs and, with `num_gpus`, its GPUs."""
    return {"CPU": float(d.num_cpus), **({"GPU": float(d.num_gpus)} if d.num_gpus else {})}


def largest_scale(d: DeploymentSettings) -> int:
    """Replicas of `d` at its largest scale: autoscaling `max_replicas` (Serve's default 1), else `num_replicas`."""
    return int(d.autoscaling.get("max_replicas", 1)) if d.autoscaling else int(d.num_replicas)


def app_deployments(settings: ServeSettings, num_shards: int) -> dict[str, DeploymentSettings]:
    """{deployment name: its settings} as `serve.app.build_app` lays the app out (either topology)."""
    if settings.topology == "colocated":
        from serve.colocated import DEPLOYMENT

        return {DEPLOYMENT: settings.colocated}
    groups = len(shard_groups(num_shards, settings.shard_groups))
    return {"QueryEncoder": settings.encoder, **{f"searcher-{g}": settings.searcher for g in range(groups)},
            "SearchIngress": settings.ingress}


def serve_config_deployments(app: dict[str, Any]) -> dict[str, DeploymentSettings]:
    """The deployments of one application of a Serve YAML (`applications[i]`): its `args` as `build_app` lays
    them out (the manifest is read for the number of shard groups), then each `deployments:` entry's
    `num_replicas`, `autoscaling_config`, `max_replicas_per_node` and `ray_actor_options.num_cpus` / `num_gpus` on
    top, as Serve applies them."""
    from madr.index.manifest import Manifest

    settings = settings_from_dict(app.get("args"))
    out = app_deployments(settings, len(Manifest.load(require_manifest(settings)).shards))
    for entry in app.get("deployments") or []:
        name = entry.get("name")
        if name not in out:
            continue
        d = out[name]
        actor = entry.get("ray_actor_options") or {}
        cpus, gpus = actor.get("num_cpus", d.num_cpus), actor.get("num_gpus", d.num_gpus)
        if "autoscaling_config" in entry:
            d = dataclasses.replace(d, autoscaling=dict(entry["autoscaling_config"] or {}) or None)
        if "max_replicas_per_node" in entry:
            d = dataclasses.replace(d, max_replicas_per_node=entry["max_replicas_per_node"])
        if isinstance(entry.get("num_replicas"), int):
            d = dataclasses.replace(d, num_replicas=entry["num_replicas"], autoscaling=None)
        out[name] = dataclasses.replace(d, num_cpus=float(cpus), num_gpus=float(gpus or 0))
    return out


def check_placement(deployments: dict[str, DeploymentSettings], capacity: Capacity) -> None:
    """ValueError when some replica of `deployments` ({name: settings}, `app_deployments` or
    `serve_config_deployments`) could never be placed on `capacity` (module docstring)."""
    where = "the autoscaler's largest node type" if capacity.can_grow else "the largest node"
    for name, d in deployments.items():
        for res, need in replica_resources(d).items():
            have = capacity.largest_node.get(res, 0.0)
            if need > have:
                raise ValueError(f"serve settings: {name}: one replica asks for {need:g} {res} but {where} has "
                                 f"{have:g}: it can never be placed; lower {_setting(name)}.{_knob(res)}")
        per_node = getattr(d, "max_replicas_per_node", None)
        if per_node and largest_scale(d) > per_node * capacity.nodes:
            raise ValueError(f"serve settings: {name}: {largest_scale(d)} replicas at most {per_node} per node, but "
                             f"the cluster has {capacity.nodes} node(s): some can never be placed; lower its "
                             f"replicas or raise {_setting(name)}.max_replicas_per_node")
    for res in {r for d in deployments.values() for r in replica_resources(d)}:
        need = {n: largest_scale(d) * replica_resources(d).get(res, 0.0) for n, d in deployments.items()}
        have = capacity.total.get(res, 0.0)
        if sum(need.values()) <= have + 1e-9:
            continue
        parts = ", ".join(f"{n} {largest_scale(d)} x {replica_resources(d).get(res, 0.0):g}"
                          for n, d in deployments.items())
        limit = "the autoscaler's maximum" if capacity.can_grow else "the cluster (it cannot grow)"
        scaled = [n for n, d in deployments.items() if d.autoscaling and d.autoscaling.get("max_replicas", 1) > 1
                  and replica_resources(d).get(res, 0.0)]
        hint = _autoscaling_hint(scaled[0], deployments, res, have) if scaled else \
            f"lower num_replicas or {_knob(res)} of encoder / searcher / ingress"
        raise ValueError(f"serve settings: the app's replicas at their largest scale ask for "
                         f"{sum(need.values()):g} {res} ({parts}) but {limit} has {have:g}: some would never be "
                         f"placed and the app would wait for them forever (UPSCALING); {hint}")


def _autoscaling_hint(name: str, deployments: dict[str, DeploymentSettings], res: str, have: float) -> str:
    """How many replicas of the autoscaled deployment `name` fit beside the others at their largest scale."""
    d = deployments[name]
    per = replica_resources(d).get(res, 0.0)
    others = sum(largest_scale(o) * replica_resources(o).get(res, 0.0) for n, o in deployments.items() if n != name)
    fits = int((have - others + 1e-9) // per) if per else 0
    return (f"{name} autoscales to max_replicas {largest_scale(d)} but at most {max(fits, 0)} of its replicas fit: "
            f"set {_setting(name)}.autoscaling.max_replicas <= {max(fits, 0)} or lower {_knob(res)}")


def _setting(name: str) -> str:
    return SETTING.get(name, "searcher")


def _knob(resource: str) -> str:
    """The deployment setting that asks for `resource`."""
    return "num_gpus" if resource == "GPU" else "num_cpus"


__all__ = ["Capacity", "app_deployments", "check_placement", "largest_scale", "replica_resources",
           "serve_config_deployments"]
