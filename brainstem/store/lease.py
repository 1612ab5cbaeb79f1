"""The wake lease: one session per agent at a time, across processes and hosts.

The lease is a name the store holds for one owner (an owner token, ``host:pid:nonce``, with a
short time to live: the lease period, ``BRAINSTEM_LEASE_SECONDS``, 30 s by
default) that a heartbeat thread renews every third of a period while the
session runs. When a host dies its leases run out within one period, and
another daemon's wake takes the agent over (the dead session is then recorded
as ``crashed``).

A renewal that fails, or finds another owner, loses the lease: the session
stops at its next step or LLM call and writes nothing: its view of the store
(:class:`~brainstem.store.fenced.FencedStore`) has the store refuse each write unless the
lease is still the session's, in the same atomic step as the write (its fencing). A store that
cannot be reached is retried until a whole period has passed since the last
renewal; after that another host may hold the lease, so it is lost.

A holder on this host that is no longer running is reclaimed at once; a live
holder never is, even one in this same process (the daemon runs several
agents in threads): tokens held by wakes running here are kept in
``_LIVE_TOKENS``.
"""

from __future__ import annotations

import os
import threading
import time

from brainstem.core import environment, keys
from brainstem.core.errors import BrainstemError, LeaseHeld
from brainstem.store.base import Store

# Lease tokens held by wakes running in this process (the daemon runs several agents in threads).
_LIVE_TOKENS: set[str] = set()
_LIVE_LOCK = threading.Lock()


_HOST: str | None = None  # the operator's BRAINSTEM_HOSTNAME as the settings read it (an env file included)


def use_host_name(name: str | None) -> None:
    global _HOST
    _HOST = (name or "").strip() or None


def host_name() -> str:
    """This host's identity in lease owners and breadcrumbs: ``BRAINSTEM_HOSTNAME``, else the host name
    (override it where several hosts share one name, e.g. containers on the host network)."""
    return _HOST or environment.hostname()


def owner_token(session_hint: str) -> str:
    return f"{host_name()}:{os.getpid()}:{session_hint}"


def holder_is_dead(owner: str) -> bool:
    """True when the lease holder ran on this host and is gone: its process has exited, or (our own
    process) no wake here holds that token any more (an earlier wake could not release it because
    the store went away). A live holder is never reclaimed."""
    host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != host_name() or not pid_text.isdigit():
        return False
    if int(pid_text) == os.getpid():
        with _LIVE_LOCK:
            return owner not in _LIVE_TOKENS
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def process_identity(pid: int) -> str | None:
    """Who process ``pid`` on this host is (boot and start time), so a reused pid is not taken for the
    same process; None when there is no such process (or no /proc to tell)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return f"{boot}:{fields[19]}" if len(fields) > 19 else None


def session_alive_here(breadcrumb: dict) -> bool:
    """Whether the session a breadcrumb names is still running on this host: its process is alive (the
    same process, not a reused pid) and, in this very process, its lease token still held. It answers
    without the store's clocks, so a wake whose clock runs ahead never takes a live session for dead."""
    pid = breadcrumb.get("pid")
    if breadcrumb.get("host") != host_name() or not isinstance(pid, int) or isinstance(pid, bool):
        return False
    if pid == os.getpid():
        with _LIVE_LOCK:
            return breadcrumb.get("lease") in _LIVE_TOKENS
    identity = process_identity(pid)
    if identity is None:
        return False
    recorded = breadcrumb.get("proc")
    return recorded is None or recorded == identity


def acquire_wake_lease(store: Store, token: str, ttl_ms: int) -> None:
    if not acquire(store, keys.WAKE_LEASE, token, ttl_ms):
        holder = store.lease_owner(keys.WAKE_LEASE)
        raise LeaseHeld(f"another wake is running for this agent (lease held by {holder or 'unknown'}); "
                        "not waking twice")


def acquire(store: Store, name: str, token: str, ttl_ms: int) -> bool:
    """Take the lease ``name`` for ``token`` (a holder on this host that is gone is reclaimed); True when
    taken. While taken, ``token`` is this process's live one: never mistaken for a dead holder here."""
    with _LIVE_LOCK:
        _LIVE_TOKENS.add(token)  # ours from before the store has it: never mistaken for a dead holder
    try:
        if store.acquire_lease(name, token, ttl_ms):
            return True
        holder = store.lease_owner(name)
        if holder and holder_is_dead(holder) and store.release_lease(name, holder):
            if store.acquire_lease(name, token, ttl_ms):
                return True
    except BaseException:
        forget_token(token)
        raise
    forget_token(token)
    return False


def held_alive(store: Store, name: str) -> str | None:
    """The holder of the lease ``name`` when one holds it that is not known to be gone, else None."""
    holder = store.lease_owner(name)
    return holder if holder and not holder_is_dead(holder) else None


def forget_token(token: str) -> None:
    with _LIVE_LOCK:
        _LIVE_TOKENS.discard(token)


class Lease:
    """A held lease (the wake lease unless ``name`` says which), renewed by a heartbeat thread every third
    of ``period`` seconds.

    ``lost`` is set (``reason`` says why, ``cause`` is ``taken_over``, ``expired`` or
    ``store_unavailable``) when a renewal finds the lease another's or gone, or could not reach the
    store for a whole period. ``on_lost(lease)`` is called once, from the heartbeat thread.
    """

    def __init__(self, store: Store, token: str, period: float, on_lost=None, name: str = keys.WAKE_LEASE):
        self.store, self.token, self.period, self.name = store, token, period, name
        self.lost = threading.Event()
        self.reason: str | None = None
        self.cause: str | None = None
        self.renewals = 0
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Lease:
        self._thread = threading.Thread(target=self._beat, name="brainstem-lease", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(1.0, self.period))

    def _beat(self) -> None:
        ttl_ms = int(self.period * 1000)
        last_ok = time.monotonic()
        while not self._stop.wait(self.period / 3):
            try:
                if self.store.renew_lease(self.name, self.token, ttl_ms):
                    last_ok = time.monotonic()
                    self.renewals += 1
                    continue
            except BrainstemError as exc:  # the store is away: keep trying while the lease may still be ours
                if time.monotonic() - last_ok < self.period:
                    continue
                self._lose("store_unavailable", f"could not renew it for {self.period:g}s (the lease period): {exc}")
                return
            if self._stop.is_set():  # released by the wake itself between the wait and the renewal
                return
            holder = None
            try:
                holder = self.store.lease_owner(self.name)
            except BrainstemError:
                pass
            if holder:
                self._lose("taken_over", f"another wake holds it now ({holder})")
            else:
                self._lose("expired", "it ran out before it could be renewed")
            return

    def _lose(self, cause: str, reason: str) -> None:
        self.cause, self.reason = cause, reason
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost(self)
