"""The due index: when each of an agent's schedules next needs the runner, so that finding what is due
costs in proportion to what is due, not to how many agents and schedules a store holds.

Each entry is a key of the view and a time (unix seconds). The entries of ``schedule:ID`` keys are kept by
the store itself: every write of one through Brainstem (the runner's claims, the operator's commands, the
agent's checked writes, ``kv put``, ``kv del``) sets its entry from the value written (:func:`due_of`). The
entry :data:`LOOK` (the bare prefix ``schedule:``, which no schedule can name) is when the agent's next full
look at its schedules is due (one due at once is set by the first write of a schedule of an agent never
looked at): the slow safety net that finds a schedule written around Brainstem.

An index is a hint, never trusted over the schedule itself: a run is decided by reading the schedule again
under its claim lease, and a full look corrects every entry of the agent. An agent's entries are its own
(under its prefix); the index across agents (each agent's earliest entry), which the daemon asks each
second, is the store's internals and only the operator's view (the default agent's) reads it.
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from brainstem.core import clock
from brainstem.core.errors import BrainstemError, ForeignAgentKey
from brainstem.core.keys import SCHEDULE_PREFIX

LOOK = SCHEDULE_PREFIX  # the entry of the agent's next full look at its schedules


def due_of(text: str | None, now: float) -> float | None:
    """When the runner should next look at the schedule whose stored text is ``text`` (None: never; the key
    is gone, or the schedule is paused). A run under way stays due, so every look (a wake's, a daemon's
    tick) asks whether its process died, as a look did before the index. What needs reads of other keys (a
    run's lease, what the runner has already reported) is left to the look: here a value that is not a
    schedule is due at once."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return now
    if not isinstance(raw, dict):
        return now
    if raw.get("last_run") and raw.get("last_outcome") is None:
        return now  # a run under way, or one that died: each look asks which
    if raw.get("enabled", True) is False:
        return None
    t = clock.parse_iso(raw.get("next_run"))
    return now if t is None else t.timestamp()


def now() -> float:
    """The runtime's clock as unix seconds (what the index's times are)."""
    return clock.now_utc().timestamp()


class DueIndex:
    """The store protocol's due index; each method confines the view, then calls the backend's primitive."""

    prefix: str = ""

    # what the store itself provides (see brainstem.store.base.Store)
    def _ready(self, write: bool = True) -> None: raise NotImplementedError
    def _readable(self, key: Any) -> bool: raise NotImplementedError
    def check_writable(self, key: Any) -> Any: raise NotImplementedError

    def due_at(self, key: str) -> float | None:
        """This view's entry for ``key``; None when it has none."""
        return self._due_at(key) if self._readable(key) else None

    def set_due(self, key: str, at: float | None) -> None:
        """Set this view's entry for ``key`` (None: remove it)."""
        self._ready()
        self.check_writable(key)
        self._set_due(key, at)

    def due_keys(self, until: float = float("inf"), limit: int = 1000) -> builtins.list[tuple[str, float]]:
        """This view's entries due by ``until``, earliest first, at most ``limit``."""
        self._ready(write=False)
        return self._due_range(until, limit)

    def due_first(self) -> tuple[str, float] | None:
        """This view's earliest entry (one read)."""
        first = self.due_keys(limit=1)
        return first[0] if first else None

    def due_agents(self, until: float) -> builtins.list[tuple[str | None, float]]:
        """Every agent whose earliest entry is due by ``until`` (None: the default agent), with that time,
        earliest first. The operator's view only: the index across agents is the store's internals."""
        if self.prefix:
            raise ForeignAgentKey(f"agent {self.prefix[:-1]!r} cannot read the index across agents: only the "
                                  "operator's view of the store (the default agent's) does")
        return [(name or None, at) for name, at in self._due_agents(until)]

    def _note_due(self, key: str, text: str | None) -> None:
        """After a write of ``key``: its entry, when it is a schedule's. The write has landed, and the
        index is a hint: a failure here leaves the entry for the next full look to correct."""
        if not key.startswith(SCHEDULE_PREFIX) or key == LOOK:
            return
        try:
            t = now()
            self._set_due(key, due_of(text, t))
            if self._due_at(LOOK) is None:  # never looked at: the next look at the agent's schedules is a full one
                self._set_due(LOOK, t)
        except BrainstemError:
            pass

    # --- primitives (each backend): the key is this view's own ---
    def _due_at(self, key: str) -> float | None: raise NotImplementedError
    def _set_due(self, key: str, at: float | None) -> None: raise NotImplementedError
    def _due_range(self, until: float, limit: int) -> builtins.list[tuple[str, float]]: raise NotImplementedError
    def _due_agents(self, until: float) -> builtins.list[tuple[str, float]]: raise NotImplementedError
