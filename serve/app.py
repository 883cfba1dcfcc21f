"""The Ray Serve application: a FastAPI ingress over the query encoder and the shard searchers.

`build_app(args)` is the Serve application builder named by `serve_config.yaml` (``import_path:
serve.app:build_app``); ``args`` are `ServeSettings` fields. It lays out

    SearchIngress (FastAPI, serve/api.py) -> QueryEncoder (batched)      -> merge_topk -> DocStore fields
                                          -> searcher-0 .. searcher-{G-1} (shard groups, fan out)

for ``topology: fanout``; ``topology: colocated`` (the default) serves the same API from one deployment whose
replicas each hold the encoder and every shard (`serve.colocated`).

Run locally with ``serve run serve/serve_config.yaml`` or from Python with `run_local`; deploy to a running
cluster with ``serve deploy serve/serve_config.yaml`` (see docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ray import serve
from ray.serve import Application

from madr.index.manifest import Manifest
from serve.api import create_api
from serve.backend import (
    Docs,
    aspect_k,
    lexical_tokenizer_dir,
    lexical_vocab,
    resolve_model_dir,
    shard_groups,
)
from serve.calls import CallPolicy
from serve.colocated import build_colocated
from serve.config import (
    ServeSettings,
    check_exposure,
    deployment_options,
    require_manifest,
    settings_from_dict,
)
from serve.deployments import QueryEncoder, RayBackend, ShardSearcher
from serve.latency import StageSink
from serve.placement import Capacity, app_deployments, check_placement

log = logging.getLogger(__name__)

APP_NAME = "madr"


@serve.deployment(name="SearchIngress")
@serve.ingress()
class SearchIngress:
    """HTTP entry point; the FastAPI app is built on the replica from the settings (`__serve_build_asgi_app__`)."""

    def __init__(self, encoder: Any, searchers: list[Any], settings: dict[str, Any]) -> None:
        self.settings = settings_from_dict(settings)
        manifest = Manifest.load(require_manifest(self.settings))
        lam, norm = manifest.fusion
        policy = CallPolicy(self.settings.route_timeout_s, self.settings.replica_retries, self.settings.call_timeout_s)
        self.backend = RayBackend(encoder, searchers, lam, manifest.search_mode, policy, fusion_normalisation=norm,
                                  coalesce=self.settings.ingress_coalesce)
        self.docs = Docs.open(require_manifest(self.settings))

    def __serve_build_asgi_app__(self) -> Any:
        return create_api(self.backend, self.settings, self.docs, StageSink.for_serve(self.settings.access_log))


def _absolute(settings: ServeSettings) -> ServeSettings:
    """Paths made absolute where the builder runs, so replicas with another working directory find them."""
    manifest = require_manifest(settings).resolve()
    model_dir = resolve_model_dir(manifest, settings.model_dir).resolve()
    if not model_dir.is_dir():
        raise ValueError(f"serve settings: model_dir {str(model_dir)!r} does not exist")
    return dataclasses.replace(settings, manifest_path=str(manifest), model_dir=str(model_dir))


def build_app(args: dict[str, Any] | ServeSettings | None = None) -> Application:
    """The Serve application for these settings (module docstring)."""
    s = args if isinstance(args, ServeSettings) else settings_from_dict(args)
    s = _absolute(s)
    if s.topology == "colocated":  # encoder + every shard in each replica (serve/colocated.py)
        return build_colocated(s)
    manifest = Manifest.load(s.manifest_path)
    encoder = QueryEncoder.options(name="QueryEncoder", **deployment_options(s.encoder, s.route_timeout_s)).bind(
        s.model_dir, s.torch_threads, s.encoder_max_batch_size, s.encoder_batch_wait_timeout_s,
        lexical_vocab(manifest), lexical_tokenizer_dir(s.manifest_path),
        s.manifest_path if s.encoder_index_vocabulary else None, s.verify, s.encoder_backend, s.encoder_precision,
        aspect_k(manifest), stuck_after_s=s.request_timeout_s)
    searchers = [
        ShardSearcher.options(name=f"searcher-{g}", **deployment_options(s.searcher, s.route_timeout_s)).bind(
            s.manifest_path, group, s.mmap, s.verify, s.faiss_threads, s.searcher_max_batch_size,
            s.searcher_batch_wait_timeout_s, stuck_after_s=s.request_timeout_s)
        for g, group in enumerate(shard_groups(len(manifest.shards), s.shard_groups))]
    ingress = deployment_options(s.ingress, s.route_timeout_s, s.ingress_queue_timeout_s(),
                                 s.ingress_max_wait_s())
    return SearchIngress.options(name="SearchIngress", **ingress).bind(
        encoder, searchers, dataclasses.asdict(s))


def min_app_cpus(settings: ServeSettings, num_shards: int) -> float:
    """CPUs the app's replicas hold at their smallest scale: encoder + one searcher per shard group + ingress
    (the co-located topology: its replicas)."""
    if settings.topology == "colocated":
        return settings.colocated.min_cpus()
    groups = len(shard_groups(num_shards, settings.shard_groups))
    return settings.encoder.min_cpus() + groups * settings.searcher.min_cpus() + settings.ingress.min_cpus()


def run_local(settings: ServeSettings, name: str = APP_NAME, route_prefix: str = "/") -> Any:
    """Start Serve's HTTP proxy on `settings.host:port` (127.0.0.1 unless told otherwise) on the connected
    Ray cluster and deploy the app; returns the ingress handle once every replica is up. Refuses (ValueError,
    before any replica starts) an open API beyond loopback and replicas the cluster could never place
    (`serve.placement`: Serve would wait for them forever)."""
    check_exposure(settings)
    num_shards = len(Manifest.load(require_manifest(settings)).shards)
    check_placement(app_deployments(settings, num_shards), Capacity.of_cluster())
    serve.start(http_options={"host": settings.host, "port": settings.port})
    log_cfg = {"log_level": settings.log_level, "enable_access_log": settings.access_log}
    return serve.run(build_app(settings), name=name, route_prefix=route_prefix, logging_config=log_cfg)


def url(settings: ServeSettings) -> str:
    return f"http://{settings.host}:{settings.port}"


__all__ = ["APP_NAME", "SearchIngress", "build_app", "run_local", "url"]
