"""One call to a deployment through its handle, bounded so that a dead replica never stalls the API.

Ray Serve (2.60) answers a `DeploymentHandle` call in two steps: its router picks a replica that accepts the
request, then that replica runs it. When a replica process dies (SIGKILL, OOM, node loss):

- calls already on it fail with `ActorDiedError` (or `ActorUnavailableError`) soon after;
- the router drops it; while the deployment has no live replica left, the first step *waits without limit*
  until the controller notices the death (its health check, every `health_check_period_s`) and has started a
  replacement: that wait was the 4-10 s stall of issue 24, ending in 504s.

A replica can also hang without dying (frozen, or its batch stuck in a long call): it accepts the call and
never answers, and every call queued behind it waits too.

`call` bounds the first step by `CallPolicy.route_timeout_s` and the second by `CallPolicy.call_timeout_s`,
and retries a call whose replica died or did not answer in time up to `CallPolicy.retries` times (our calls
are reads, safe to repeat). The router sends the retry to another replica when the deployment has one: it
prefers the replica with the shorter queue and skips one that does not answer its queue-length probe. A
client then sees 200 (another replica answered), `BackendUnavailable` -> HTTP 503 + ``Retry-After`` within
about `route_timeout_s` (no live replica), or `BackendTimeout` -> HTTP 504 + ``Retry-After`` after at most
(retries + 1) x `call_timeout_s` (every attempt hung); the request deadline (`ServeSettings.request_timeout_s`)
bounds it all. The hung replica itself is replaced by Serve's health check (`serve.watchdog`). Errors raised
by the deployment's own code keep their meaning (ValueError -> `BackendBadRequest`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from serve.backend import BackendBadRequest, BackendTimeout, BackendUnavailable

# The replica (or every replica) is gone or refuses work: try another one, then answer 503.
REPLICA_GONE: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray.exceptions.TaskCancelledError,  # ours after a route timeout, or a replica shutting down
    serve.exceptions.ReplicaUnavailableError,
    serve.exceptions.DeploymentUnavailableError,
    serve.exceptions.BackPressureError,
)


@dataclass(frozen=True)
class CallPolicy:
    """`route_timeout_s`: the longest a call waits for some replica to accept it (503 after); `call_timeout_s`:
    the longest an accepted call waits for its answer (None: no limit but the request's); `retries`: how many
    times a call whose replica died or did not answer is sent again (504 when the last one did not answer)."""

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


async def call(send: Callable[[], Any], policy: CallPolicy, what: str) -> Any:
    """The result of ``send()`` (a `DeploymentResponse`, e.g. ``lambda: handle.search.remote(x)``) under
    `policy` (module docstring); `what` names the deployment in error messages."""
    for attempt in range(policy.retries + 1):
        response = send()
        try:
            await _routed(response, policy.route_timeout_s, what)
            return await _answered(response, policy.call_timeout_s)
        except asyncio.TimeoutError as e:  # accepted, never answered: a hung replica (or a very slow one)
            if attempt == policy.retries:
                raise BackendTimeout(f"{what}: no answer within {policy.call_timeout_s:g} s in {attempt + 1} "
                                     "attempt(s) (a replica hangs, or all are overloaded)") from e
        except ray.exceptions.RayTaskError as e:  # the deployment's own code raised
            if isinstance(e.cause, ValueError):
                raise BackendBadRequest(str(e.cause)) from e
            if not isinstance(e.cause, REPLICA_GONE):
                raise
            if attempt == policy.retries:  # an upstream replica it depended on died
                raise _unavailable(what, e.cause) from e
        except REPLICA_GONE as e:
            if attempt == policy.retries:
                raise _unavailable(what, e) from e
    raise AssertionError("unreachable")


async def _routed(response: Any, timeout_s: float, what: str) -> None:
    """Wait until a replica has accepted `response`'s call, at most `timeout_s` (then cancel it: 503)."""
    # The first half of `DeploymentResponse.__await__` (Ray 2.60); the result is cached on the response, so
    # awaiting the response afterwards does not route again. Without it only the request deadline applies.
    assigned = getattr(response, "_fetch_future_result_async", None)
    if assigned is None:
        return
    try:
        await asyncio.wait_for(assigned(), timeout_s)
    except asyncio.TimeoutError as e:
        response.cancel()
        raise BackendUnavailable(f"{what}: no replica accepted the call within {timeout_s:g} s (a replica "
                                 "died and is being replaced, or all are saturated)") from e


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


__all__ = ["REPLICA_GONE", "CallPolicy", "call"]
