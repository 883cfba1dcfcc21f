"""One call to a deployment through its handle: it queues while replicas are busy, and fails fast when none
is alive or the replica it was sent to does not take it.

Ray Serve (2.60) answers a `DeploymentHandle` call in three steps: the call waits in its router's queue
until some replica has a free slot (`max_ongoing_requests`), is sent to that replica, which takes it (or,
full after all, sends it back to the queue), then runs it. What can go wrong, and what `call` does:

- **Every replica busy** (a burst): the call waits its turn in the queue, bounded only by the request's
  deadline (`ServeSettings.request_timeout_s`, HTTP 504 + ``Retry-After``) and, at the ingress, by Serve's
  queue bound (`DeploymentSettings.max_queued_requests`, HTTP 503 + ``Retry-After``). Busy is not dead: a
  burst is answered, not shed.
- **No live replica** (all died; Serve is replacing them): the router (`serve.routing.LiveReplicaRouter`)
  fails a call that has waited `CallPolicy.route_timeout_s` while it knew no live replica (`NoLiveReplica`);
  `call` answers `BackendUnavailable` -> HTTP 503 + ``Retry-After`` at once. The router forgets a replica as
  soon as a call or probe to it fails with `ActorDiedError`, so a death is noticed at the next call.
- **The replica died under the call** (`ActorDiedError`, ...): the call is sent again, up to
  `CallPolicy.retries` times (our calls are reads, safe to repeat); the router sends it to another replica
  when there is one; after the last attempt: `BackendUnavailable`.
- **The replica it was sent to does not take it** within `CallPolicy.call_timeout_s` (frozen: alive, answering
  nothing; a live replica takes or refuses a call at once, if slowly when its CPU is short): sent again, as
  above; after the last attempt `BackendUnavailable`.
- **Taken, never answered** within `call_timeout_s` (a hung replica, or a batch stuck in a long call): sent
  again; after the last attempt `BackendTimeout` -> HTTP 504 + ``Retry-After``. Serve's health check replaces
  the hung replica (`serve.watchdog`).

Errors raised by the deployment's own code keep their meaning (ValueError -> `BackendBadRequest`); any other
error of Ray's (a lost object, a crashed worker) is `BackendUnavailable`, never an HTTP 500.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from serve.backend import BackendBadRequest, BackendTimeout, BackendUnavailable

# The replica (or every replica) is gone or refused the call: try again (another replica), then answer 503.
REPLICA_GONE: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray.exceptions.TaskCancelledError,  # a replica shutting down
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.ObjectLostError,  # OwnerDiedError, ...
    serve.exceptions.ReplicaUnavailableError,
    serve.exceptions.DeploymentUnavailableError,
)
# Refused by the router after its own wait (no live replica) or by a full queue: 503 at once, no retry.
REFUSED: tuple[type[BaseException], ...] = (serve.exceptions.BackPressureError,)


@dataclass(frozen=True)
class CallPolicy:
    """`route_timeout_s`: how long a call may wait while its deployment has no live replica (503 after; a busy
    deployment's queue has no bound but the request's); `call_timeout_s`: how long the replica a call was sent
    to may take to take it, and then to answer it (None: no limit but the request's); `retries`: how many times
    a call whose replica died, did not take it or did not answer is sent again."""

    route_timeout_s: float = 1.0
    retries: int = 1
    call_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("route_timeout_s", "call_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")


class NotTaken(Exception):
    """The replica a call was sent to did not take it within `call_timeout_s` (frozen, or its process is
    starved)."""


async def call(send: Callable[[], Any], policy: CallPolicy, what: str, handle: Any = None) -> Any:
    """The result of ``send()`` (a `DeploymentResponse`, e.g. ``lambda: handle.search.remote(x)``) under
    `policy` (module docstring); `handle`: the deployment's handle (its router tells a queued call from one
    sent to a replica; without it a call is never judged not taken); `what` names the deployment in errors."""
    for attempt in range(policy.retries + 1):
        last = attempt == policy.retries
        response = send()
        try:
            await _taken(response, policy.call_timeout_s, _router(handle))
            return await _answered(response, policy.call_timeout_s)
        except asyncio.TimeoutError as e:  # taken, never answered: a hung replica (or a very slow one)
            if last:
                raise BackendTimeout(f"{what}: no answer within {policy.call_timeout_s:g} s in {attempt + 1} "
                                     "attempt(s) (a replica hangs, or all are overloaded)") from e
        except NotTaken as e:
            if last:
                raise BackendUnavailable(f"{what}: {e}") from e
        except REFUSED as e:
            raise _unavailable(what, e) from e
        except ray.exceptions.RayTaskError as e:  # the deployment's own code raised
            if isinstance(e.cause, ValueError):
                raise BackendBadRequest(str(e.cause)) from e
            if isinstance(e.cause, REFUSED) or (last and isinstance(e.cause, REPLICA_GONE)):
                raise _unavailable(what, e.cause) from e  # an upstream deployment it depended on
            if not isinstance(e.cause, REPLICA_GONE):
                raise
        except REPLICA_GONE as e:
            if last:
                raise _unavailable(what, e) from e
        except (ray.exceptions.RayError, serve.exceptions.RayServeException) as e:  # Ray failed us: retry, 503
            if last:
                raise _unavailable(what, e) from e
    raise AssertionError("unreachable")


async def _taken(response: Any, timeout_s: float | None, router: Any) -> None:
    """Wait until a replica has taken `response`'s call: as long as the call waits in the router's queue (the
    router itself fails it when no replica is alive), at most `timeout_s` (None: no limit) once it was sent to
    a replica (`NotTaken` after; the call is cancelled)."""
    # The first half of `DeploymentResponse.__await__` (Ray 2.60); the result is cached on the response, so
    # awaiting the response afterwards does not route again. Without it the request deadline alone applies.
    fetch = getattr(response, "_fetch_future_result_async", None)
    request_id = getattr(getattr(response, "_request_metadata", None), "internal_request_id", None)
    if fetch is None:
        return
    taken = asyncio.ensure_future(fetch())
    sent_at = getattr(router, "sent_at", None) if request_id is not None and timeout_s is not None else None
    try:
        while True:
            done, _ = await asyncio.wait({taken}, timeout=None if sent_at is None else timeout_s / 2)
            if done:
                taken.result()
                return
            sent = sent_at(request_id) if sent_at is not None else None
            if sent is not None and (waited := time.monotonic() - sent) >= timeout_s:
                raise NotTaken(f"the replica it was sent to did not take the call within {waited:.1f} s "
                               "(a frozen replica, or a starved process)")
    except BaseException:
        taken.cancel()
        response.cancel()
        raise


def _router(handle: Any) -> Any:
    """The request router behind `handle` once it has routed a call (Ray 2.60's private layout), else None."""
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    return getattr(router, "_request_router", None)


async def _answered(response: Any, timeout_s: float | None) -> Any:
    """`response`'s result, waiting at most `timeout_s` (then the call is cancelled: asyncio.TimeoutError)."""
    if timeout_s is None:
        return await response
    try:
        return await asyncio.wait_for(_result(response), timeout_s)
    except asyncio.TimeoutError:
        response.cancel()
        raise


async def _result(response: Any) -> Any:
    return await response


def _unavailable(what: str, e: BaseException) -> BackendUnavailable:
    first = (str(e).splitlines() or [""])[0][:200]
    return BackendUnavailable(f"{what}: {type(e).__name__}: {first}")


__all__ = ["REFUSED", "REPLICA_GONE", "CallPolicy", "NotTaken", "call"]
