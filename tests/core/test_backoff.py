"""The one backoff helper: growing pauses, a deadline kept, only the named failures retried.

A fake clock moved on by a fake sleep: a ten-second wait costs no time.
"""

from __future__ import annotations

import time

import pytest

from brainstem.core.backoff import call_with_backoff
from brainstem.core.errors import LeaseLost, StoreFull, StoreUnavailable


class Clock:
    def __init__(self):
        self.now = 1000.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def failing(times: int, exc_type=StoreUnavailable, value="done"):
    """A call that fails ``times`` times (each with a new exception), then answers ``value``."""
    raised: list[BaseException] = []

    def fn():
        if len(raised) < times:
            raised.append(exc_type(f"failure {len(raised) + 1}"))
            raise raised[-1]
        return value
    fn.raised = raised
    return fn


def backoff(fn, clock, **kw):
    args = {"deadline_seconds": 10.0, "first_delay": 0.25, "max_delay": 2.0, "retry_on": StoreUnavailable,
            "sleep": clock.sleep, "clock": clock}
    return call_with_backoff(fn, **{**args, **kw})


def test_a_call_that_succeeds_is_tried_once_and_never_waits():
    clock = Clock()
    assert backoff(failing(0), clock) == "done"
    assert clock.pauses == []


def test_the_pauses_double_from_the_first_up_to_the_largest():
    clock = Clock()
    fn = failing(6)
    assert backoff(fn, clock) == "done"
    assert clock.pauses == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_the_deadline_is_kept_and_the_last_failure_raised_as_it_was():
    clock = Clock()
    fn = failing(10_000)
    with pytest.raises(StoreUnavailable) as info:
        backoff(fn, clock)
    assert info.value is fn.raised[-1]
    assert clock.now == pytest.approx(1010.0)  # the last pause cut short, one last try on the deadline
    assert clock.pauses[-1] < 2.0 and all(p > 0 for p in clock.pauses)


def test_without_clipping_no_pause_ends_past_the_deadline():
    # 0.25 + 0.5 + 1 + 2 + 2 + 2 = 7.75 s; the next 2 s pause would end at 9.75 s: still taken; then 11.75: not.
    clock = Clock()
    fn = failing(10_000)
    with pytest.raises(StoreUnavailable) as info:
        backoff(fn, clock, clip_to_deadline=False)
    assert clock.pauses == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert clock.now == pytest.approx(1009.75) and len(fn.raised) == 8
    assert info.value is fn.raised[-1]


def test_a_deadline_of_zero_is_one_try():
    clock = Clock()
    fn = failing(5)
    with pytest.raises(StoreUnavailable):
        backoff(fn, clock, deadline_seconds=0)
    assert len(fn.raised) == 1 and clock.pauses == []


def test_only_the_named_failures_are_retried():
    clock = Clock()
    fn = failing(3, exc_type=LeaseLost)
    with pytest.raises(LeaseLost) as info:
        backoff(fn, clock)
    assert info.value is fn.raised[0] and clock.pauses == []
    # A subclass of a named type is retried too (StoreFull is a StoreUnavailable)...
    assert backoff(failing(2, exc_type=StoreFull), clock) == "done"
    # ...unless a predicate says otherwise.
    fn = failing(2, exc_type=StoreFull)
    with pytest.raises(StoreFull):
        backoff(fn, clock, retry_on=lambda exc: type(exc) is StoreUnavailable)
    assert len(fn.raised) == 1


def test_a_failure_the_call_raises_later_that_is_not_named_stops_the_wait():
    clock = Clock()
    calls = []

    def fn():
        calls.append(1)
        raise (StoreUnavailable if len(calls) < 3 else KeyError)("x")
    with pytest.raises(KeyError):
        backoff(fn, clock)
    assert len(calls) == 3 and clock.pauses == [0.25, 0.5]


def test_on_retry_hears_of_each_failure_retried_and_not_of_the_last():
    clock = Clock()
    heard: list[BaseException] = []
    fn = failing(3)
    backoff(fn, clock, on_retry=heard.append)
    assert heard == fn.raised
    heard.clear()
    fn = failing(10_000)
    with pytest.raises(StoreUnavailable):
        backoff(fn, clock, on_retry=heard.append)
    assert heard == fn.raised[:-1]


def test_the_real_clock_and_sleep_by_default():
    t0 = time.monotonic()
    fn = failing(10_000)
    with pytest.raises(StoreUnavailable):
        call_with_backoff(fn, deadline_seconds=0.1, first_delay=0.01, max_delay=0.04, retry_on=(StoreUnavailable,))
    took = time.monotonic() - t0
    assert 0.1 <= took < 0.5 and len(fn.raised) >= 4
