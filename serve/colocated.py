"""The co-located topology: the query encoder and every shard in one replica, scaled by replicas.

`ServeSettings.topology` chooses how `serve.app.build_app` lays the app out:

- ``fanout`` (clusters): ``SearchIngress -> QueryEncoder -> searcher-0 .. searcher-{G-1}``, three kinds of
  deployments, each scaled and placed on its own (shard groups on other nodes, encoders on GPUs); every query
  makes a handle hop to the encoder and one to each shard group.
- ``colocated`` (small nodes, the default): one deployment, ``Colocated``: each replica is the HTTP ingress
  *and* holds the lean query encoder and every shard of the index, so a query crosses only Serve's proxy ->
  replica hop; scaled by replicas (``ServeSettings.colocated``: ``num_replicas`` or ``autoscaling``), each
  holding a full copy of the index. ``shard_groups`` and the ``encoder`` / ``searcher`` deployment settings
  do not apply.

The replica runs the very objects the fan-out deployments run: the `QueryEncoder` and `ShardSearcher`
classes (their dynamic batching, batch isolation and text checks), called in-process through `LocalHandle`s,
and `RayBackend`'s merge / fusion (`ColocatedBackend` only replaces the hop): the same HTTP API and the same
answers as fan-out for the same index (tests/serve/test_serve_topology.py).

Threads: a one-thread sparse search runs numba's serial kernel, which starts no thread pool
(`madr.search.sparse.compiled`); `NUMBA_NUM_THREADS` = `faiss_threads` in the replica's environment caps a
search that asks for more. Numba's pool, a thread per core, would otherwise run beside the encoder in the same
process and slow it down, both competing for the same cores.

Failures: there is no handle hop for `serve.calls` to bound; Serve's proxy routes each request to a replica
through `serve.routing.LiveReplicaRouter`. A burst queues in the proxy until a replica has a slot (beyond
`colocated.max_queued_requests`: 503 + Retry-After at once; a request that would wait longer than
`queue_timeout_s` in the queue: 503 + Retry-After on arrival). With 2 replicas a SIGKILL fails only the requests in
flight on the dead one (they die with the process; the proxy answers them 503 + Retry-After at once,
`serve.routing.ReplicaDied`) and the other replica answers the rest; with none alive, the proxy answers 503 +
Retry-After once a request has waited `route_timeout_s` for a live replica (tests/serve/test_serve_replica_death.py).
A replica whose encoder or searcher batch has run longer than `request_timeout_s` fails its health check (the
watchdog of the fan-out deployments), so Serve replaces a hung replica (tests/serve/test_serve_replica_hang.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve
from ray.serve import Application

from madr.index.manifest import Manifest
from serve.api import create_api
from serve.backend import BackendBadRequest, Docs, aspect_k, lexical_tokenizer_dir, lexical_vocab
from serve.calls import CallPolicy
from serve.config import ServeSettings, deployment_options, require_manifest, settings_from_dict
from serve.deployments import QueryEncoder, RayBackend, ShardSearcher
from serve.latency import StageSink

DEPLOYMENT = "Colocated"


class LocalHandle:
    """The ``handle.method.remote(*args)`` call form of a Serve `DeploymentHandle`, over an object in this
    process: an async method is awaited as it is; a blocking one runs in a worker thread, as a replica's
    blocking method runs off the event loop that keeps accepting requests."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> _LocalMethod:
        return _LocalMethod(getattr(self.target, name))


@dataclasses.dataclass(frozen=True)
class _LocalMethod:
    fn: Callable[..., Any]

    def remote(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        if inspect.iscoroutinefunction(self.fn):
            return self.fn(*args, **kwargs)
        return asyncio.to_thread(self.fn, *args, **kwargs)


class ColocatedBackend(RayBackend):
    """`RayBackend` over `LocalHandle`s: the encoder and the shards live in this replica, so a call is a
    coroutine, not a hop; a ValueError of the encoder or searcher is a bad request (HTTP 422) as there."""

    def _call(self, send: Callable[[], Any], what: str, handle: Any) -> Awaitable[Any]:
        return _local_call(send)


async def _local_call(send: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await send()
    except BackendBadRequest:
        raise
    except ValueError as e:
        raise BackendBadRequest(str(e)) from e


def encoder_args(s: ServeSettings, manifest: Manifest) -> tuple[Any, ...]:
    """`QueryEncoder(...)` arguments for these settings (the fan-out deployment's, `serve.app.build_app`)."""
    return (s.model_dir, s.torch_threads, s.encoder_max_batch_size, s.encoder_batch_wait_timeout_s,
            lexical_vocab(manifest), lexical_tokenizer_dir(s.manifest_path),
            s.manifest_path if s.encoder_index_vocabulary else None, s.verify, s.encoder_backend, s.encoder_precision,
            aspect_k(manifest))


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class ColocatedSearch:
    """HTTP ingress + query encoder + every shard, in one replica (module docstring)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings_from_dict(settings)
        s = self.settings
        manifest = Manifest.load(require_manifest(s))
        # stuck_after_s as in fan-out: the health check fails while a batch has run past the request deadline
        self.encoder = QueryEncoder.func_or_class(*encoder_args(s, manifest), stuck_after_s=s.request_timeout_s)
        self.searcher = ShardSearcher.func_or_class(
            s.manifest_path, list(range(len(manifest.shards))), s.mmap, s.verify, s.faiss_threads,
            s.searcher_max_batch_size, s.searcher_batch_wait_timeout_s, stuck_after_s=s.request_timeout_s)
        lam, norm = manifest.fusion
        policy = CallPolicy(s.route_timeout_s, s.replica_retries)
        self.backend = ColocatedBackend(LocalHandle(self.encoder), [LocalHandle(self.searcher)], lam,
                                        manifest.search_mode, policy, fusion_normalisation=norm)
        self.docs = Docs.open(require_manifest(s))

    def __serve_build_asgi_app__(self) -> Any:
        return create_api(self.backend, self.settings, self.docs, StageSink.for_serve(self.settings.access_log))

    def info(self) -> dict[str, Any]:
        """The shards this replica holds and its process (`ShardSearcher.info`: the same process)."""
        return self.searcher.info()

    def check_health(self) -> None:
        """Fails while the encoder or the searcher has a batch stuck past `request_timeout_s` (`serve.watchdog`),
        so Serve replaces a replica whose event loop still answers but whose work does not end."""
        self.encoder.check_health()
        self.searcher.check_health()


def build_colocated(s: ServeSettings) -> Application:
    """The co-located application (paths already absolute: `serve.app.build_app` calls this). Its replicas run
    numba's sparse search with `faiss_threads` threads (`NUMBA_NUM_THREADS`, module docstring)."""
    options = deployment_options(s.colocated, s.route_timeout_s, s.ingress_queue_timeout_s(),
                                 s.ingress_max_wait_s())
    actor = dict(options.pop("ray_actor_options"))
    env = dict(actor.get("runtime_env", {}).get("env_vars", {}))
    env.setdefault("NUMBA_NUM_THREADS", str(s.faiss_threads))
    actor["runtime_env"] = {**actor.get("runtime_env", {}), "env_vars": env}
    return ColocatedSearch.options(name=DEPLOYMENT, ray_actor_options=actor, **options).bind(dataclasses.asdict(s))


__all__ = ["DEPLOYMENT", "ColocatedBackend", "ColocatedSearch", "LocalHandle", "build_colocated"]
