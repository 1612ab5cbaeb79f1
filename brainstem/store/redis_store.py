"""The production store: Redis, through redis-py.

Layout under the agent's key prefix (several agents can share one Redis):

    {prefix}{key}              the value, a plain string (``redis-cli GET`` works)
    {prefix}{key}              or, for a log such as karma, a Redis list (RPUSH: O(1))
    {prefix}__meta__:{key}     the metadata of a value, JSON, with the value's TTL
    {prefix}__lock__:{name}    a lock: SET NX PX with an owner token
    {prefix}__holds__:stats:daily_cost  today's spend held by calls in flight: a hash, token -> "USD DEADLINE_MS"
    __agents__                 the registry of agent names: a set, outside every prefix

The default agent's prefix is empty; its view refuses keys under a registered
``NAME:`` (see :mod:`brainstem.core.names`). In production give each agent its
own Redis ACL user restricted to ``~NAME:*`` (and read access to ``__agents__``).

On a Redis Cluster (``redis+cluster://host:port,host:port/``, or
``rediss+cluster://`` with TLS) an agent's keys must share one hash slot, so
that its Lua scripts (the lock, the fenced writes) and MULTI writes stay
legal: there the prefix is a hash tag, ``{NAME}:`` for a named agent and
``{__default__}:`` for the default one (``{alice}:soul``,
``{alice}:__lock__:wake``). The confinement of agents is the same: it is
decided on the logical key, before this physical prefix is added.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from brainstem.core.errors import (
    BrainstemError,
    ConfigError,
    MalformedValue,
    StoreFull,
    StoreReadOnly,
    StoreUnavailable,
)
from brainstem.core.keys import DAILY_COST
from brainstem.core.names import adopt_hint
from brainstem.store.base import (
    KeyInfo,
    ListResult,
    Store,
    decode_log_entry,
    decode_metadata,
    decode_text,
    encode,
    lease_lost,
)

META = "__meta__:"
LOCK = "__lock__:"
HOLDS = "__holds__:"
_INTERNAL = (META, LOCK, HOLDS)
REGISTRY = "__agents__"  # outside every prefix
DEFAULT_TAG = "__default__"  # the default agent's hash tag on a cluster (no agent name starts with "__")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# Compare-and-delete / compare-and-expire: only the owner may release or extend.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
_REFRESH = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) "
            "else return 0 end")
# A retried append: the first try may have landed before its connection dropped (a restart mid-reply).
_APPEND_AGAIN = ("if redis.call('LINDEX', KEYS[1], -1) == ARGV[1] then return redis.call('LLEN', KEYS[1]) end "
                 "return redis.call('RPUSH', KEYS[1], ARGV[1])")

# A write to a fenced key (see ``Store.lease``): done only if the lease's lock still names its owner,
# in one atomic step, so a session that lost its lease can never overwrite its successor's schedule.
# KEYS: the lock, the key, its metadata; ARGV: owner, op (put | del | append | append_again | incr | dellog
# | trim), value (the amount, the entries to keep), PX (0: none), metadata ('' : none). -1: the lease is not
# the owner's.
_FENCED = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local op = ARGV[2]
local function set(key, value)
  if ARGV[4] ~= '0' then redis.call('SET', key, value, 'PX', ARGV[4]) else redis.call('SET', key, value) end
end
if op == 'put' then
  set(KEYS[2], ARGV[3])
  if ARGV[5] ~= '' then
    set(KEYS[3], ARGV[5])
  else
    redis.call('DEL', KEYS[3])
  end
  return 1
elseif op == 'del' then
  if redis.call('TYPE', KEYS[2]).ok == 'list' then return 0 end
  local n = redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[3])
  return n
end
if op == 'incr' then return redis.call('INCRBY', KEYS[2], ARGV[3]) end
if op == 'dellog' then
  if redis.call('TYPE', KEYS[2]).ok ~= 'list' then return 0 end
  return redis.call('DEL', KEYS[2])
end
if op == 'trim' then
  if tonumber(ARGV[3]) > 0 then redis.call('LTRIM', KEYS[2], -tonumber(ARGV[3]), -1) else redis.call('DEL', KEYS[2]) end
  return 1
end
if op == 'append_again' and redis.call('LINDEX', KEYS[2], -1) == ARGV[3] then return redis.call('LLEN', KEYS[2]) end
return redis.call('RPUSH', KEYS[2], ARGV[3])
"""

# Today's spend (see ``Store.reserve_spend``). KEYS: the spend value (JSON {"date", "usd"}), its holds
# (a hash, token -> "USD DEADLINE_MS"). Deadlines are the server's clock, so hosts whose clocks differ
# agree on when a hold has expired; expired holds are dropped by whoever looks next.
_SPEND_LIB = """
if redis.replicate_commands then pcall(redis.replicate_commands) end  -- TIME before writes (Redis < 5)
local function spent(day)
  local raw = redis.call('GET', KEYS[1])
  if not raw then return 0 end
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' and rec.date == day and type(rec.usd) == 'number' and rec.usd == rec.usd
     and rec.usd ~= math.huge and rec.usd ~= -math.huge then
    return rec.usd
  end
  return 0
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function held(now, drop)
  local total = 0
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    local usd, deadline = string.match(all[i + 1], '^(%S+) (%S+)$')
    deadline = tonumber(deadline)
    if deadline == nil or deadline <= now then
      if drop then redis.call('HDEL', KEYS[2], all[i]) end
    elseif usd ~= 'S' then
      total = total + (tonumber(usd) or 0)
    end
  end
  return total
end
"""
# KEYS: the spend, its holds, the session's lease lock; ARGV: day, amount, ceiling, token, ttl_ms, the lease's
# owner ('': unfenced). 1: held; 0: it would pass the ceiling; -1: the lease is not the owner's.
_RESERVE = _SPEND_LIB + """
if ARGV[6] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then return -1 end  -- fenced: the lease is gone
local now = now_ms()
local amount = tonumber(ARGV[2])
local was = redis.call('HGET', KEYS[2], ARGV[4])
if was and string.sub(was, 1, 2) ~= 'S ' then return 1 end  -- a retry of a reserve that was done
if spent(ARGV[1]) + held(now, true) + amount > tonumber(ARGV[3]) + 1e-12 then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[2] .. ' ' .. string.format('%d', now + ttl))
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""
# ARGV: day, token ('': none), actual. The day's spend after, as text. A settled hold stays a minute as
# "S DEADLINE", counting nothing, so a settle retried after a lost reply is not added twice.
_SETTLE = _SPEND_LIB + """
if ARGV[2] ~= '' then
  local was = redis.call('HGET', KEYS[2], ARGV[2])
  if was and string.sub(was, 1, 2) == 'S ' then return tostring(spent(ARGV[1])) end
  redis.call('HSET', KEYS[2], ARGV[2], 'S ' .. string.format('%d', now_ms() + 60000))
  if redis.call('PTTL', KEYS[2]) < 60000 then redis.call('PEXPIRE', KEYS[2], 60000) end
end
local total = spent(ARGV[1]) + tonumber(ARGV[3])
if total < 0 then total = 0 end
local text = string.format('%.10f', total):gsub('0+$', ''):gsub('%.$', '')
redis.call('SET', KEYS[1], '{"date":"' .. ARGV[1] .. '","usd":' .. text .. '}')
redis.call('DEL', KEYS[3])
return text
"""
# ARGV: day. {spent, held}, as text.
_DAILY = _SPEND_LIB + """
return {tostring(spent(ARGV[1])), tostring(held(now_ms(), false))}
"""


def redact_url(url: str) -> str:
    """The URL with its password (and user) replaced, safe to print."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:  # host:port,host:port is no netloc urlsplit can read
        netloc, slash, tail = rest.partition("/")
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        return f"{scheme}{sep}{netloc}{slash}{tail}"
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


RETRY_SECONDS = 5.0  # how long a command keeps retrying a lost connection (a restart, a failover)


def _guard(fn=None, *, retry: bool = True):
    """Turn Redis failures into one operator-readable line naming the server.

    A lost connection is retried with growing pauses for up to ``retry_seconds`` (a restart or a
    failover of a few seconds is survived); a refused password, a read-only replica and a full
    server are not retried.
    """
    if fn is None:
        return lambda f: _guard(f, retry=retry)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        # After a command has used up its retries, the next ones try once until one succeeds: a
        # server that stays down costs one wait, not one per command.
        deadline = time.monotonic() + (self.retry_seconds if retry and not self._down else 0.0)
        pause = 0.05
        while True:
            try:
                out = fn(self, *args, **kwargs)
                self._down = False
                return out
            except redis.AuthenticationError as exc:  # a ConnectionError too: before the branch below
                raise StoreUnavailable(_auth_message(self.display_url, exc)) from None
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
                    redis.exceptions.TryAgainError, redis.exceptions.RedisClusterException) as exc:
                # A cluster failing over answers CLUSTERDOWN / TRYAGAIN for a moment: retried as a lost connection.
                left = deadline - time.monotonic()
                if left <= 0:
                    self._down = True
                    raise StoreUnavailable(f"cannot reach Redis at {self.display_url}: {_reason(exc)}") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)
            except redis.ResponseError as exc:
                text = str(exc)
                first = text.splitlines()[0] if text else type(exc).__name__
                if "WRONGTYPE" in text:
                    raise MalformedValue(f"{args[0]!r} holds a different kind of value "
                                         "(a log is not a value)") from None
                if "NOAUTH" in text or "WRONGPASS" in text:
                    raise StoreUnavailable(_auth_message(self.display_url, exc)) from None
                if isinstance(exc, redis.exceptions.ReadOnlyError) or text.startswith("READONLY"):
                    raise StoreReadOnly(f"Redis at {self.display_url} is read-only (a replica?) and refused a "
                                        f"write: {first}") from None
                if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
                    raise StoreFull(f"the store is full: Redis at {self.display_url} "
                                    f"refused a write: {first}") from None
                if text.startswith("MISCONF"):
                    raise StoreFull(f"the store's disk is full or not writable: Redis at {self.display_url} "
                                    f"cannot persist and refuses writes: {first}") from None
                if isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
                    what = fn.__name__.lstrip("_").replace("_", " ")
                    raise ConfigError(f"Redis at {self.display_url} refused {what} for the ACL user: "
                                      f"{first} (an agent's user needs ~NAME:* and read access to "
                                      f"{REGISTRY}, where the operator registers NAME)") from None
                if "unauthenticated" in text:  # a large command sent after the server began asking for a password
                    raise StoreUnavailable(_auth_message(self.display_url, "NOAUTH")) from None
                raise
            except UnicodeDecodeError:
                raise MalformedValue(f"Redis at {self.display_url} answered {fn.__name__.lstrip('_')} with bytes "
                                     "that are not UTF-8 text (a key or value written around Brainstem)") from None
            except BrainstemError:
                raise
            except Exception as exc:  # noqa: BLE001 - see below
                # Mid-failover the client breaks in ways no list of types covers ('NoneType' object has no
                # attribute 'readline', I/O on a closed file, a cluster error without a node...), and a
                # client shared by threads can stay broken after the cluster has healed: rebuild it, and
                # retry as for a lost connection.
                self._rebuild()
                left = deadline - time.monotonic()
                if left <= 0:
                    self._down = True
                    raise StoreUnavailable(f"cannot reach Redis at {self.display_url}: the client failed "
                                           f"({type(exc).__name__})") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)
    return wrapper


def _auth_message(url: str, exc: BaseException) -> str:
    text = str(exc)
    if "NOAUTH" in text or "Authentication required" in text:
        return f"Redis at {url} needs a password (put it in the URL: redis://:PASSWORD@host:port/db)"
    return f"Redis at {url} refused the password (check the one in the URL)"


def parse_cluster_url(url: str) -> dict:
    """``redis+cluster://[user:password@]host:port[,host:port...][/0][?prefix=NAME]`` -> the client's
    arguments; a malformed URL is a one-line ConfigError showing the form."""
    from brainstem.core.errors import ConfigError

    form = "redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...][/0] (rediss+cluster:// for TLS)"
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0]
    userinfo, _, hosts = netloc.rpartition("@")
    shown = redact_url(url)
    if path not in ("", "0"):
        raise ConfigError(f"BRAINSTEM_KV {shown}: a Redis Cluster has only database 0 (got /{path}); use {form}")
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"BRAINSTEM_KV {shown}: {item.strip() or 'an empty node'!r} is not HOST:PORT; use {form}")
        nodes.append((host, int(port)))
    user, _, password = userinfo.partition(":")
    from urllib.parse import unquote

    return {"nodes": nodes, "username": unquote(user) or None, "password": unquote(password) or None,
            "ssl": scheme == "rediss+cluster"}


class RedisStore(Store):
    _down = False  # the last command gave up on the connection: do not wait again until one succeeds
    cluster = False  # a Redis Cluster: every key of the view carries its agent's hash tag

    def __init__(self, url: str, prefix: str | None = None, socket_timeout: float = 5.0,
                 client: redis.Redis | None = None, retry_seconds: float | None = None):
        query = parse_qs(url.partition("?")[2])
        if prefix is None:
            prefix = query.get("prefix", [""])[0]
        self.display_url = redact_url(url)
        self.retry_seconds = RETRY_SECONDS if retry_seconds is None else max(0.0, retry_seconds)
        self._set_prefix(prefix, "agent prefix")
        self.cluster = url.partition("://")[0] in CLUSTER_SCHEMES
        self._url, self._socket_timeout, self._handed = url, socket_timeout, client is not None
        self._rebuilding = threading.Lock()
        self._connect(client)

    def _connect(self, client: redis.Redis | None = None) -> None:
        url, socket_timeout = self._url, self._socket_timeout
        try:
            if client is not None:  # fast unit tests hand in a fakeredis instance
                self._r = client
            elif self.cluster:
                from redis.cluster import ClusterNode, RedisCluster

                args = parse_cluster_url(url.partition("?")[0])
                self._r = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in args["nodes"]],
                                       username=args["username"], password=args["password"], ssl=args["ssl"],
                                       decode_responses=True, socket_timeout=socket_timeout,
                                       socket_connect_timeout=socket_timeout)
            else:
                clean = urlunsplit(urlsplit(url)._replace(query=""))
                self._r = redis.Redis.from_url(clean, decode_responses=True, socket_timeout=socket_timeout,
                                               socket_connect_timeout=socket_timeout)
        except ValueError as exc:
            raise StoreUnavailable(f"bad Redis URL {self.display_url}: {exc}") from None
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise StoreUnavailable(f"cannot reach the Redis Cluster at {self.display_url}: {_reason(exc)}") from None
        self._release = self._r.register_script(_RELEASE)
        self._refresh = self._r.register_script(_REFRESH)
        self._append_again = self._r.register_script(_APPEND_AGAIN)
        self._fenced_script = self._r.register_script(_FENCED)
        self._reserve_script = self._r.register_script(_RESERVE)
        self._settle_script = self._r.register_script(_SETTLE)
        self._daily_script = self._r.register_script(_DAILY)

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

    @_guard(retry=False)  # opening fails fast: nothing has been started that a retry would save
    def ping(self) -> None:
        self._r.ping()

    def _raw(self, *command):
        """A command whose reply stays bytes: values are decoded by :func:`decode_text`, naming the key."""
        return self._r.execute_command(*command, NEVER_DECODE=True)

    # --- the registry of agent names ---
    @_guard
    def _registry_has(self, name: str) -> bool:
        return bool(self._registry_call(self._r.sismember, REGISTRY, name))

    @_guard
    def _registry_names(self) -> set[str]:
        return set(self._registry_call(self._r.smembers, REGISTRY))

    @_guard
    def _registry_add(self, name: str, adopt: bool) -> None:
        if self._registry_call(self._r.sismember, REGISTRY, name):
            return
        if not adopt:
            # Keys already under NAME: are the default agent's, unless a log is among them: only
            # NAME's own runtime appends logs there (an agent from before names were registered).
            clash = None
            batch: list[str] = []
            for k in self._scan_all(_glob_escape(self._space("") + name + ":") + "*"):
                batch.append(k)
                if len(batch) >= 500:
                    clash, found_log = self._classify(batch, clash)
                    if found_log:
                        break
                    batch = []
            else:
                clash, found_log = self._classify(batch, clash)
            if clash is not None and not found_log and self._registry_call(self._r.sismember, REGISTRY, name):
                return  # registered meantime by another process of the same agent: those keys are its own
            if clash is not None and not found_log and not clash.startswith(self._space("") + name + ":__lock__:"):
                raise ConfigError(f"cannot register agent {name!r} in {self.display_url}: the default agent already "
                                  f"holds keys under {name + ':'!r} (e.g. {clash!r}); delete or rename them, or choose "
                                  f"another name; if they are {name}'s own from before agents were registered: "
                                  f"{adopt_hint(name)}")
        self._registry_call(self._r.sadd, REGISTRY, name)

    def _scan_all(self, pattern: str):
        cursor = 0
        while True:
            cursor, batch = self._scan(cursor, pattern, 1000)
            for raw in batch:
                yield raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
            if int(cursor) == 0:
                return

    def _classify(self, batch: list[str], clash: str | None) -> tuple[str | None, bool]:
        if not batch:
            return clash, False
        pipe = self._r.pipeline(transaction=False)
        for k in batch:
            pipe.type(k)
        kinds = pipe.execute()
        return clash or min(batch), "list" in kinds

    def _registry_call(self, fn, *args):
        try:
            return fn(*args)
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                raise MalformedValue(f"the agent registry {REGISTRY!r} in {self.display_url} is not a set; "
                                     "something outside Brainstem overwrote it") from None
            raise

    # --- values ---
    @_guard
    def get_text(self, key: str) -> str | None:
        return decode_text(key, self._raw("GET", self._k(key)))

    @_guard
    def get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        value, meta = self._raw("MGET", self._k(key), self._k(META + key))
        if value is None:
            return None, None
        return decode_text(key, value), decode_metadata(key, meta)

    def _fenced(self, fence: tuple[str, str], op: str, key: str, value: str = "", px: int | None = None,
                meta: str = "") -> int:
        lock, owner = fence
        out = int(self._fenced_script(keys=[self._k(LOCK + lock), self._k(key), self._k(META + key)],
                                      args=[owner, op, value, px or 0, meta]))
        if out == -1:
            raise lease_lost(key)
        return out

    @_guard
    def put(self, key: str, value: Any, metadata: dict | None = None, ttl: float | None = None) -> None:
        px = int(ttl * 1000) if ttl else None
        fence = self.fence_for(key)
        if fence is not None:
            self._fenced(fence, "put", key, encode(value), px, json.dumps(metadata) if metadata is not None else "")
            return
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
        fence = self.fence_for(key)
        if fence is not None:
            return self._fenced(fence, "del", key) > 0
        if self._r.type(self._k(key)) == "list":
            return False
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self._k(key))
        pipe.delete(self._k(META + key))
        n, _ = pipe.execute()
        return n > 0

    @_guard
    def incr(self, key: str, amount: int = 1) -> int:
        try:
            fence = self.fence_for(key)
            if fence is not None:
                return self._fenced(fence, "incr", key, str(int(amount)))
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
                if not b[n:].startswith(_INTERNAL) and b != REGISTRY:
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
            keys.append(KeyInfo(name=name[n:], metadata=None if is_log else _listed_metadata(name[n:], meta),
                                expiration=now + pttl / 1000 if pttl and pttl > 0 else None, is_log=is_log))
        return ListResult(keys=keys, cursor=str(scan_cursor) if scan_cursor else None)

    # --- logs ---
    def append(self, log_key: str, entry: Any) -> int:
        return self._append(log_key, encode(entry), [0])

    @_guard
    def _append(self, log_key: str, text: str, tries: list[int]) -> int:
        # Retried after a lost connection, an entry is pushed only if it is not already the last one:
        # a karma entry (an llm_call and its cost) is never recorded twice.
        tries[0] += 1
        fence = self.fence_for(log_key)
        if fence is not None:
            return self._fenced(fence, "append" if tries[0] == 1 else "append_again", log_key, text)
        key = self._k(log_key)
        if tries[0] == 1:
            return self._r.rpush(key, text)
        return int(self._append_again(keys=[key], args=[text]))

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
        return [decode_log_entry(e) for e in self._raw("LRANGE", self._k(log_key), start, end)]

    @_guard
    def log_length(self, log_key: str) -> int:
        return self._r.llen(self._k(log_key))

    @_guard
    def delete_log(self, log_key: str) -> bool:
        fence = self.fence_for(log_key)
        if fence is not None:
            return self._fenced(fence, "dellog", log_key) > 0
        if self._r.type(self._k(log_key)) != "list":
            return False
        return self._r.delete(self._k(log_key)) > 0

    @_guard
    def trim_log(self, log_key: str, keep: int) -> None:
        fence = self.fence_for(log_key)
        if fence is not None:
            self._fenced(fence, "trim", log_key, str(max(0, int(keep))))
            return
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

    # --- today's spend: one Lua script each, atomic on the server (a cluster: one slot, the agent's) ---
    def _spend_keys(self) -> list[str]:
        return [self._k(DAILY_COST), self._k(HOLDS + DAILY_COST), self._k(META + DAILY_COST)]

    @_guard
    def reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float) -> bool:
        fence = self.fence_for(DAILY_COST)
        lock = self._k(LOCK + (fence[0] if fence else "wake"))
        out = int(self._reserve_script(keys=[*self._spend_keys()[:2], lock],
                                       args=[day, repr(float(amount)), repr(float(ceiling)), token,
                                             max(1, int(ttl_s * 1000)), fence[1] if fence else ""]))
        if out == -1:
            raise lease_lost(DAILY_COST)
        return bool(out)

    @_guard
    def settle_spend(self, day: str, token: str | None, actual: float) -> float:
        return float(self._settle_script(keys=self._spend_keys(), args=[day, token or "", repr(float(actual))]))

    @_guard
    def daily_spend(self, day: str) -> tuple[float, float]:
        spent, held = self._daily_script(keys=self._spend_keys()[:2], args=[day])
        return float(spent), float(held)

    # --- housekeeping ---
    @_guard
    def usage(self) -> dict:
        try:
            used = self._r.info("memory").get("used_memory")
        except redis.ResponseError:  # servers (and fakes) without INFO
            used = None
        if self.prefix or self.cluster:
            n = len(self._space())
            keys = sum(1 for k in self._scan_all(_glob_escape(self._space()) + "*") if not k[n:].startswith(_INTERNAL))
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


def _listed_metadata(key: str, raw: bytes | None) -> dict | None:
    """Metadata for a listing: one key's unreadable metadata must not hide the others."""
    try:
        return decode_metadata(key, raw)
    except MalformedValue:
        return None
