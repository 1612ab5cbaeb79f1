"""The production store: Redis, through redis-py.

Layout under the agent's key prefix (several agents can share one Redis):

    {prefix}{key}              the value, a plain string (``redis-cli GET`` works)
    {prefix}{key}              or, for a log such as karma, a Redis list (RPUSH: O(1))
    {prefix}__meta__:{key}     the metadata of a value, JSON, with the value's TTL
    {prefix}__lock__:{name}    a lock: SET NX PX with an owner token
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from ..errors import MalformedValue, StoreUnavailable
from .base import KeyInfo, ListResult, Store, encode

META = "__meta__:"
LOCK = "__lock__:"
_INTERNAL = (META, LOCK)

# Compare-and-delete / compare-and-expire: only the owner may release or extend.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
_REFRESH = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end"


def redact_url(url: str) -> str:
    """The URL with its password (and user) replaced, safe to print."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def _guard(fn):
    """Turn connection failures into one operator-readable line naming the server."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"cannot reach Redis at {self.display_url}: {_reason(exc)}") from None
        except redis.AuthenticationError:
            raise StoreUnavailable(f"Redis at {self.display_url} refused the password") from None
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise MalformedValue(f"{args[0]!r} holds a different kind of value (a log is not a value)") from None
            if "NOAUTH" in str(exc):
                raise StoreUnavailable(f"Redis at {self.display_url} needs a password (put it in the URL)") from None
            raise
    return wrapper


class RedisStore(Store):
    def __init__(self, url: str, prefix: str | None = None, socket_timeout: float = 5.0,
                 client: redis.Redis | None = None):
        query = parse_qs(urlsplit(url).query)
        if prefix is None:
            prefix = query.get("prefix", [""])[0]
        clean = urlunsplit(urlsplit(url)._replace(query=""))
        self.prefix = prefix
        self.display_url = redact_url(url)
        try:
            # ``client`` lets fast unit tests hand in a fakeredis instance.
            self._r = client or redis.Redis.from_url(clean, decode_responses=True, socket_timeout=socket_timeout,
                                                     socket_connect_timeout=socket_timeout)
        except ValueError as exc:
            raise StoreUnavailable(f"bad Redis URL {self.display_url}: {exc}") from None
        self._release = self._r.register_script(_RELEASE)
        self._refresh = self._r.register_script(_REFRESH)

    def _k(self, key: str) -> str:
        return self.prefix + key

    @_guard
    def ping(self) -> None:
        self._r.ping()

    # --- values ---
    @_guard
    def get_text(self, key: str) -> str | None:
        return self._r.get(self._k(key))

    @_guard
    def get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        value, meta = self._r.mget(self._k(key), self._k(META + key))
        if value is None:
            return None, None
        return value, (json.loads(meta) if meta else None)

    @_guard
    def put(self, key: str, value: Any, metadata: dict | None = None, ttl: float | None = None) -> None:
        px = int(ttl * 1000) if ttl else None
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._k(key), encode(value), px=px)
        if metadata is not None:
            pipe.set(self._k(META + key), json.dumps(metadata), px=px)
        else:
            pipe.delete(self._k(META + key))
        pipe.execute()

    @_guard
    def delete(self, key: str) -> bool:
        # A log is deleted through delete_log, so a value delete never drops karma by accident.
        if self._r.type(self._k(key)) == "list":
            return False
        n, _ = self._r.pipeline(transaction=True).delete(self._k(key)).delete(self._k(META + key)).execute()
        return n > 0

    @_guard
    def incr(self, key: str, amount: int = 1) -> int:
        try:
            return self._r.incrby(self._k(key), amount)
        except redis.ResponseError as exc:
            if "not an integer" in str(exc):
                raise MalformedValue(f"value of {key!r} is not an integer") from None
            raise

    @_guard
    def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> ListResult:
        # SCAN is cursor-based and unordered; a page is sorted, list_all sorts the whole.
        scan_cursor = int(cursor) if cursor else 0
        names: list[str] = []
        n = len(self.prefix)
        pattern = _glob_escape(self._k(prefix)) + "*"
        while True:
            scan_cursor, batch = self._r.scan(scan_cursor, match=pattern, count=max(limit, 100))
            names.extend(b for b in batch if not b[n:].startswith(_INTERNAL))
            if scan_cursor == 0 or len(names) >= limit:
                break
        names.sort()
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            pipe.type(name)
            pipe.get(self.prefix + META + name[n:])
            pipe.pttl(name)
        answers = pipe.execute() if names else []
        keys = []
        now = time.time()
        for i, name in enumerate(names):
            kind, meta, pttl = answers[3 * i: 3 * i + 3]
            if kind == "none":  # expired or deleted between SCAN and now
                continue
            is_log = kind == "list"
            keys.append(KeyInfo(name=name[n:], metadata=None if is_log or not meta else json.loads(meta),
                                expiration=now + pttl / 1000 if pttl and pttl > 0 else None, is_log=is_log))
        return ListResult(keys=keys, cursor=str(scan_cursor) if scan_cursor else None)

    # --- logs ---
    @_guard
    def append(self, log_key: str, entry: Any) -> int:
        return self._r.rpush(self._k(log_key), encode(entry))

    @_guard
    def read_log(self, log_key: str, start: int = 0, stop: int | None = None) -> list[str]:
        # Python slice semantics on top of LRANGE's inclusive end.
        if stop is None:
            end = -1
        elif stop == 0 and start >= 0:
            return []
        else:
            end = stop - 1
        if start < 0 and stop is not None and stop >= 0:
            n = self._r.llen(self._k(log_key))
            start, stop, _ = slice(start, stop).indices(n)
            if stop <= start:
                return []
            end = stop - 1
        return self._r.lrange(self._k(log_key), start, end)

    @_guard
    def log_length(self, log_key: str) -> int:
        return self._r.llen(self._k(log_key))

    @_guard
    def delete_log(self, log_key: str) -> bool:
        if self._r.type(self._k(log_key)) != "list":
            return False
        return self._r.delete(self._k(log_key)) > 0

    @_guard
    def trim_log(self, log_key: str, keep: int) -> None:
        self._r.ltrim(self._k(log_key), -keep, -1) if keep > 0 else self._r.delete(self._k(log_key))

    # --- locks ---
    @_guard
    def acquire_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(self._r.set(self._k(LOCK + name), owner, nx=True, px=int(ttl_ms)))

    @_guard
    def release_lock(self, name: str, owner: str) -> bool:
        return bool(self._release(keys=[self._k(LOCK + name)], args=[owner]))

    @_guard
    def refresh_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(self._refresh(keys=[self._k(LOCK + name)], args=[owner, int(ttl_ms)]))

    @_guard
    def lock_owner(self, name: str) -> str | None:
        return self._r.get(self._k(LOCK + name))

    # --- housekeeping ---
    @_guard
    def usage(self) -> dict:
        try:
            used = self._r.info("memory").get("used_memory")
        except redis.ResponseError:  # servers (and fakes) without INFO
            used = None
        if self.prefix:
            n = len(self.prefix)
            keys = sum(1 for k in self._r.scan_iter(match=_glob_escape(self.prefix) + "*", count=1000)
                       if not k[n:].startswith(_INTERNAL))
        else:
            keys = self._r.dbsize()
        # bytes: the whole server's memory; per-agent sizes would cost a scan of every log.
        return {"backend": "redis", "keys": keys, "bytes": used}

    def close(self) -> None:
        try:
            self._r.close()
        except redis.RedisError:
            pass


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def _reason(exc: BaseException) -> str:
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return msg
