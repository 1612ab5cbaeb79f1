"""Why a session stops before its plan is done, from outside its budget: one exception and one table.

A session is stopped from outside (the daemon or a signal cancels it), by its lease (another wake may
hold the agent now), by its store (gone, or refusing a fenced write) or by its budget. Each is a
:class:`SessionStopped` with a ``reason``, and :data:`OUTCOMES` says how the session ends for each.
:class:`Stopping` holds the two signals a session polls at each step and LLM call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from brainstem.core import outcomes
from brainstem.core.errors import LeaseLost, StoreUnavailable
from brainstem.state.budget import BudgetExceeded

INTERRUPTED = "interrupted"  # cancelled from outside: the daemon stopping, or SIGTERM/SIGINT to a wake
LEASE_LOST = "lease_lost"  # the lease heartbeat saw another wake may hold the agent: the session stops itself
FENCED = "fenced"  # the store refused a fenced write: the lease is gone, and only that is recorded
STORE_UNAVAILABLE = "store_unavailable"  # the store went away mid-session
BUDGET = "budget"  # a cost, step or time limit, met outside a step (before the plan)

# How the session ends, by reason; None: its outcome stands (the end records only the lost lease).
OUTCOMES: dict[str, str | None] = {
    INTERRUPTED: outcomes.INTERRUPTED,
    LEASE_LOST: outcomes.INTERRUPTED,
    FENCED: None,
    STORE_UNAVAILABLE: outcomes.STORE_UNAVAILABLE,
    BUDGET: outcomes.BUDGET_EXHAUSTED,
}


class SessionStopped(Exception):
    """The session must stop now, for ``reason`` (a key of :data:`OUTCOMES`)."""

    # What a ``budget_exceeded`` or ``reflect_call_failed`` entry names a stop from outside (their
    # ``limit`` field predates this exception).
    limit = "interrupted"

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Stopping:
    """The signals that stop a session at its next step or LLM call."""
    cancel: threading.Event = field(default_factory=threading.Event)  # set by the daemon or a signal
    lost: threading.Event = field(default_factory=threading.Event)  # set by the lease heartbeat

    def check(self) -> None:
        """Raise :class:`SessionStopped` when the session must stop."""
        if self.cancel.is_set():
            raise SessionStopped(INTERRUPTED, "the runtime is shutting down")
        if self.lost.is_set():
            raise SessionStopped(LEASE_LOST, "this session's wake lease was lost")


def stop_of(exc: SessionStopped | BudgetExceeded | LeaseLost | StoreUnavailable) -> SessionStopped:
    """The stop an exception that ended a session means."""
    if isinstance(exc, SessionStopped):
        return exc
    if isinstance(exc, LeaseLost):
        return SessionStopped(FENCED, str(exc))
    return SessionStopped(STORE_UNAVAILABLE if isinstance(exc, StoreUnavailable) else BUDGET, str(exc))
