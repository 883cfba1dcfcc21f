"""Serve's request router, taught to tell a busy deployment from a dead one.

Ray Serve (2.60) routes every `DeploymentHandle` call, and every HTTP request its proxy forwards, through a
`RequestRouter`: the call waits in the router's queue until some replica has a free slot
(`max_ongoing_requests`), for as long as it takes. That wait is right while replicas are alive and busy (a
burst queues and is answered), and wrong while the deployment has no live replica (every replica died and
Serve is replacing them): the call then waits for the replacement, seconds on a busy node.

`LiveReplicaRouter` is Serve's default router (power of two choices) plus these rules:

- a call that has waited `no_replica_timeout_s` while the router knew no live replica fails with
  `NoLiveReplica`, a `BackPressureError` that Serve's proxy (and a direct-ingress replica) answers as HTTP 503
  with ``Retry-After: 1``, and that `serve.calls` answers the same way. The router forgets a replica as soon as
  a call or a queue-length probe to it fails with `ActorDiedError`, or when Serve's controller drops it, so a
  death is noticed at the next call. Until the router has heard the controller's first list of replicas it
  never fails a call this way;
- with `max_queue_wait_s`, a call that would wait longer than that in the queue for a busy replica fails with
  `QueuedTooLong` (503 + ``Retry-After: 1``): the ingress's bound on a burst, sized from the request deadline.
  "Would": its place in the queue over the rate at which the deployment finishes calls while calls queue for
  it (measured over the last `RATE_WINDOW_S`; between bursts, the last such rate). A call is judged so only in its
  first `ADMIT_WINDOW_S` in the queue, so that a burst's excess is refused on arrival; a call not refused then is
  admitted and keeps its place until it has waited `max_wait_s` (the request's deadline). A rate measured while a
  burst is still arriving errs; an admitted call then waits past the bound and is answered late, where judging it
  again at every tick refused it late, after it had waited for nothing;
- in Serve's proxy, the death of the replica running a request (the request dies with it; the proxy cannot
  send an HTTP request again) is `ReplicaDied`, 503 + ``Retry-After: 1``, not Serve's bare 500. Elsewhere the
  death stays an `ActorDiedError`, which `serve.calls` answers by sending the call again.

It also tells `serve.calls` where each call is (`call_state`): still queued, or sent to a replica, taken or
not, and how long that replica has gone without finishing any call. A replica that keeps finishing calls is
busy, however long a call waits in it; one that finishes nothing is frozen or hung.

Every deployment of the app uses it (`serve.config.deployment_options`), so the same rules hold for
the ingress's calls to the encoder and searchers (fan-out) and for the proxy's calls to the ingress (both
topologies). Its routing tasks look for a free slot at most `serve.config.MAX_BACKOFF_S` apart, so a queue moves
as fast as the replicas free slots.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import ray
from ray.serve._private.common import DeploymentHandleSource
from ray.serve._private.request_router import PendingRequest, PowerOfTwoChoicesRequestRouter
from ray.serve.exceptions import BackPressureError

from serve.config import RETRY_AFTER_S

RATE_WINDOW_S = 2.0  # the window over which the router measures how fast calls finish
MIN_FINISHES = 8  # ... and how many it needs to have seen finish in it to tell a rate
BATCH_GAP_S = 0.01  # finishes closer than this to the one before are one batch's (a batch finishes its calls at once)
ADMIT_WINDOW_S = 0.6  # how long after its arrival a queued call may still be refused by its predicted wait


class QueuedTooLong(BackPressureError):
    """A call would wait (`expected_s`, as far as the router can tell) or has waited longer than the queue's bound
    for a busy replica: HTTP 503 + ``Retry-After: 1``."""

    def __init__(self, deployment: str, expected_s: float, bound_s: float) -> None:
        super().__init__(0, -1, 503, RETRY_AFTER_S)
        self.deployment, self.expected_s, self.bound_s = deployment, expected_s, bound_s
        self._message = (f"{deployment}: every replica busy; this request would wait {expected_s:.1f} s in the "
                         f"queue, over its {bound_s:g} s bound; retry")

    def __reduce__(self) -> tuple[Any, ...]:
        return QueuedTooLong, (self.deployment, self.expected_s, self.bound_s)


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
    """Power-of-two-choices routing; a call waits for a busy replica (refused on arrival when it would wait over
    `max_queue_wait_s`; at most `max_wait_s`), but at most `no_replica_timeout_s` while no replica is alive (module
    docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.no_replica_timeout_s: float | None = 1.0
        self.max_queue_wait_s: float | None = None
        self.max_wait_s: float | None = None
        self._waiting: dict[str, tuple[float, PendingRequest]] = {}  # request id -> (queued since, request)
        self._expired: dict[str, BackPressureError] = {}  # request id -> why the sweeper failed it
        self._sent: dict[str, tuple[float, Any, bool]] = {}  # request id -> (sent at, replica id, taken)
        self._finished_at: dict[Any, float] = {}  # replica id -> when it last finished a call it had taken
        self._finishes: collections.deque[float] = collections.deque()  # when taken calls finished, the last window
        self._saturated_rate: float | None = None  # calls finished per second, last measured while calls queued
        self._empty_since: float | None = None  # since when no replica is known (None: some are, or no list yet)
        self._sweeper: asyncio.Task | None = None

    def initialize_state(self, no_replica_timeout_s: float | None = 1.0, max_queue_wait_s: float | None = None,
                         max_wait_s: float | None = None, **kwargs: Any) -> None:
        """`no_replica_timeout_s`: how long a call may wait while no replica is alive (None: as long as it takes,
        for a deployment that scales to zero); `max_queue_wait_s`: the longest predicted wait for a busy replica a
        call is admitted with (None: no such rule); `max_wait_s`: how long an admitted call may wait (None:
        `max_queue_wait_s`, else as long as it takes)."""
        super().initialize_state(**kwargs)
        if max_wait_s is None:
            max_wait_s = max_queue_wait_s
        limits = (("no_replica_timeout_s", no_replica_timeout_s), ("max_queue_wait_s", max_queue_wait_s),
                  ("max_wait_s", max_wait_s))
        for name, value in limits:
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if None not in (max_queue_wait_s, max_wait_s) and max_wait_s < max_queue_wait_s:
            raise ValueError(f"max_wait_s ({max_wait_s}) must be >= max_queue_wait_s ({max_queue_wait_s})")
        self.no_replica_timeout_s, self.max_queue_wait_s, self.max_wait_s = limits[0][1], limits[1][1], limits[2][1]

    # ---- what the app asks ----

    def call_state(self, request_id: str) -> tuple[bool, float] | None:
        """For a call sent to a replica: (whether the replica has taken it, seconds since the later of its
        sending and that replica's last finished call); None while it is queued (or unknown here)."""
        sent = self._sent.get(request_id)
        if sent is None:
            return None
        at, replica_id, taken = sent
        return taken, time.monotonic() - max(at, self._finished_at.get(replica_id, 0.0))

    def live_replicas(self) -> int:
        return len(self.curr_replicas)

    # ---- Serve's hooks ----

    async def _choose_replica_for_request(self, pending_request: PendingRequest, *, is_retry: bool = False) -> Any:
        rid = pending_request.metadata.internal_request_id
        self._sent.pop(rid, None)
        self._waiting[rid] = (time.monotonic(), pending_request)
        self._sweep_if_needed()
        try:
            replica = await super()._choose_replica_for_request(pending_request, is_retry=is_retry)
        except asyncio.CancelledError:
            if (error := self._expired.pop(rid, None)) is not None:
                raise error from None
            raise
        finally:
            self._waiting.pop(rid, None)
        self._sent[rid] = (time.monotonic(), replica.replica_id, False)
        return replica

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any) -> None:
        rid = pending_request.metadata.internal_request_id
        if (sent := self._sent.get(rid)) is not None:
            self._sent[rid] = (sent[0], replica_id, True)  # the replica took it
        super().on_request_routed(pending_request, replica_id, result)

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        sent = self._sent.pop(internal_request_id, None)
        if sent is not None and sent[2]:  # a call the replica took has finished: it makes progress
            self._finished_at[replica_id] = now = time.monotonic()
            self._finishes.append(now)
            while self._finishes and self._finishes[0] < now - RATE_WINDOW_S:
                self._finishes.popleft()
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
        self._finished_at = {r: t for r, t in self._finished_at.items() if r in self.curr_replicas}
        self._note_replicas()

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        self._note_replicas()

    # ---- the rules ----

    def _note_replicas(self) -> None:
        if self.curr_replicas:
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = time.monotonic()
            self._sweep_if_needed()

    def _rules_apply(self) -> bool:
        no_replica = self._empty_since is not None and self.no_replica_timeout_s is not None
        return no_replica or self.max_queue_wait_s is not None or self.max_wait_s is not None

    def _sweep_if_needed(self) -> None:
        if self._waiting and self._sweeper is None and self._rules_apply():
            self._sweeper = self._event_loop.create_task(self._sweep())

    def finish_rate(self, now: float) -> float | None:
        """Calls finished per second over the last `RATE_WINDOW_S`: the finishes after the window's first batch over
        the time from that batch to the last finish (None: fewer than `MIN_FINISHES`, or one batch only).

        A batching replica finishes a batch's calls together, so the window's first batch marks where the measured
        time starts and its calls were done before it: counting them would read two batches as twice the rate.
        Ending at the last finish, not now, keeps the rate from sagging between two batches."""
        recent = [t for t in self._finishes if t >= now - RATE_WINDOW_S]
        if len(recent) < MIN_FINISHES:
            return None
        first = 1
        while first < len(recent) and recent[first] - recent[first - 1] < BATCH_GAP_S:
            first += 1
        if first == len(recent):
            return None
        return (len(recent) - first) / (recent[-1] - recent[first - 1])

    def _overdue(self, now: float, queued_since: float, pending: PendingRequest, ahead: int,
                 rate: float | None) -> BackPressureError | None:
        """Why a queued call must fail now (`ahead`: calls before it in the queue; `rate`: `finish_rate`), or
        None."""
        name = self._deployment_id.name
        empty_since, limit = self._empty_since, self.no_replica_timeout_s
        if empty_since is not None and limit is not None and now - max(queued_since, empty_since) >= limit:
            return NoLiveReplica(name, limit)
        if empty_since is not None:
            return None
        waited = time.time() - pending.created_at  # since its first attempt
        if self.max_wait_s is not None and waited >= self.max_wait_s:
            return QueuedTooLong(name, waited, self.max_wait_s)
        if self.max_queue_wait_s is None or rate is None or waited >= ADMIT_WINDOW_S:
            return None  # admitted: it keeps its place
        expected = waited + (ahead + 1) / rate  # ... and still to wait, at the rate calls finish
        return QueuedTooLong(name, expected, self.max_queue_wait_s) if expected >= self.max_queue_wait_s else None

    async def _sweep(self) -> None:
        """While calls are queued and a rule applies: fail each call that is overdue (`_overdue`), in the
        queue's order (oldest first)."""
        limits = [x for x in (self.no_replica_timeout_s, self.max_queue_wait_s, self.max_wait_s) if x is not None]
        tick = min([0.1] + [x / 4 for x in limits])
        try:
            while self._waiting and self._rules_apply():
                await asyncio.sleep(tick)
                now = time.monotonic()
                if (rate := self.finish_rate(now)) is not None:  # calls queue: the replicas are full, this is capacity
                    self._saturated_rate = rate
                rate = self._saturated_rate
                queued = sorted(self._waiting.items(), key=lambda item: item[1][1].created_at)
                ahead = 0
                for rid, (since, pending) in queued:
                    if pending.future.done():
                        continue
                    if (error := self._overdue(now, since, pending, ahead, rate)) is not None:
                        self._expired[rid] = error
                        pending.future.cancel()  # Serve's own cleanup runs; _choose_replica_for_request raises
                    else:
                        ahead += 1
        finally:
            self._sweeper = None


__all__ = ["LiveReplicaRouter", "NoLiveReplica", "QueuedTooLong", "ReplicaDied"]
