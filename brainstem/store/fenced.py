"""The session's view of the store: every write fenced by its wake lease.

A wake that holds the lease hands its session a :class:`FencedStore` over the agent's store. Each write
through it goes through only if the lease is still the session's, checked by the backend in the same
atomic step as the write (a Lua script on Redis, the write's transaction on SQLite); else
:class:`~brainstem.core.errors.LeaseLost`. So a session that lost its lease (it ran out, or another
wake took the agent over) writes nothing: no karma, no key, no spend. Reads pass through.

The few writes that are not the session's to fence go through the plain store, by name: the keys in
``keys.UNFENCED`` (the daemon's own log), and what :func:`unfenced` is asked for (the one entry a session
without its lease still writes, ``lease_lost``; the settling of a call already paid for; the inbox).
"""

from __future__ import annotations

import builtins
from typing import Any

from brainstem.core.errors import ForeignAgentKey
from brainstem.core.keys import UNFENCED
from brainstem.store.base import Fence, ListResult, Store


class FencedStore(Store):
    """``store`` with each write fenced by the lease ``lease`` held by ``owner``. Confinement is the
    store's (its owner_of, its registry); the primitives are the store's, with the fence added. A view:
    closing it leaves the store open (whoever opened the store closes it)."""

    def __init__(self, store: Store, lease: str, owner: str):
        self.store = store
        self.fence: Fence = (lease, owner)
        self.display_url = store.display_url
        self.prefix = store.prefix
        self.registers = store.registers

    @property
    def unfenced(self) -> Store:
        """The plain store below: its writes are not fenced."""
        return self.store

    def fence_for(self, key: str) -> Fence | None:
        """The fence of a write to ``key``: the lease, unless the key is not the session's."""
        return None if key in UNFENCED else self.fence

    # --- confinement: the store's ---
    def owner_of(self, key: Any) -> str | None:
        return self.store.owner_of(key)

    def _ready(self, write: bool = True) -> None:
        self.store._ready(write)

    def _registry_has(self, name: str) -> bool:
        return self.store._registry_has(name)

    def _registry_names(self) -> set[str]:
        return self.store._registry_names()

    def _registry_add(self, name: str, adopt: bool) -> None:
        raise ForeignAgentKey(f"a session does not register agents (asked to register {name!r})")

    def _registry_remove(self, name: str) -> int:
        raise ForeignAgentKey(f"a session does not remove agents (asked to remove {name!r})")

    # --- writes: fenced ---
    def _put(self, key: str, text: str, metadata: dict | None, ttl: float | None, fence: Fence | None) -> None:
        self.store._put(key, text, metadata, ttl, self.fence_for(key))

    def _delete(self, key: str, fence: Fence | None) -> bool:
        return self.store._delete(key, self.fence_for(key))

    def _incr(self, key: str, amount: int, fence: Fence | None) -> int:
        return self.store._incr(key, amount, self.fence_for(key))

    def _append(self, log_key: str, text: str, fence: Fence | None) -> int:
        return self.store._append(log_key, text, self.fence_for(log_key))

    def _delete_log(self, log_key: str, fence: Fence | None) -> bool:
        return self.store._delete_log(log_key, self.fence_for(log_key))

    def _trim_log(self, log_key: str, keep: int, fence: Fence | None) -> None:
        self.store._trim_log(log_key, keep, self.fence_for(log_key))

    def _reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float,
                       fence: Fence | None) -> bool:
        # A session that lost its lease spends nothing more.
        return self.store._reserve_spend(day, amount, ceiling, token, ttl_s, self.fence)

    # --- not fenced: the lease itself, and money already spent ---
    def _acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        return self.store._acquire_lease(name, owner, ttl_ms)

    def _release_lease(self, name: str, owner: str) -> bool:
        return self.store._release_lease(name, owner)

    def _renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        return self.store._renew_lease(name, owner, ttl_ms)

    def _settle_spend(self, day: str, token: str | None, actual: float) -> float:
        return self.store._settle_spend(day, token, actual)

    def _set_due(self, key: str, at: float | None, index: str) -> None:  # a hint, after the fenced write landed
        self.store._set_due(key, at, index)

    # --- reads: passed through ---
    def _get_text(self, key: str) -> str | None:
        return self.store._get_text(key)

    def _get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        return self.store._get_with_metadata(key)

    def _list(self, prefix: str, limit: int, cursor: str | None) -> ListResult:
        return self.store._list(prefix, limit, cursor)

    def _read_log(self, log_key: str, start: int, stop: int | None) -> builtins.list[str]:
        return self.store._read_log(log_key, start, stop)

    def _log_length(self, log_key: str) -> int:
        return self.store._log_length(log_key)

    def _lease_owner(self, name: str) -> str | None:
        return self.store._lease_owner(name)

    def _daily_spend(self, day: str) -> tuple[float, float]:
        return self.store._daily_spend(day)

    def _usage(self) -> dict:
        return self.store._usage()

    def _due_at(self, key: str, index: str) -> float | None:
        return self.store._due_at(key, index)

    def _due_range(self, until: float, limit: int, index: str) -> builtins.list[tuple[str, float]]:
        return self.store._due_range(until, limit, index)

    def _due_agents(self, until: float, index: str) -> builtins.list[tuple[str, float]]:
        return self.store._due_agents(until, index)


def unfenced(store: Store) -> Store:
    """The store to write through without the session's lease: the plain store under a
    :class:`FencedStore`, any other store itself."""
    return store.unfenced if isinstance(store, FencedStore) else store
