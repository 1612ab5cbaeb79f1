"""The production store: Redis, through redis-py.

Several agents can share one Redis, each under its own key prefix; how the keys
are laid out, and the Lua scripts that keep the leases, the fenced writes and
today's spend atomic, are in :mod:`brainstem.store.redis.scripts`; reaching the
server (URLs, clients) is :mod:`brainstem.store.redis.client`, and its failures
become the store's in :mod:`brainstem.store.redis.errors`.

The default agent's prefix is empty; its view refuses keys under a registered
``NAME:`` (see :mod:`brainstem.core.names`). In production give each agent its
own Redis ACL user restricted to ``~NAME:*`` (and read access to ``__agents__``).

On a Redis Cluster (``redis+cluster://host:port,host:port/``, or
``rediss+cluster://`` with TLS) an agent's keys must share one hash slot, so
that its Lua scripts (the lease, the fenced writes) and MULTI writes stay
legal: there the prefix is a hash tag, ``{NAME}:`` for a named agent and
``{__default__}:`` for the default one (``{alice}:soul``,
``{alice}:__lock__:wake``). The confinement of agents is the same: it is
decided on the logical key, before this physical prefix is added.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from typing import Any
from urllib.parse import parse_qs

import redis

from brainstem.core import names
from brainstem.core.errors import ConfigError, MalformedValue, StoreUnavailable
from brainstem.core.keys import DAILY_COST
from brainstem.store.base import (
    Fence,
    KeyInfo,
    ListResult,
    Store,
    decode_log_entry,
    decode_metadata,
    decode_text,
    lease_lost,
    listed_metadata,
    shown_url,
)
from brainstem.store.redis import scripts as lua
from brainstem.store.redis.client import is_cluster, new_client, redact_url
from brainstem.store.redis.errors import guard
from brainstem.store.redis.scripts import DEFAULT_TAG, DUE_SETS, HOLDS, INTERNAL, LEASE, META, REGISTRY

RETRY_SECONDS = 5.0  # how long a command keeps retrying a lost connection (a restart, a failover)


class RedisStore(Store):
    _down = False  # the last command gave up on the connection: do not wait again until one succeeds
    cluster = False  # a Redis Cluster: every key of the view carries its agent's hash tag

    def __init__(self, url: str, prefix: str | None = None, socket_timeout: float = 5.0,
                 client: redis.Redis | None = None, retry_seconds: float | None = None):
        query = parse_qs(url.partition("?")[2])
        if prefix is None:
            prefix = query.get("prefix", [""])[0]
        self.retry_seconds = RETRY_SECONDS if retry_seconds is None else max(0.0, retry_seconds)
        self._set_prefix(prefix, "agent prefix")
        self.display_url = shown_url(redact_url(url), self.prefix)
        self.cluster = is_cluster(url)
        self._url, self._socket_timeout, self._handed = url, socket_timeout, client is not None
        self._rebuilding = threading.Lock()
        self._connect(client)

    def _connect(self, client: redis.Redis | None = None) -> None:
        # Fast unit tests hand in a fakeredis instance. Any: redis-py types every reply of its sync client as
        # Awaitable | Any (one signature for sync and async clients), which no caller can use; Any says the
        # same without the false Awaitable, and covers the cluster client, a second class.
        self._r: Any = client if client is not None else new_client(self._url, self._socket_timeout)
        self._release = self._r.register_script(lua.RELEASE)
        self._renew = self._r.register_script(lua.RENEW)
        self._append_again = self._r.register_script(lua.APPEND_AGAIN)
        self._fenced_script = self._r.register_script(lua.FENCED)
        self._reserve_script = self._r.register_script(lua.RESERVE)
        self._settle_script = self._r.register_script(lua.SETTLE)
        self._daily_script = self._r.register_script(lua.DAILY)
        self._set_due_script = self._r.register_script(lua.SET_DUE)

    def _rebuild(self) -> None:
        """A new client in place of one that may be broken (a handed-in one is kept)."""
        if self._handed or not self._rebuilding.acquire(blocking=False):
            return  # another thread is rebuilding it: its new client serves this one's retry too
        try:
            old = self._r
            try:
                self._connect()
            except StoreUnavailable:
                return  # not reachable yet: the retry that follows says so
            try:
                old.close()
            except Exception:  # noqa: BLE001 - a broken client may fail to close too
                pass
        finally:
            self._rebuilding.release()

    def _space(self, prefix: str | None = None) -> str:
        """The physical prefix of the agent with the logical ``prefix`` (default: this view's)."""
        prefix = self.prefix if prefix is None else prefix
        if not self.cluster:
            return prefix
        return "{" + (prefix[:-1] or DEFAULT_TAG) + "}:"

    def _k(self, key: str) -> str:
        return self._space() + key

    def _scan(self, cursor: int, pattern: str, count: int):
        """One SCAN step over the keys matching ``pattern`` (raw bytes). On a cluster, the node that holds
        this view's hash slot: every key of the view is there."""
        if not self.cluster:
            return self._raw("SCAN", cursor, "MATCH", pattern, "COUNT", count)
        node = self._r.get_node_from_key(self._space())  # the slot's current primary, after any failover
        return node.redis_connection.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", count,
                                                     NEVER_DECODE=True)

    @guard(retry=False)  # opening fails fast: nothing has been started that a retry would save
    def ping(self) -> None:
        self._r.ping()

    def _raw(self, *command):
        """A command whose reply stays bytes: values are decoded by :func:`decode_text`, naming the key."""
        return self._r.execute_command(*command, NEVER_DECODE=True)

    # --- the registry of agent names ---
    @guard
    def _registry_has(self, name: str) -> bool:
        return bool(self._registry_call(self._r.sismember, REGISTRY, name))

    @guard
    def _registry_names(self) -> set[str]:
        return set(self._registry_call(self._r.smembers, REGISTRY))

    @guard
    def _registry_add(self, name: str, adopt: bool) -> None:
        if self._registry_call(self._r.sismember, REGISTRY, name):
            return
        if not adopt:
            # Keys already under NAME: are the default agent's, unless a log is among them: only
            # NAME's own runtime appends logs there (an agent from before names were registered).
            clash = None
            batch: list[str] = []
            own_lease = self._space("") + name + ":" + LEASE  # its own wake, taken before it was registered
            for k in self._scan_all(_glob_escape(self._space("") + name + ":") + "*"):
                batch.append(k)
                if len(batch) >= 500:
                    clash, found_log = self._classify(batch, clash, own_lease)
                    if found_log:
                        break
                    batch = []
            else:
                clash, found_log = self._classify(batch, clash, own_lease)
            if clash is not None and not found_log and self._registry_call(self._r.sismember, REGISTRY, name):
                return  # registered meantime by another process of the same agent: those keys are its own
            if clash is not None and not found_log:
                raise ConfigError(f"cannot register agent {name!r} in {self.display_url}: the default agent already "
                                  f"holds keys under {name + ':'!r} (e.g. {clash!r}); delete or rename them, or choose "
                                  f"another name; if they are {name}'s own from before agents were registered: "
                                  f"{names.adopt_hint(name)}")
        self._registry_call(self._r.sadd, REGISTRY, name)

    @guard
    def _registry_remove(self, name: str) -> int:
        # SCAN is not atomic with the SREM: the operator removes a name whose agent is not running (a
        # running one holds its wake lease, which is counted here, as are metadata and today's spend).
        due = {self._space(name + ":") + own for own, _ in DUE_SETS.values()}  # hints, not what the agent holds
        held = sum(1 for k in self._scan_all(_glob_escape(self._space(name + ":")) + "*") if k not in due)
        if held == 0:
            self._registry_call(self._r.srem, REGISTRY, name)
            for own, across in DUE_SETS.values():
                self._r.delete(self._space(name + ":") + own)
                self._r.zrem(across, name)
        return held

    def _scan_all(self, pattern: str):
        cursor = 0
        while True:
            cursor, batch = self._scan(cursor, pattern, 1000)
            for raw in batch:
                yield raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
            if int(cursor) == 0:
                return

    def _classify(self, batch: list[str], clash: str | None, exempt: str) -> tuple[str | None, bool]:
        """(the first key of the batch that clashes, unless one clashed before; whether a log is among them).
        Each key is judged on its own: a lease key under ``exempt`` exempts only itself."""
        if not batch:
            return clash, False
        pipe = self._r.pipeline(transaction=False)
        for k in batch:
            pipe.type(k)
        kinds = pipe.execute()
        return clash or min((k for k in batch if not k.startswith(exempt)), default=None), "list" in kinds

    def _registry_call(self, fn, *args):
        try:
            return fn(*args)
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise MalformedValue(f"the agent registry {REGISTRY!r} in {self.display_url} is not a set; "
                                     "something outside Brainstem overwrote it") from None
            raise

    # --- values ---
    @guard
    def _get_text(self, key: str) -> str | None:
        return decode_text(key, self._raw("GET", self._k(key)))

    @guard
    def _get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        value, meta = self._raw("MGET", self._k(key), self._k(META + key))
        if value is None:
            return None, None
        return decode_text(key, value), decode_metadata(key, meta)

    def _fenced(self, fence: Fence, op: str, key: str, value: str = "", px: int | None = None,
                meta: str = "") -> int:
        lease, owner = fence
        out = int(self._fenced_script(keys=[self._k(LEASE + lease), self._k(key), self._k(META + key)],
                                      args=[owner, op, value, px or 0, meta]))
        if out == -1:
            raise lease_lost(key)
        return out

    @guard
    def _put(self, key: str, text: str, metadata: dict | None, ttl: float | None, fence: Fence | None) -> None:
        px = int(ttl * 1000) if ttl else None
        if fence is not None:
            self._fenced(fence, "put", key, text, px, json.dumps(metadata) if metadata is not None else "")
            return
        pipe = self._r.pipeline(transaction=True)
        pipe.set(self._k(key), text, px=px)
        if metadata is not None:
            pipe.set(self._k(META + key), json.dumps(metadata), px=px)
        else:
            pipe.delete(self._k(META + key))
        pipe.execute()

    @guard
    def _delete(self, key: str, fence: Fence | None) -> bool:
        # A log is deleted through delete_log, so a value delete never drops karma by accident.
        if fence is not None:
            return self._fenced(fence, "del", key) > 0
        if self._r.type(self._k(key)) == "list":
            return False
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._k(key))
        pipe.delete(self._k(META + key))
        n, _ = pipe.execute()
        return n > 0

    @guard
    def _incr(self, key: str, amount: int, fence: Fence | None) -> int:
        try:
            if fence is not None:
                return self._fenced(fence, "incr", key, str(int(amount)))
            return self._r.incrby(self._k(key), amount)
        except redis.ResponseError as exc:
            if "not an integer" in str(exc):
                raise MalformedValue(f"value of {key!r} is not an integer") from None
            raise

    @guard
    def _list(self, prefix: str, limit: int, cursor: str | None) -> ListResult:
        # SCAN is cursor-based and unordered; a page is sorted, list_all sorts the whole.
        scan_cursor = int(cursor) if cursor else 0
        names: list[str] = []
        n = len(self._space())
        pattern = _glob_escape(self._k(prefix)) + "*"
        while True:
            scan_cursor, batch = self._scan(scan_cursor, pattern, max(limit, 100))
            scan_cursor = int(scan_cursor)
            for raw in batch:
                try:
                    b = raw.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # a key name that is not text: no command here could name it
                if not b[n:].startswith(INTERNAL) and b != REGISTRY:
                    names.append(b)
            if scan_cursor == 0 or len(names) >= limit:
                break
        names.sort()
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            pipe.type(name)
            pipe.execute_command("GET", self._k(META + name[n:]), NEVER_DECODE=True)
            pipe.pttl(name)
        answers = pipe.execute() if names else []
        keys = []
        now = time.time()
        for i, name in enumerate(names):
            kind, meta, pttl = answers[3 * i: 3 * i + 3]
            if kind == "none":  # expired or deleted between SCAN and now
                continue
            is_log = kind == "list"
            keys.append(KeyInfo(name=name[n:], metadata=None if is_log else listed_metadata(name[n:], meta),
                                expiration=now + pttl / 1000 if pttl and pttl > 0 else None, is_log=is_log))
        return ListResult(keys=keys, cursor=str(scan_cursor) if scan_cursor else None)

    # --- logs ---
    def _append(self, log_key: str, text: str, fence: Fence | None) -> int:
        return self._rpush(log_key, text, fence, [0])

    @guard
    def _rpush(self, log_key: str, text: str, fence: Fence | None, tries: builtins.list[int]) -> int:
        # Retried after a lost connection, an entry is pushed only if it is not already the last one:
        # a karma entry (an llm_call and its cost) is never recorded twice.
        tries[0] += 1
        if fence is not None:
            return self._fenced(fence, "append" if tries[0] == 1 else "append_again", log_key, text)
        key = self._k(log_key)
        if tries[0] == 1:
            return self._r.rpush(key, text)
        return int(self._append_again(keys=[key], args=[text]))

    @guard
    def _read_log(self, log_key: str, start: int, stop: int | None) -> builtins.list[str]:
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
        return [decode_log_entry(e) for e in self._raw("LRANGE", self._k(log_key), start, end)]

    @guard
    def _log_length(self, log_key: str) -> int:
        return self._r.llen(self._k(log_key))

    @guard
    def _delete_log(self, log_key: str, fence: Fence | None) -> bool:
        if fence is not None:
            return self._fenced(fence, "dellog", log_key) > 0
        if self._r.type(self._k(log_key)) != "list":
            return False
        return self._r.delete(self._k(log_key)) > 0

    @guard
    def _trim_log(self, log_key: str, keep: int, fence: Fence | None) -> None:
        if fence is not None:
            self._fenced(fence, "trim", log_key, str(max(0, int(keep))))
            return
        self._r.ltrim(self._k(log_key), -keep, -1) if keep > 0 else self._r.delete(self._k(log_key))

    # --- leases ---
    @guard
    def _acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(self._r.set(self._k(LEASE + name), owner, nx=True, px=int(ttl_ms)))

    @guard
    def _release_lease(self, name: str, owner: str) -> bool:
        return bool(self._release(keys=[self._k(LEASE + name)], args=[owner]))

    @guard
    def _renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        return bool(self._renew(keys=[self._k(LEASE + name)], args=[owner, int(ttl_ms)]))

    @guard
    def _lease_owner(self, name: str) -> str | None:
        return self._r.get(self._k(LEASE + name))

    # --- the due index ---
    @guard
    def _due_at(self, key: str, index: str) -> float | None:
        return self._r.zscore(self._k(DUE_SETS[index][0]), key)

    _due_across = True  # this client may write the index across agents (an agent's own ACL user may not)

    @guard
    def _set_due(self, key: str, at: float | None, index: str) -> None:
        agent = self.prefix[:-1]
        score = "" if at is None else repr(float(at))
        own, across = self._k(DUE_SETS[index][0]), DUE_SETS[index][1]
        if self.cluster or not self._due_across:
            first = self._set_due_script(keys=[own], args=[key, score, agent])
            if self.cluster and first:  # the index across agents is another slot's: a second step (a hint)
                self._r.zadd(across, {agent: float(first)})
            elif self.cluster:
                self._r.zrem(across, agent)
            return
        try:
            self._set_due_script(keys=[own, across], args=[key, score, agent])
        except redis.exceptions.NoPermissionError:
            self._due_across = False  # a user confined to its agent's keys: its own index only (its own daemon)
            self._set_due_script(keys=[own], args=[key, score, agent])

    @guard
    def _due_range(self, until: float, limit: int, index: str) -> builtins.list[tuple[str, float]]:
        return [(k, float(t)) for k, t in self._r.zrangebyscore(self._k(DUE_SETS[index][0]), "-inf", _score(until),
                                                                 start=0, num=limit, withscores=True)]

    @guard
    def _due_agents(self, until: float, index: str) -> builtins.list[tuple[str, float]]:
        return [(a, float(t)) for a, t in self._r.zrangebyscore(DUE_SETS[index][1], "-inf", _score(until),
                                                                 withscores=True)]

    # --- today's spend: one Lua script each, atomic on the server (a cluster: one slot, the agent's) ---
    def _spend_keys(self) -> builtins.list[str]:
        return [self._k(DAILY_COST), self._k(HOLDS + DAILY_COST), self._k(META + DAILY_COST)]

    @guard
    def _reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float,
                       fence: Fence | None) -> bool:
        lease = self._k(LEASE + (fence[0] if fence else "wake"))
        out = int(self._reserve_script(keys=[*self._spend_keys()[:2], lease],
                                       args=[day, repr(float(amount)), repr(float(ceiling)), token,
                                             max(1, int(ttl_s * 1000)), fence[1] if fence else ""]))
        if out == -1:
            raise lease_lost(DAILY_COST)
        return bool(out)

    @guard
    def _settle_spend(self, day: str, token: str | None, actual: float) -> float:
        return float(self._settle_script(keys=self._spend_keys(), args=[day, token or "", repr(float(actual))]))

    @guard
    def _daily_spend(self, day: str) -> tuple[float, float]:
        spent, held = self._daily_script(keys=self._spend_keys()[:2], args=[day])
        return float(spent), float(held)

    # --- housekeeping ---
    @guard
    def _usage(self) -> dict:
        try:
            used = self._r.info("memory").get("used_memory")
        except redis.ResponseError:  # servers (and fakes) without INFO
            used = None
        n = len(self._space())
        if self.prefix:
            keys = sum(1 for k in self._scan_all(_glob_escape(self._space()) + "*") if not k[n:].startswith(INTERNAL))
        else:  # the default agent: not the registered agents' keys, nor the internals (a scan: it is rare in fleets)
            agents = self._registry_names()
            keys = sum(1 for k in self._scan_all(_glob_escape(self._space()) + "*")
                       if not k[n:].startswith(names.INTERNAL) and names.candidate(k[n:]) not in agents)
        # bytes: the whole server's memory; per-agent sizes would cost a scan of every log.
        return {"backend": "redis", "keys": keys, "bytes": used}

    def close(self) -> None:
        try:
            self._r.close()
        except redis.RedisError:
            pass


def _score(t: float) -> str:
    return "+inf" if t == float("inf") else repr(float(t))


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)
