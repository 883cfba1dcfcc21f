"""One call to a deployment through its handle: it queues while replicas are busy, and fails fast when none
is alive, or when the replica it was sent to makes no progress.

Ray Serve (2.60) answers a `DeploymentHandle` call in three steps: the call waits in its router's queue
until some replica has a free slot (`max_ongoing_requests`), is sent to that replica, which takes it (or,
full after all, sends it back to the queue), then runs it (a batching replica queues it for a batch first).
What can go wrong, and what `call` does:

- **Every replica busy** (a burst): the call waits its turn, in the router's queue and then in the replica,
  bounded only by the request's deadline (`ServeSettings.request_timeout_s`, HTTP 504 + ``Retry-After``) and,
  at the ingress, by Serve's queue bound (`max_queued_requests`, and `queue_timeout_s` for a request's
  predicted wait on arrival: HTTP 503 + ``Retry-After``). Busy is not dead: a burst is answered, not shed.
- **No live replica** (all died; Serve is replacing them): the router (`serve.routing.LiveReplicaRouter`)
  fails a call that has waited `CallPolicy.route_timeout_s` while it knew no live replica (`NoLiveReplica`);
  `call` answers `BackendUnavailable` -> HTTP 503 + ``Retry-After`` at once. The router forgets a replica as
  soon as a call or probe to it fails with `ActorDiedError`, so a death is noticed at the next call.
- **The replica died under the call** (`ActorDiedError`, ...): the call is sent again, up to
  `CallPolicy.retries` times (our calls are reads, safe to repeat); the router sends it to another replica
  when there is one; after the last attempt: `BackendUnavailable`.
- **The replica it was sent to makes no progress**: it has finished no call for `CallPolicy.call_timeout_s`
  since the call was sent (frozen: alive, answering nothing; or hung: a batch stuck in a long call). The call
  is sent again; after the last attempt `BackendUnavailable` (the replica never took it) or `BackendTimeout`
  -> HTTP 504 + ``Retry-After`` (it took it). A replica that keeps finishing calls is busy, not hung: a call
  waits in it as long as the deadline allows. Serve's health check replaces a hung replica
  (`serve.watchdog`). Without the router's view (another router), a taken call gets `call_timeout_s` flat.

Errors raised by the deployment's own code keep their meaning (ValueError -> `BackendBadRequest`); any other
error of Ray's (a lost object, a crashed worker) is `BackendUnavailable`, never an HTTP 500.
"""

from __future__ import annotations

import asyncio
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
    to may go without finishing any call before the call is sent again (None: no limit but the request's);
    `retries`: how many times a call whose replica died or made no progress is sent again."""

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
    """The replica a call was sent to neither took it nor finished any other call for `call_timeout_s`
    (frozen)."""


async def call(send: Callable[[], Any], policy: CallPolicy, what: str, handle: Any = None) -> Any:
    """The result of ``send()`` (a `DeploymentResponse`, e.g. ``lambda: handle.search.remote(x)``) under
    `policy` (module docstring); `handle`: the deployment's handle (its router tells a queued call from one
    sent to a replica; without it a call is never judged not taken); `what` names the deployment in errors."""
    for attempt in range(policy.retries + 1):
        last = attempt == policy.retries
        response = send()
        try:
            return await _outcome(response, policy.call_timeout_s, _router(handle))
        except asyncio.TimeoutError as e:  # taken, never answered: a hung replica
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


async def _outcome(response: Any, timeout_s: float | None, router: Any) -> Any:
    """`response`'s result. With the router's view (`LiveReplicaRouter.call_state`): the call waits as long as
    it is queued, or its replica keeps finishing calls; once its replica has finished nothing for `timeout_s`
    since the call was sent, the call is cancelled: `NotTaken` (the replica never took it) or
    asyncio.TimeoutError (it took it). Without: a taken call waits at most `timeout_s`."""
    request_id = getattr(getattr(response, "_request_metadata", None), "internal_request_id", None)
    call_state = getattr(router, "call_state", None)
    if timeout_s is None:
        return await response
    if call_state is None or request_id is None:
        return await _answered(response, timeout_s)
    result = asyncio.ensure_future(_result(response))
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=timeout_s / 2)
            if done:
                return result.result()
            state = call_state(request_id)
            if state is not None and state[1] >= timeout_s:
                if state[0]:
                    raise asyncio.TimeoutError
                raise NotTaken(f"the replica it was sent to took no call for {state[1]:.1f} s (a frozen replica)")
    except BaseException:
        result.cancel()
        response.cancel()
        raise


def _router(handle: Any) -> Any:
    """The request router behind `handle` once it has routed a call (Ray 2.60's private layout), else None."""
    router = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    return getattr(router, "_request_router", None)


async def _answered(response: Any, timeout_s: float) -> Any:
    """`response`'s result, at most `timeout_s` after a replica took the call (then the call is cancelled:
    asyncio.TimeoutError)."""
    fetch = getattr(response, "_fetch_future_result_async", None)  # Ray 2.60: the routing half of the await
    if fetch is not None:
        try:
            await fetch()
        except asyncio.CancelledError:
            response.cancel()
            raise
    try:
        return await asyncio.wait_for(_result(response), timeout_s)
    except asyncio.TimeoutError:
        response.cancel()
        raise


async def _result(response: Any) -> Any:
    return await response


def member_error(what: str, e: Exception) -> Exception:
    """The error one member of a coalesced call (`serve.coalesce`) meets, from the exception its callee returned
    in its place: as `call` answers the same exception raised by a call of its own (a ValueError: 422; a
    refusal or a replica gone: 503), without a retry."""
    if isinstance(e, (BackendBadRequest, BackendUnavailable, BackendTimeout)):
        return e
    if isinstance(e, ValueError):
        return BackendBadRequest(str(e))
    if isinstance(e, (*REFUSED, *REPLICA_GONE, ray.exceptions.RayError)):
        return _unavailable(what, e)
    return e


def _unavailable(what: str, e: BaseException) -> BackendUnavailable:
    first = (str(e).splitlines() or [""])[0][:200]
    return BackendUnavailable(f"{what}: {type(e).__name__}: {first}")


__all__ = ["REFUSED", "REPLICA_GONE", "CallPolicy", "NotTaken", "call", "member_error"]
