"""Serve's request router, taught to tell a deployment with no live replica from one whose replicas are busy.

Ray Serve (2.60) routes every `DeploymentHandle` call, and every HTTP request its proxy forwards, through a
`RequestRouter`: the call waits in the router's queue until some replica has a free slot
(`max_ongoing_requests`), for as long as it takes. That wait is right while replicas are alive and busy (a
burst queues and is answered), and wrong while the deployment has no live replica (every replica died and
Serve is replacing them): the call then waits for the replacement, seconds on a busy node.

`LiveReplicaRouter` is Serve's default router (power of two choices) plus one rule: a call that has waited
`no_replica_timeout_s` while the router knew no live replica fails with `NoLiveReplica`, a `BackPressureError`
that Serve's proxy (and a direct-ingress replica) answers as HTTP 503 with ``Retry-After: 1``, and that
`serve.calls` answers the same way. The router forgets a replica as soon as a call or a queue-length probe to
it fails with `ActorDiedError`, or when Serve's controller drops it (health check), so a death is noticed at
the next call. It also records when each call left its queue for a replica (`sent_at`): `serve.calls` uses
it to tell a call that waits its turn (fine) from one sent to a replica that does not take it (a frozen
replica: sent again elsewhere).

Every deployment of the app uses it (`serve.config.DeploymentSettings.options`), so the same rule holds for the
ingress's calls to the encoder and searchers (fan-out) and for the proxy's calls to the ingress (both
topologies). Until the router has heard the controller's first list of replicas it never fails a call.

In Serve's proxy it also turns the death of the replica running a request (the request dies with it; the proxy
cannot send an HTTP request again) from Serve's bare 500 into `ReplicaDied`: 503 + ``Retry-After: 1``. Elsewhere
the death stays an `ActorDiedError`, which `serve.calls` answers by sending the call again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import ray
from ray.serve._private.common import DeploymentHandleSource
from ray.serve._private.request_router import PendingRequest, PowerOfTwoChoicesRequestRouter
from ray.serve.exceptions import BackPressureError

from serve.config import RETRY_AFTER_S


class NoLiveReplica(BackPressureError):
    """A call waited `waited_s` while its deployment had no live replica: HTTP 503 + ``Retry-After: 1``."""

    def __init__(self, deployment: str, waited_s: float) -> None:
        super().__init__(0, -1, 503, RETRY_AFTER_S)
        self.deployment, self.waited_s = deployment, waited_s
        self._message = (f"{deployment}: no live replica for {waited_s:g} s (replicas died and are being replaced); "
                         "retry")

    def __reduce__(self) -> tuple[Any, ...]:
        return NoLiveReplica, (self.deployment, self.waited_s)


class ReplicaDied(BackPressureError):
    """The replica running a request died under it: HTTP 503 + ``Retry-After: 1`` from Serve's proxy."""

    def __init__(self, deployment: str) -> None:
        super().__init__(0, -1, 503, RETRY_AFTER_S)
        self.deployment = deployment
        self._message = f"{deployment}: the replica running this request died; retry"

    def __reduce__(self) -> tuple[Any, ...]:
        return ReplicaDied, (self.deployment,)


class _DeathAs503:
    """A Serve `ReplicaResult` whose answer, once its replica has taken the request, raises `ReplicaDied` where
    the replica's death would raise `RayActorError`; everything else (the replica's taking or refusing the
    request, which Serve's router retries on a death) is the result's own."""

    def __init__(self, result: Any, deployment: str) -> None:
        self._result, self._deployment = result, deployment

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    async def __anext__(self) -> Any:
        try:
            return await self._result.__anext__()
        except ray.exceptions.RayActorError as e:
            raise ReplicaDied(self._deployment) from e

    async def get_async(self) -> Any:
        try:
            return await self._result.get_async()
        except ray.exceptions.RayActorError as e:
            raise ReplicaDied(self._deployment) from e


class LiveReplicaRouter(PowerOfTwoChoicesRequestRouter):
    """Power-of-two-choices routing; a call waits for a busy replica, but at most `no_replica_timeout_s` while no
    replica is alive (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.no_replica_timeout_s: float | None = 1.0
        self._waiting: dict[str, tuple[float, PendingRequest]] = {}  # request id -> (waiting since, request)
        self._expired: set[str] = set()
        self._sent_at: dict[str, float] = {}  # request id -> when it left the queue for a replica
        self._empty_since: float | None = None  # since when no replica is known (None: some are, or no list yet)
        self._sweeper: asyncio.Task | None = None

    def initialize_state(self, no_replica_timeout_s: float | None = 1.0, **kwargs: Any) -> None:
        """`no_replica_timeout_s`: how long a call may wait while no replica is alive (None: as long as it takes,
        for a deployment that scales to zero)."""
        super().initialize_state(**kwargs)
        if no_replica_timeout_s is not None and no_replica_timeout_s <= 0:
            raise ValueError(f"no_replica_timeout_s must be > 0, got {no_replica_timeout_s}")
        self.no_replica_timeout_s = no_replica_timeout_s

    # ---- what the app asks ----

    def sent_at(self, request_id: str) -> float | None:
        """`time.monotonic()` when the call left the queue for a replica that has not yet taken it, else None."""
        return self._sent_at.get(request_id)

    def live_replicas(self) -> int:
        return len(self.curr_replicas)

    # ---- Serve's hooks ----

    async def _choose_replica_for_request(self, pending_request: PendingRequest, *, is_retry: bool = False) -> Any:
        rid = pending_request.metadata.internal_request_id
        self._sent_at.pop(rid, None)
        self._waiting[rid] = (time.monotonic(), pending_request)
        self._sweep_if_empty()
        try:
            replica = await super()._choose_replica_for_request(pending_request, is_retry=is_retry)
        except asyncio.CancelledError:
            if rid in self._expired:
                self._expired.discard(rid)
                raise NoLiveReplica(self._deployment_id.name, float(self.no_replica_timeout_s or 0)) from None
            raise
        finally:
            self._waiting.pop(rid, None)
        self._sent_at[rid] = time.monotonic()
        return replica

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any) -> None:
        self._sent_at.pop(pending_request.metadata.internal_request_id, None)  # the replica took it
        super().on_request_routed(pending_request, replica_id, result)

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        self._sent_at.pop(internal_request_id, None)
        super().on_request_completed(replica_id, internal_request_id)

    def create_replica_wrapper(self, replica_info: Any) -> Any:
        replica = super().create_replica_wrapper(replica_info)
        if self._handle_source == DeploymentHandleSource.PROXY:  # the proxy: a death mid-request is a 503
            send, deployment = replica.try_send_request, self._deployment_id.name

            def try_send_request(pr: PendingRequest, with_rejection: bool) -> Any:
                return _DeathAs503(send(pr, with_rejection=with_rejection), deployment)

            replica.try_send_request = try_send_request
        return replica

    def update_replicas(self, replicas: list[Any]) -> None:
        super().update_replicas(replicas)
        self._note_replicas()

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        self._note_replicas()

    # ---- the rule ----

    def _note_replicas(self) -> None:
        if self.curr_replicas:
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = time.monotonic()
            self._sweep_if_empty()

    def _sweep_if_empty(self) -> None:
        if (self._empty_since is not None and self.no_replica_timeout_s is not None and self._waiting
                and self._sweeper is None):
            self._sweeper = self._event_loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        """While no replica is known: fail each call that has waited `no_replica_timeout_s` since then."""
        assert self.no_replica_timeout_s is not None
        tick = min(0.1, self.no_replica_timeout_s / 4)
        try:
            while self._waiting and self._empty_since is not None:
                await asyncio.sleep(tick)
                empty_since = self._empty_since
                if empty_since is None:
                    break
                now = time.monotonic()
                for rid, (since, pending) in list(self._waiting.items()):
                    if now - max(since, empty_since) >= self.no_replica_timeout_s and not pending.future.done():
                        self._expired.add(rid)
                        pending.future.cancel()  # Serve's own cleanup runs; _choose_replica_for_request raises
        finally:
            self._sweeper = None


__all__ = ["LiveReplicaRouter", "NoLiveReplica", "ReplicaDied"]
