"""Redis's failures as the store's: one operator-readable line naming the server, and a lost
connection waited out for a while.

Every command of :class:`~brainstem.store.redis.store.RedisStore` goes through :func:`guard`. A
lost connection (a restart, a failover, a cluster answering CLUSTERDOWN / TRYAGAIN for a moment)
is retried with growing pauses for up to the store's ``retry_seconds``, so a restart or a failover
of a few seconds is survived; a refused password, a read-only replica, a full server and a refused
ACL are not retried.
"""

from __future__ import annotations

import functools

import redis

from brainstem.core.backoff import call_with_backoff
from brainstem.core.errors import (
    BrainstemError,
    ConfigError,
    MalformedValue,
    StoreFull,
    StoreReadOnly,
    StoreUnavailable,
)
from brainstem.store.redis.client import reason
from brainstem.store.redis.scripts import REGISTRY

_LOST = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
         redis.exceptions.RedisClusterException)


def _lost(exc: BaseException) -> bool:
    """The connection is gone for now (a password refused is a ConnectionError too, and is not)."""
    return isinstance(exc, _LOST) and not isinstance(exc, redis.AuthenticationError)


def _client_broken(exc: BaseException) -> bool:
    """Mid-failover the client breaks in ways no list of types covers ('NoneType' object has no attribute
    'readline', I/O on a closed file, a cluster error without a node...): anything that is not an answer
    of the server's nor one of ours."""
    return (isinstance(exc, Exception) and not isinstance(exc, _LOST)
            and not isinstance(exc, (redis.AuthenticationError, redis.ResponseError, UnicodeDecodeError,
                                     BrainstemError)))


def _transient(exc: BaseException) -> bool:
    return _lost(exc) or _client_broken(exc)


def guard(fn=None, *, retry: bool = True):
    """Decorate a store command: failures become one line naming the server (see the module)."""
    if fn is None:
        return lambda f: guard(f, retry=retry)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        def attempt():
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if _client_broken(exc):
                    # A client shared by threads can stay broken after the cluster has healed: rebuilt,
                    # and retried as for a lost connection.
                    self._rebuild()
                raise

        # After a command has used up its retries, the next ones try once until one succeeds: a server
        # that stays down costs one wait, not one per command.
        try:
            out = call_with_backoff(attempt, deadline_seconds=self.retry_seconds if retry and not self._down else 0.0,
                                    first_delay=0.05, max_delay=1.0, retry_on=_transient)
        except Exception as exc:
            if _transient(exc):
                self._down = True
            error = store_error(exc, self.display_url, fn.__name__, args)
            if error is None:
                raise
            raise error from None
        self._down = False
        return out
    return wrapper


def store_error(exc: Exception, url: str, command: str, args: tuple) -> Exception | None:
    """The one-line store error for a failure of ``command`` on the server at ``url``; None: raise it as it is."""
    if isinstance(exc, redis.AuthenticationError):
        return StoreUnavailable(_auth_message(url, exc))
    if _lost(exc):
        return StoreUnavailable(f"cannot reach Redis at {url}: {reason(exc)}")
    if isinstance(exc, redis.ResponseError):
        return _refused(exc, url, command, args)
    if isinstance(exc, UnicodeDecodeError):
        return MalformedValue(f"Redis at {url} answered {command.lstrip('_')} with bytes that are not UTF-8 text "
                              "(a key or value written around Brainstem)")
    if _client_broken(exc):
        return StoreUnavailable(f"cannot reach Redis at {url}: the client failed ({type(exc).__name__})")
    return None


def _refused(exc: redis.ResponseError, url: str, command: str, args: tuple) -> Exception | None:
    """The server's answer refusing a command, as the store's error (None: not one the store names)."""
    text = str(exc)
    first = text.splitlines()[0] if text else type(exc).__name__
    if "WRONGTYPE" in text:
        return MalformedValue(f"{args[0]!r} holds a different kind of value (a log is not a value)")
    if "NOAUTH" in text or "WRONGPASS" in text:
        return StoreUnavailable(_auth_message(url, exc))
    if isinstance(exc, redis.exceptions.ReadOnlyError) or text.startswith("READONLY"):
        return StoreReadOnly(f"Redis at {url} is read-only (a replica?) and refused a write: {first}")
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
        return StoreFull(f"the store is full: Redis at {url} refused a write: {first}")
    if text.startswith("MISCONF"):
        return StoreFull(f"the store's disk is full or not writable: Redis at {url} cannot persist and refuses "
                         f"writes: {first}")
    if isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        what = command.lstrip("_").replace("_", " ")
        return ConfigError(f"Redis at {url} refused {what} for the ACL user: {first} (an agent's user needs "
                           f"~NAME:* and read access to {REGISTRY}, where the operator registers NAME)")
    if "unauthenticated" in text:  # a large command sent after the server began asking for a password
        return StoreUnavailable(_auth_message(url, "NOAUTH"))
    return None


def _auth_message(url: str, exc: BaseException | str) -> str:
    text = str(exc)
    if "NOAUTH" in text or "Authentication required" in text:
        return f"Redis at {url} needs a password (put it in the URL: redis://:PASSWORD@host:port/db)"
    return f"Redis at {url} refused the password (check the one in the URL)"
