"""The due index: when each of an agent's schedules next needs the runner, so that finding what is due
costs in proportion to what is due, not to how many agents and schedules a store holds.

Each entry is a key of the view and a time (unix seconds). The entries of ``schedule:ID`` keys are kept by
the store itself: every write of one through Brainstem (the runner's claims, the operator's commands, the
agent's checked writes, ``kv put``, ``kv del``) sets its entry from the value written (:func:`due_of`). The
entry :data:`LOOK` (the bare prefix ``schedule:``, which no schedule can name) is when the agent's next full
look at its schedules is due (one due at once is set by the first write of a schedule of an agent never
looked at): the slow safety net that finds a schedule written around Brainstem.

A sibling index, the wake index (:data:`WAKES`), says when an agent may need a session woken by the daemon
outside its schedule, kept the same way by the store's own writes: an urgent message from the operator
(every write of ``stats:inbox_urgent`` sets the entry :data:`URGENT` due at once) and a session whose host may
have died (every take and renewal of the wake lease sets the entry :data:`LEASE` due when the lease would run
out). The daemon's watch (:mod:`brainstem.daemon.wakes`) reads it each second, decides from the real keys, and
sets or removes the entry from what it found.

An index is a hint, never trusted over the keys themselves: a run is decided by reading the schedule again
under its claim lease, a wake by reading the inbox marks, the schedule and the lease, and a full look
corrects every entry of the agent. An agent's entries are its own (under its prefix); the index across
agents (each agent's earliest entry), which the daemon asks each second, is the store's internals and only
the operator's view (the default agent's) reads it.
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from brainstem.core import clock
from brainstem.core.errors import BrainstemError, ForeignAgentKey
from brainstem.core.keys import INBOX_URGENT, SCHEDULE_PREFIX, WAKE_LEASE

SCHEDULES = ""  # the due index of the agents' schedules
WAKES = "wake"  # the wake index: urgent messages and wake leases, for the daemon's watch
INDEXES = (SCHEDULES, WAKES)
LOOK = SCHEDULE_PREFIX  # the entry of the agent's next full look at its schedules
URGENT = INBOX_URGENT  # the wake index's entry of an urgent message that may wait
LEASE = WAKE_LEASE  # the wake index's entry of a session's wake lease: due when it would run out


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

    def due_at(self, key: str, index: str = SCHEDULES) -> float | None:
        """This view's entry for ``key`` (in ``index``: :data:`SCHEDULES` or :data:`WAKES`); None when none."""
        return self._due_at(key, _known(index)) if self._readable(key) else None

    def set_due(self, key: str, at: float | None, index: str = SCHEDULES) -> None:
        """Set this view's entry for ``key`` (None: remove it)."""
        self._ready()
        self.check_writable(key)
        self._set_due(key, at, _known(index))

    def due_keys(self, until: float = float("inf"), limit: int = 1000,
                 index: str = SCHEDULES) -> builtins.list[tuple[str, float]]:
        """This view's entries due by ``until``, earliest first, at most ``limit``."""
        self._ready(write=False)
        return self._due_range(until, limit, _known(index))

    def due_first(self, index: str = SCHEDULES) -> tuple[str, float] | None:
        """This view's earliest entry (one read)."""
        first = self.due_keys(limit=1, index=index)
        return first[0] if first else None

    def due_agents(self, until: float, index: str = SCHEDULES) -> builtins.list[tuple[str | None, float]]:
        """Every agent whose earliest entry is due by ``until`` (None: the default agent), with that time,
        earliest first. The operator's view only: the index across agents is the store's internals."""
        if self.prefix:
            raise ForeignAgentKey(f"agent {self.prefix[:-1]!r} cannot read the index across agents: only the "
                                  "operator's view of the store (the default agent's) does")
        return [(name or None, at) for name, at in self._due_agents(until, _known(index))]

    def _note_due(self, key: str, text: str | None) -> None:
        """After a write of ``key``: its entry, when it is a schedule's or the urgent mark. The write has
        landed, and the index is a hint: a failure here leaves the entry for the next full look to correct."""
        try:
            if key == URGENT:  # an urgent message may wait: the daemon's watch looks at once
                self._set_due(URGENT, None if text is None else now(), WAKES)
            if not key.startswith(SCHEDULE_PREFIX) or key == LOOK:
                return
            t = now()
            self._set_due(key, due_of(text, t), SCHEDULES)
            if self._due_at(LOOK, SCHEDULES) is None:  # never looked at: the next look is a full one
                self._set_due(LOOK, t, SCHEDULES)
        except BrainstemError:
            pass

    def _note_lease(self, name: str, ttl_ms: int, held: bool) -> bool:
        """After a take or renewal of the lease ``name`` for ``ttl_ms`` (``held``: it went through, returned):
        the wake lease's entry in the wake index, due when the lease would run out (a session whose host died
        is found then). A hint, as :meth:`_note_due`'s."""
        if held and name == WAKE_LEASE:
            try:
                self._set_due(LEASE, now() + ttl_ms / 1000, WAKES)
            except BrainstemError:
                pass
        return held

    # --- primitives (each backend): the key is this view's own, ``index`` one of INDEXES ---
    def _due_at(self, key: str, index: str) -> float | None: raise NotImplementedError
    def _set_due(self, key: str, at: float | None, index: str) -> None: raise NotImplementedError
    def _due_range(self, until: float, limit: int, index: str) -> builtins.list[tuple[str, float]]:
        raise NotImplementedError
    def _due_agents(self, until: float, index: str) -> builtins.list[tuple[str, float]]: raise NotImplementedError


def _known(index: str) -> str:
    if index not in INDEXES:
        raise ValueError(f"no due index {index!r} (one of {INDEXES})")
    return index
