"""The store protocol every backend implements.

It mirrors Cloudflare KV (get, get_with_metadata, put with metadata and TTL,
delete, list by prefix with a cursor) and adds what Redis gives us: append-only
logs for karma and an owner-token lease for the wake.

Values are text. Anything that is not a ``str`` is stored as JSON text, so a
value written as ``{"a": 1}`` reads back as ``'{"a": 1}'`` with ``get`` and as
``{"a": 1}`` with ``get(key, type="json")``.
"""

from __future__ import annotations

import builtins
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from brainstem.core import names
from brainstem.core.errors import (
    ConfigError,
    ForeignAgentKey,
    LeaseLost,
    MalformedValue,
    NotText,
    StoreReadOnly,
    UnknownAgent,
)
from brainstem.store.due import DueIndex


@dataclass
class KeyInfo:
    name: str
    metadata: dict | None = None
    expiration: float | None = None  # unix time, when the key has a TTL
    is_log: bool = False


@dataclass
class ListResult:
    keys: list[KeyInfo] = field(default_factory=list)
    cursor: str | None = None  # pass back to continue; None when complete

    @property
    def complete(self) -> bool:
        return self.cursor is None


# A write's fence: (lease name, owner token). The write goes through only if that lease is still that
# owner's, checked by the backend atomically with the write; else LeaseLost.
Fence = tuple[str, str]


class Store(DueIndex):
    """What every backend offers. Keys are plain strings; backends add their own prefix.

    The public methods are defined here once, and each confines the view before it calls the
    backend's primitive of the same name (``get_text`` calls ``_get_text``, ``put`` calls ``_put``; a
    backend implements only the primitives): a read of a key that is not this view's answers "absent",
    a write of one raises :class:`ForeignAgentKey` (see :mod:`brainstem.core.names`). A named agent's
    view is confined by its prefix; the default agent's view refuses keys whose first segment is a
    registered name. Backends provide the registry (``_registry_*``).

    A named view built with ``registers`` (the default for a view made directly) registers its name
    before its first operation. One opened by the commands (``open_store(register=False)``) does
    not: an agent exists once ``brainstem seed`` or ``brainstem agents register`` has registered it,
    and any operation through a view of a name that is not registered is :class:`UnknownAgent`, so
    a mistyped ``BRAINSTEM_KV_PREFIX`` neither becomes an agent nor reads the default agent's keys.

    Every write takes a ``fence`` (see :data:`Fence`); None, the default, is an unfenced write (the
    operator's commands). A session writes through a :class:`~brainstem.store.fenced.FencedStore`,
    which fences each of its writes with the session's wake lease. Each write of a schedule keeps the
    due index (:mod:`brainstem.store.due`) right; each write of the urgent mark and each take and renewal of
    the wake lease, the wake index beside it.
    """

    display_url: str = ""  # the URL with any password removed, safe to print
    prefix: str = ""  # "" for the default agent, else "NAME:"
    _registered = False  # a named view has registered its name (or found it registered)
    registers = True  # register this view's name on first use (else: UnknownAgent while it is not registered)
    # Names seen registered, cached for the default agent's refusals. ``agents rm`` may unregister one
    # later; a stale entry only over-refuses (the default agent keeps off keys that nobody owns now).
    _known_agents: frozenset[str] = frozenset()

    # --- registry (each backend) ---
    def _registry_has(self, name: str) -> bool: raise NotImplementedError
    def _registry_names(self) -> set[str]: raise NotImplementedError
    def _registry_add(self, name: str, adopt: bool) -> None: raise NotImplementedError  # ConfigError on a clash
    # The number of entries (keys, logs, leases, internals) under NAME:; the name is unregistered only at 0.
    def _registry_remove(self, name: str) -> int: raise NotImplementedError

    # --- agents (shared) ---
    def _set_prefix(self, prefix: str | None, source: str = "agent prefix") -> None:
        """Validate and normalise the agent prefix (ConfigError naming ``source`` when invalid)."""
        self.prefix = names.agent_prefix(prefix, source)
        self._registered = False
        self._known_agents = frozenset()

    @property
    def agent(self) -> str | None:
        """This view's agent name; None for the default agent."""
        return self.prefix[:-1] or None

    def registered_agents(self) -> set[str]:
        """Every agent name registered in this store; a named view sees only its own name."""
        found = self._registry_names()
        self._known_agents = self._known_agents | found
        return found & {self.agent} if self.prefix else found

    def _own_registry(self, name: str, what: str) -> None:
        # The registry is the operator's: a named view may only register (or remove) its own name, so no
        # agent's runtime can hand another agent the default agent's keys or take a name away.
        if self.prefix and name != self.agent:
            raise ForeignAgentKey(f"agent {self.agent!r} cannot {what} agent {name!r}: only the operator's view "
                                  f"of the store (the default agent's) does")

    def register_agent(self, name: str, adopt: bool = False) -> None:
        """Record ``name`` in the registry (idempotent).

        Refused with :class:`ConfigError` when the default agent already holds
        keys under ``NAME:``, unless ``adopt`` (the operator says they are the
        agent's own) or a log lives there (only the agent's own runtime writes
        logs under its prefix).
        """
        name = names.agent_prefix(name, "agent name")[:-1]
        if not name:
            raise ConfigError("the default agent has no name to register")
        self._own_registry(name, "register")
        self._registry_add(name, adopt)
        self._known_agents = self._known_agents | {name}
        if name == self.agent:
            self._registered = True

    def unregister_agent(self, name: str) -> int | None:
        """Remove ``name`` from the registry if it holds nothing under ``NAME:``: returns how many entries
        it still holds (0: removed), or None when it is not registered. Never deletes a key: an agent
        with keys keeps its registration, so its keys never become visible to the default agent."""
        name = names.agent_prefix(name, "agent name")[:-1]
        if not name:
            raise ConfigError("the default agent is not registered; it cannot be removed")
        self._own_registry(name, "remove")
        if not self._registry_has(name):
            return None
        held = self._registry_remove(name)
        if held == 0 and name == self.agent:
            self._registered = False
        return held

    def owner_of(self, key: Any) -> str | None:
        """Who owns ``key`` when this view may not touch it: another agent's name, or ``"__"`` for
        the store's internals. None when the key is this view's own."""
        if not isinstance(key, str):
            return None
        if key.startswith(names.INTERNAL):
            return names.INTERNAL
        if self.prefix:
            return None  # stored under NAME:, which no other agent can reach
        seg = names.candidate(key)
        if seg is None:
            return None
        if key[len(seg) + 1:].startswith(names.INTERNAL):
            return names.INTERNAL  # NAME:__…: the internals of agent NAME, whether or not it is registered yet
        if seg in self._known_agents:
            return seg
        if self._registry_has(seg):  # not cached when absent: a name may be registered at any time
            self._known_agents = self._known_agents | {seg}
            return seg
        return None

    def check_writable(self, key: Any) -> Any:
        """``key``, or :class:`ForeignAgentKey` when it belongs to another agent or the store's internals."""
        owner = self.owner_of(key)
        if owner is not None:
            raise ForeignAgentKey(_refusal(key, owner))
        return key

    def _ready(self, write: bool = True) -> None:
        if self.prefix and not self._registered:
            if not self.registers:
                if not self._registry_has(self.prefix[:-1]):
                    raise UnknownAgent(unknown_agent(self.prefix[:-1], self.display_url))
                self._registered = True
                return
            try:
                self.register_agent(self.prefix[:-1])
            except StoreReadOnly:
                if write:
                    raise
                # A read-only store can still be read: the view's own keys are under its prefix whether or
                # not the name is registered; registration is tried again before the first write.

    def _readable(self, key: Any) -> bool:
        """Ready the view for a read of ``key``; False when the key is not this view's (it reads as absent)."""
        self._ready(write=False)
        return self.owner_of(key) is None

    # --- the protocol: each method confines the view, then calls the backend's primitive ---
    def get_text(self, key: str) -> str | None:
        return self._get_text(key) if self._readable(key) else None

    def get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        return self._get_with_metadata(key) if self._readable(key) else (None, None)

    def put(self, key: str, value: Any, metadata: dict | None = None, ttl: float | None = None, *,
            fence: Fence | None = None) -> None:
        self._ready()
        self.check_writable(key)
        text = encode(value)
        self._put(key, text, metadata, ttl, fence)
        self._note_due(key, text)

    def delete(self, key: str, *, fence: Fence | None = None) -> bool:
        self._ready()
        self.check_writable(key)
        deleted = self._delete(key, fence)
        self._note_due(key, None)
        return deleted

    def incr(self, key: str, amount: int = 1, *, fence: Fence | None = None) -> int:
        self._ready()
        self.check_writable(key)
        return self._incr(key, amount, fence)

    def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> ListResult:
        """One page of the keys under ``prefix`` this view may see: never the store's internals, and for
        the default agent never a registered agent's."""
        self._ready(write=False)
        prefix = prefix or ""
        if prefix.startswith(names.INTERNAL) or (":" in prefix and self.owner_of(prefix) is not None):
            return ListResult()  # wholly another agent's (or the internals): nothing to scan
        res = self._list(prefix, limit, cursor)
        keys = [k for k in res.keys if not k.name.startswith(names.INTERNAL)]
        if not self.prefix and any(names.candidate(k.name) for k in keys):
            agents = self.registered_agents()  # one lookup for the whole page
            keys = [k for k in keys if names.candidate(k.name) not in agents]
        res.keys = keys
        if res.cursor is not None and not self.prefix and res.cursor not in {k.name for k in keys}:
            res.cursor = _past_owner(res.cursor, self.owner_of(res.cursor))
        return res

    def append(self, log_key: str, entry: Any, *, fence: Fence | None = None) -> int:
        self._ready()
        self.check_writable(log_key)
        return self._append(log_key, encode(entry), fence)

    def read_log(self, log_key: str, start: int = 0, stop: int | None = None) -> builtins.list[str]:
        """Entries ``start`` .. ``stop`` (exclusive, Python slice semantics incl. negatives)."""
        return self._read_log(log_key, start, stop) if self._readable(log_key) else []

    def log_length(self, log_key: str) -> int:
        return self._log_length(log_key) if self._readable(log_key) else 0

    def delete_log(self, log_key: str, *, fence: Fence | None = None) -> bool:
        self._ready()
        self.check_writable(log_key)
        return self._delete_log(log_key, fence)

    def trim_log(self, log_key: str, keep: int, *, fence: Fence | None = None) -> None:
        """Keep the newest ``keep`` entries."""
        self._ready()
        self.check_writable(log_key)
        self._trim_log(log_key, keep, fence)

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        self._ready()
        self.check_writable(name)
        return self._note_lease(name, ttl_ms, self._acquire_lease(name, owner, ttl_ms))

    def release_lease(self, name: str, owner: str) -> bool:
        self._ready()
        self.check_writable(name)
        return self._release_lease(name, owner)

    def renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        self._ready()
        self.check_writable(name)
        return self._note_lease(name, ttl_ms, self._renew_lease(name, owner, ttl_ms))

    def lease_owner(self, name: str) -> str | None:
        return self._lease_owner(name) if self._readable(name) else None

    # Today's spend, shared by every process of the agent (each backend, atomically). The day's actual
    # spend is ``keys.DAILY_COST`` (``{"date": DAY, "usd": N}``, readable with ``get``); the holds live
    # beside it, as the store's internals. A hold counts until it is settled or its deadline passes, so
    # a process that dies between reserve and settle blocks nothing for long. The keys are fixed, always
    # the view's own.
    def reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float, *,
                      fence: Fence | None = None) -> bool:
        """Hold ``amount`` USD under ``token`` for ``ttl_s`` seconds, if ``day``'s actual spend plus
        every live hold plus ``amount`` stays within ``ceiling``; False (and nothing held) otherwise."""
        self._ready()
        return self._reserve_spend(day, amount, ceiling, token, ttl_s, fence)

    def settle_spend(self, day: str, token: str | None, actual: float) -> float:
        """Drop the hold ``token`` (None: none) and add ``actual`` (may be negative: a correction) to
        ``day``'s spend, never below 0; returns the day's spend after. Never fenced: the money is spent."""
        self._ready()
        return self._settle_spend(day, token, actual)

    def daily_spend(self, day: str) -> tuple[float, float]:
        """(``day``'s actual spend, USD held now by live holds)."""
        self._ready(write=False)
        return self._daily_spend(day)

    def usage(self) -> dict:
        return self._usage()

    def close(self) -> None: pass

    # --- primitives (each backend): the key is this view's; text is already encoded ---
    def _get_text(self, key: str) -> str | None: raise NotImplementedError
    def _get_with_metadata(self, key: str) -> tuple[str | None, dict | None]: raise NotImplementedError
    def _put(self, key: str, text: str, metadata: dict | None, ttl: float | None,
             fence: Fence | None) -> None: raise NotImplementedError
    def _delete(self, key: str, fence: Fence | None) -> bool: raise NotImplementedError
    def _incr(self, key: str, amount: int, fence: Fence | None) -> int: raise NotImplementedError
    def _list(self, prefix: str, limit: int, cursor: str | None) -> ListResult: raise NotImplementedError
    def _append(self, log_key: str, text: str, fence: Fence | None) -> int: raise NotImplementedError
    def _read_log(self, log_key: str, start: int, stop: int | None) -> builtins.list[str]: raise NotImplementedError
    def _log_length(self, log_key: str) -> int: raise NotImplementedError
    def _delete_log(self, log_key: str, fence: Fence | None) -> bool: raise NotImplementedError
    def _trim_log(self, log_key: str, keep: int, fence: Fence | None) -> None: raise NotImplementedError
    def _acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool: raise NotImplementedError
    def _release_lease(self, name: str, owner: str) -> bool: raise NotImplementedError
    def _renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool: raise NotImplementedError
    def _lease_owner(self, name: str) -> str | None: raise NotImplementedError
    def _reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float,
                       fence: Fence | None) -> bool: raise NotImplementedError
    def _settle_spend(self, day: str, token: str | None, actual: float) -> float: raise NotImplementedError
    def _daily_spend(self, day: str) -> tuple[float, float]: raise NotImplementedError
    def _usage(self) -> dict: raise NotImplementedError

    # --- shared on top of the primitives ---
    def get(self, key: str, type: Literal["text", "json"] = "text", default: Any = None) -> Any:
        """A key as text or parsed JSON; ``default`` when absent.

        Malformed JSON raises :class:`MalformedValue` naming the key; it never
        comes back half-parsed.
        """
        text = self.get_text(key)
        if text is None:
            return default
        return decode_json(key, text) if type == "json" else text

    def get_json(self, key: str, default: Any = None, on_error=None) -> Any:
        """Parsed JSON, or ``default`` when absent or malformed (``on_error(exc)`` is told why)."""
        try:
            return self.get(key, "json", default)
        except MalformedValue as exc:
            if on_error is not None:
                on_error(exc)
            return default

    def get_object(self, key: str) -> dict[str, Any]:
        """A JSON object the runtime keeps (``stats:*``), or {} when absent, malformed or not an object."""
        value = self.get_json(key, default=None)
        return value if isinstance(value, dict) else {}

    def list_all(self, prefix: str = "", page: int = 1000, limit: int | None = None) -> builtins.list[KeyInfo]:
        """Every key under ``prefix``, sorted, following cursors; at most ``limit``."""
        seen: dict[str, KeyInfo] = {}
        cursor = None
        while True:
            res = self.list(prefix, limit=page, cursor=cursor)
            for k in res.keys:
                seen.setdefault(k.name, k)
            if res.complete or (limit is not None and len(seen) >= limit):
                break
            cursor = res.cursor
        keys = sorted(seen.values(), key=lambda k: k.name)
        return keys[:limit] if limit is not None else keys

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _past_owner(cursor: str, owner: str | None) -> str:
    """A cursor (a key name, where a backend's cursor is one) that names no key this view may not see: past
    every key of the agent (or the internals) the page ended in, which says only that it exists."""
    if owner is None:
        return cursor
    if owner != names.INTERNAL:
        return owner + ":\U0010ffff"
    if cursor.startswith(names.INTERNAL):
        return names.INTERNAL + "\U0010ffff"
    return f"{names.candidate(cursor)}:{names.INTERNAL}\U0010ffff"  # NAME:__…


def shown_url(url: str, prefix: str) -> str:
    """A store URL as printed: its ``?prefix=`` the agent's bare name (``?prefix=bob``, as the URL takes it, not
    the key prefix ``bob:``, which ran into the punctuation after it), whether the URL or the environment
    named the agent; none for the default agent. Still a URL that opens the same view."""
    base, _, query = url.partition("?")
    rest = [p for p in query.split("&") if p and not p.startswith("prefix=")]
    if prefix:
        rest.append("prefix=" + prefix.removesuffix(":"))
    return base + ("?" + "&".join(rest) if rest else "")


def unknown_agent(name: str, where: str) -> str:
    """The one line for a named agent that is not registered in the store ``where``."""
    return (f"no agent {name!r} in {where}: nothing has been seeded under that name (no soul); create it "
            f"with `BRAINSTEM_KV_PREFIX={name} brainstem seed --soul FILE` (or `brainstem agents register "
            f"{name}`); `brainstem agents list` names the agents there")


def lease_lost(key: str) -> LeaseLost:
    """The refusal of a fenced write whose lease is gone."""
    return LeaseLost(f"this session's wake lease is no longer its own (it ran out, or another wake holds it "
                     f"now): its write to {key!r} was refused")


def _refusal(key: str, owner: str) -> str:
    if owner == names.INTERNAL:
        return f"key {key!r} is reserved for the store's internals"
    return (f"key {key!r} belongs to agent {owner!r}, which shares this store; the default agent cannot "
            f"write, delete or lock it (act as that agent with BRAINSTEM_KV_PREFIX={owner}: or --agent {owner})")


def spent_on(day: str, text: str | None) -> float:
    """The USD of ``keys.DAILY_COST``'s stored text, when it is ``day``'s (else 0: a new day)."""
    try:
        rec = json.loads(text) if text else None
    except ValueError:
        return 0.0
    usd = rec.get("usd") if isinstance(rec, dict) and rec.get("date") == day else None
    if isinstance(usd, (int, float)) and not isinstance(usd, bool) and math.isfinite(usd):
        return float(usd)
    return 0.0


def spend_record(day: str, usd: float) -> str:
    return encode({"date": day, "usd": round(max(0.0, usd), 10)})


def encode(value: Any) -> str:
    """The stored text form of a value: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def decode_json(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:  # not JSON, or JSON with a number past Python's limit on an int's digits
        preview = text[:60].replace("\n", " ")
        why = f"{exc.msg} at char {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc).partition(";")[0]
        raise MalformedValue(f"value of {key!r} is not valid JSON ({why}): {preview!r}") from None


def decode_text(key: str, raw: bytes | str | None, what: str = "value") -> str | None:
    """Stored bytes as text, or :class:`NotText` naming the key: values are UTF-8 text, and bytes that
    are not (written around Brainstem, e.g. by a plain Redis client or sqlite3) must not surface as a
    UnicodeDecodeError deep in whatever read them."""
    if raw is None or isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        if key == "soul":
            fix = "replace it with `brainstem kv put soul --file FILE --force-soul`"
        else:
            fix = f"replace it with `brainstem kv put {key} --file FILE` or delete it with `brainstem kv del {key}`"
        raise NotText(f"{what} of {key!r} is not text (invalid UTF-8 at byte {exc.start} of {len(raw)} bytes); "
                      f"{fix}") from None


def decode_metadata(key: str, raw: bytes | str | None) -> dict | None:
    """Stored metadata (JSON text) as a dict; :class:`MalformedValue` naming the key when it is not."""
    text = decode_text(key, raw, "metadata")
    if not text:
        return None
    try:
        meta = json.loads(text)
    except ValueError:
        raise MalformedValue(f"metadata of {key!r} is not valid JSON: {text[:60]!r}") from None
    return meta if isinstance(meta, dict) else None


def listed_metadata(key: str, raw: bytes | str | None) -> dict | None:
    """Metadata for a listing: one key's unreadable metadata must not hide the others."""
    try:
        return decode_metadata(key, raw)
    except MalformedValue:
        return None


def decode_log_entry(raw: bytes | str) -> str:
    """A log entry as text; bytes that are not UTF-8 are replaced (one bad entry must not hide a log)."""
    return raw if isinstance(raw, str) else bytes(raw).decode("utf-8", errors="replace")
