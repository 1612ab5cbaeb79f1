"""SIGTERM and SIGINT to a one-shot ``brainstem wake``: the session ends as ``interrupted``.

systemd stops a unit with SIGTERM and an operator presses Ctrl-C: neither is a
crash, so neither may count towards auto-restore. :class:`SignalGuard` turns
the signal into a cancelled budget (the session stops at its next step or
call) and, while the session's own work runs, into :class:`WakeInterrupted`
in the main thread, so a call blocked on the network ends now. While the
runtime records the end (:func:`interruptible` off) the signal only cancels.
"""

from __future__ import annotations

import signal
import threading


class WakeInterrupted(BaseException):
    """SIGTERM/SIGINT reached a ``brainstem wake`` mid-session: the session is recorded as interrupted."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """SIGTERM and SIGINT for a one-shot ``brainstem wake``, as the daemon handles them.

    The first signal sets ``cancel`` (the budget's: the session stops at its next step or LLM call)
    and, while the session's work is running, raises :class:`WakeInterrupted` in the main thread
    so a call blocked on the network ends now, not when it times out. While the runtime records
    the end of the session (or takes or releases the lease) nothing is raised: the signal only
    sets ``cancel``, and the wake finishes its bookkeeping, releases the lease and returns.
    ``signum`` is the signal received (None: none), for the exit status 128 + signum.
    """

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.signum: int | None = None
        self.interruptible = False
        self._previous: dict = {}

    def _handle(self, signum, _frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        self.cancel.set()
        if first and self.interruptible:
            self.interruptible = False
            raise WakeInterrupted(signum)

    def __enter__(self) -> SignalGuard:
        global _GUARD
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        _GUARD = self
        return self

    def __exit__(self, *exc) -> None:
        global _GUARD
        _GUARD = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


_GUARD: SignalGuard | None = None


def interruptible(on: bool) -> None:
    """Mark the session's work (on) or the runtime's bookkeeping (off) for the signal guard, if any."""
    guard = _GUARD
    if guard is not None and threading.current_thread() is threading.main_thread():
        guard.interruptible = on and guard.signum is None


def stop_reason() -> str:
    guard = _GUARD
    if guard is not None and guard.signum is not None:
        return f"received {signal.Signals(guard.signum).name}"
    return "the runtime is shutting down"
