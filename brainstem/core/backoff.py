"""Retrying a call while a passing failure lasts: growing pauses, up to a deadline.

The one way the runtime waits out something transient: a store's lost connection
(a restart, a failover) or a file another process keeps locked, and the end of a
session waiting for the store to come back. Built on tenacity; the clock and the
sleep can be handed in, so a test runs a ten-second wait in no time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tenacity import RetryCallState

T = TypeVar("T")

RetryOn = tuple[type[BaseException], ...] | type[BaseException] | Callable[[BaseException], bool]


def call_with_backoff(fn: Callable[[], T], *, deadline_seconds: float, first_delay: float, max_delay: float,
                      retry_on: RetryOn, on_retry: Callable[[BaseException], None] | None = None,
                      clip_to_deadline: bool = True, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> T:
    """``fn()``, tried again after each failure ``retry_on`` accepts, until ``deadline_seconds`` have
    passed since this call; then the last failure is raised as it was. Any other failure is raised at
    once, untouched.

    ``retry_on``: exception types, or a predicate on the exception (for failures a type cannot tell
    apart, or a subclass that must not be retried). The pauses start at ``first_delay`` and double
    up to ``max_delay``. ``on_retry(exc)`` is told of each failure that will be retried, before its
    pause. ``clip_to_deadline``: True, the last pause is cut short so that one last try lands on the
    deadline (a deadline of 0 is one try); False, no pause may end past the deadline: the wait gives
    up instead of taking it.
    """
    retryable = _predicate(retry_on)
    deadline = clock() + max(0.0, float(deadline_seconds))
    try:
        return fn()  # the common case: one try, none of the retry machinery
    except BaseException as exc:
        if not retryable(exc):
            raise
        first_failure = exc
    # Only a failure pays for tenacity: the store's first try is on the light sleep path.
    from tenacity import Retrying, retry_if_exception  # noqa: PLC0415 -- the sleep path: only after a failure

    def delay(state: RetryCallState) -> float:
        return min(max_delay, first_delay * 2.0 ** min(state.attempt_number - 1, 64))

    def pause(state: RetryCallState) -> float:
        return max(0.0, min(delay(state), deadline - clock())) if clip_to_deadline else delay(state)

    def give_up(state: RetryCallState) -> bool:
        if clip_to_deadline:
            return deadline - clock() <= 0
        return clock() + delay(state) > deadline

    # The try already made is tenacity's first attempt, so the pauses count from it.
    pending = [first_failure]

    def attempt() -> T:
        if pending:
            raise pending.pop()
        return fn()

    def tell(state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        if on_retry and failure is not None:  # tenacity sleeps only after a failed attempt, so there is one
            on_retry(failure)

    retrying = Retrying(retry=retry_if_exception(retryable), stop=give_up, wait=pause, sleep=sleep, reraise=True,
                        before_sleep=tell if on_retry else None)
    return retrying(attempt)


def _predicate(retry_on: RetryOn) -> Callable[[BaseException], bool]:
    if isinstance(retry_on, type) or isinstance(retry_on, tuple):
        return lambda exc: isinstance(exc, retry_on)
    return retry_on
