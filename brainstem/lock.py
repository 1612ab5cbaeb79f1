"""The wake lock: one session per agent at a time, across processes and hosts.

The lock lives in the store (an owner token with a time to live). A holder on
this host that is no longer running is reclaimed at once; a live holder never
is, even one in this same process (the daemon runs several agents in threads):
tokens held by wakes running here are kept in ``_LIVE_TOKENS``. Elsewhere a
dead holder's lock runs out with its time to live, which is about twice the
session's maximum duration.
"""

from __future__ import annotations

import os
import socket
import threading

from . import keys
from .errors import LockHeld
from .kv.base import Store

# Lock tokens held by wakes running in this process (the daemon runs several agents in threads).
_LIVE_TOKENS: set[str] = set()
_LIVE_LOCK = threading.Lock()


def owner_token(session_hint: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{session_hint}"


def holder_is_dead(owner: str) -> bool:
    """True when the lock holder ran on this host and is gone: its process has exited, or (our own
    process) no wake here holds that token any more (an earlier wake could not release it because
    the store went away). A live holder is never reclaimed."""
    host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid_text.isdigit():
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


def acquire_wake_lock(store: Store, token: str, ttl_ms: int) -> None:
    with _LIVE_LOCK:
        _LIVE_TOKENS.add(token)  # ours from before the store has it: never mistaken for a dead holder
    try:
        if store.acquire_lock(keys.WAKE_LOCK, token, ttl_ms):
            return
        holder = store.lock_owner(keys.WAKE_LOCK)
        if holder and holder_is_dead(holder) and store.release_lock(keys.WAKE_LOCK, holder):
            if store.acquire_lock(keys.WAKE_LOCK, token, ttl_ms):
                return
    except BaseException:
        forget_token(token)
        raise
    forget_token(token)
    raise LockHeld(f"another wake is running for this agent (lock held by {holder or 'unknown'}); not waking twice")


def forget_token(token: str) -> None:
    with _LIVE_LOCK:
        _LIVE_TOKENS.discard(token)


def lock_ttl(max_duration: float) -> int:
    """A dead holder blocks for at most about twice the session's duration."""
    return int(2 * max_duration * 1000) + 60_000
