"""A throwaway layer over a store: reads fall through, writes stay in memory.

Replay and dry run run a whole session against one of these, so nothing they
do reaches the agent's store: not a key, not the schedule, not the session
history. ``passthrough(key)`` names the few keys that do go through, each a
record of something real (a dry run's own karma, today's spend on real LLM
calls); everything else is forgotten with the overlay.

The overlay is confined exactly as its base is (another agent's keys are
absent and unwritable), because it asks the base who owns a key.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from typing import Any

from brainstem.core import keys
from brainstem.core.errors import MalformedValue
from brainstem.store.base import Fence, KeyInfo, ListResult, Store, spend_record, spent_on


class OverlayStore(Store):
    def __init__(self, base: Store, passthrough: Callable[[str], bool] = lambda key: False):
        self.base = base
        self.display_url = base.display_url
        self.prefix = ""  # confinement is the base's: see owner_of
        self._passthrough = passthrough
        self._values: dict[str, tuple[str, dict | None] | None] = {}  # None: deleted here
        self._logs: dict[str, list[str] | None] = {}  # a log written here (a copy of the base's), None: deleted
        self._leases: dict[str, str] = {}
        self._holds: dict[str, tuple[float, float]] = {}  # token -> (USD, monotonic deadline)
        self._due: dict[tuple[str, str], float | None] = {}  # (index, key) -> an entry set here (None: removed)
        self.written: list[tuple[str, str]] = []  # (op, key), in order: what the overlay kept from the base

    # --- confinement: the base's ---
    def owner_of(self, key: Any) -> str | None:
        return self.base.owner_of(key)

    def _ready(self, write: bool = True) -> None:
        pass

    def _registry_has(self, name: str) -> bool:
        return self.base._registry_has(name)

    def _registry_names(self) -> set[str]:
        return self.base._registry_names()

    def _registry_add(self, name: str, adopt: bool) -> None:
        pass  # registering is a write; the overlay keeps none

    # --- values ---
    def _get_text(self, key: str) -> str | None:
        if key in self._values:
            held = self._values[key]
            return None if held is None else held[0]
        return self.base.get_text(key)

    def _get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        if key in self._values:
            held = self._values[key]
            return (None, None) if held is None else held
        return self.base.get_with_metadata(key)

    def _put(self, key: str, text: str, metadata: dict | None, ttl: float | None, fence: Fence | None) -> None:
        if self._passthrough(key):
            self.base.put(key, text, metadata=metadata, ttl=ttl, fence=fence)
            return
        self._values[key] = (text, metadata)
        self.written.append(("put", key))

    def _delete(self, key: str, fence: Fence | None) -> bool:
        if self._passthrough(key):
            return self.base.delete(key, fence=fence)
        existed = self._get_text(key) is not None
        self._values[key] = None
        self.written.append(("delete", key))
        return existed

    def _incr(self, key: str, amount: int, fence: Fence | None) -> int:
        if self._passthrough(key):
            return self.base.incr(key, amount, fence=fence)
        held = self._get_text(key)
        try:
            value = int(held or 0) + amount
        except ValueError:  # as every store says it: the caller repairs a malformed counter
            raise MalformedValue(f"value of {key!r} is not an integer") from None
        self._put(key, str(value), None, None, fence)
        return value

    def _list(self, prefix: str, limit: int, cursor: str | None) -> ListResult:
        found = {k.name: k for k in self.base.list_all(prefix)}
        for key, held in self._values.items():
            if key.startswith(prefix):
                if held is None:
                    found.pop(key, None)
                else:
                    found[key] = KeyInfo(key, metadata=held[1])
        for key, log in self._logs.items():
            if key.startswith(prefix):
                if log:
                    found[key] = KeyInfo(key, is_log=True)
                else:
                    found.pop(key, None)
        return ListResult(keys=sorted(found.values(), key=lambda k: k.name))  # one page: cursor None

    # --- logs ---
    def _log(self, key: str) -> builtins.list[str]:
        log = self._logs.get(key)
        if log is None:
            log = [] if key in self._logs else list(self.base.read_log(key))
            self._logs[key] = log
        return log

    def fresh_log(self, key: str) -> None:
        """Start ``key`` empty here, whatever the base holds (a replay's own karma, under the old id)."""
        self._logs[key] = []

    def _append(self, log_key: str, text: str, fence: Fence | None) -> int:
        if self._passthrough(log_key):
            return self.base.append(log_key, text, fence=fence)
        log = self._log(log_key)
        log.append(text)
        return len(log)

    def _read_log(self, log_key: str, start: int, stop: int | None) -> builtins.list[str]:
        if self._passthrough(log_key) or log_key not in self._logs:
            return self.base.read_log(log_key, start, stop)
        return list((self._logs[log_key] or [])[start:stop])  # Python slice semantics, as every backend

    def _log_length(self, log_key: str) -> int:
        if self._passthrough(log_key) or log_key not in self._logs:
            return self.base.log_length(log_key)
        return len(self._logs[log_key] or [])

    def _delete_log(self, log_key: str, fence: Fence | None) -> bool:
        if self._passthrough(log_key):
            return self.base.delete_log(log_key, fence=fence)
        existed = self._log_length(log_key) > 0
        self._logs[log_key] = None
        self.written.append(("delete_log", log_key))
        return existed

    def _trim_log(self, log_key: str, keep: int, fence: Fence | None) -> None:
        if self._passthrough(log_key):
            self.base.trim_log(log_key, keep, fence=fence)
            return
        log = self._log(log_key)
        del log[:max(0, len(log) - keep)]

    # --- leases: held here only (a passthrough name is the store's: a lease guarding a passthrough key) ---
    def _acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        if self._passthrough(name):
            return self.base.acquire_lease(name, owner, ttl_ms)
        if name in self._leases and self._leases[name] != owner:
            return False
        self._leases[name] = owner
        return True

    def _release_lease(self, name: str, owner: str) -> bool:
        if self._passthrough(name):
            return self.base.release_lease(name, owner)
        if self._leases.get(name) == owner:
            del self._leases[name]
            return True
        return False

    def _renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        return self._leases.get(name) == owner

    def _lease_owner(self, name: str) -> str | None:
        return self._leases.get(name)

    # --- today's spend: the store's when it passes through (real calls are real money), else kept here ---
    def _reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float,
                       fence: Fence | None) -> bool:
        if self._passthrough(keys.DAILY_COST):
            return self.base.reserve_spend(day, amount, ceiling, token, ttl_s, fence=fence)
        now = time.monotonic()
        self._holds = {t: h for t, h in self._holds.items() if h[1] > now}
        if spent_on(day, self._get_text(keys.DAILY_COST)) + sum(h[0] for h in self._holds.values()) + amount \
                > ceiling + 1e-12:
            return False
        self._holds[token] = (amount, now + ttl_s)
        return True

    def _settle_spend(self, day: str, token: str | None, actual: float) -> float:
        if self._passthrough(keys.DAILY_COST):
            return self.base.settle_spend(day, token, actual)
        if token is not None:
            self._holds.pop(token, None)
        total = max(0.0, spent_on(day, self._get_text(keys.DAILY_COST)) + actual)
        self._put(keys.DAILY_COST, spend_record(day, total), None, None, None)
        return round(total, 10)

    def _daily_spend(self, day: str) -> tuple[float, float]:
        if self._passthrough(keys.DAILY_COST):
            return self.base.daily_spend(day)
        now = time.monotonic()
        return spent_on(day, self._get_text(keys.DAILY_COST)), sum(h[0] for h in self._holds.values() if h[1] > now)

    def _usage(self) -> dict:
        return self.base.usage()

    # --- the due index: entries set here are kept here; the rest is the base's ---
    def _set_due(self, key: str, at: float | None, index: str) -> None:
        if not self._passthrough(key):  # a passthrough write's entry is set by the base's own write
            self._due[index, key] = at

    def _due_at(self, key: str, index: str) -> float | None:
        return self._due[index, key] if (index, key) in self._due else self.base.due_at(key, index)

    def _due_range(self, until: float, limit: int, index: str) -> builtins.list[tuple[str, float]]:
        return self.base.due_keys(until, limit, index)

    def _due_agents(self, until: float, index: str) -> builtins.list[tuple[str, float]]:
        return [(a or "", t) for a, t in self.base.due_agents(until, index)]
