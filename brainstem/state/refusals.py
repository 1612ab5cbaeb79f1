"""Stops of sandboxed code for secret text, and the hold they put on the agent's code until the operator clears it.

Code in the sandbox holds placeholders only, so secret text in what it sends,
or in what it arranged to be handed, came from a leak or a guess. The runtime
stops it (``secret_refused`` in karma) and holds all of the agent's code: none
runs until the operator has looked and cleared the hold (``brainstem refusals
--clear``). A stop tells a guessing agent that one guess was right; the hold
keeps that to one guess per look by the operator, rather than one per session.
The record is kept apart from karma, for ``status`` and the dashboard.
"""

from __future__ import annotations

from typing import Any

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.state.budget import today
from brainstem.store.base import Store


def _read(store: Store) -> dict[str, Any]:
    return store.get_object(keys.SECRET_REFUSALS)


HELD_MESSAGE = ("the agent's code is held after a secret_refused stop: none runs until the operator has "
                "read that session's karma and cleared it (brainstem refusals --clear)")


def note(store: Store, tool: str) -> None:
    """Count one stop of ``tool`` and hold the agent's code."""
    rec, day = _read(store), today()
    today_count = int(rec.get("today", 0) or 0) if rec.get("date") == day else 0
    store.put(keys.SECRET_REFUSALS, {"total": int(rec.get("total", 0) or 0) + 1, "date": day,
                                     "today": today_count + 1, "last_tool": tool, "last_at": iso(now_utc()),
                                     "held": True})


def held(store: Store) -> bool:
    """Whether the agent's code is held (a stop the operator has not cleared)."""
    return bool(_read(store).get("held"))


def clear(store: Store) -> bool:
    """The operator lifts the hold; returns whether there was one. The counts stay."""
    rec = _read(store)
    if not rec.get("held"):
        return False
    store.put(keys.SECRET_REFUSALS, {**rec, "held": False, "cleared_at": iso(now_utc())})
    return True


def counts(store: Store) -> dict[str, Any]:
    """``{"total", "today", "last_tool", "last_at", "held"}``: every stop recorded, today's, and the hold."""
    rec = _read(store)
    return {"total": int(rec.get("total", 0) or 0),
            "today": int(rec.get("today", 0) or 0) if rec.get("date") == today() else 0,
            "last_tool": rec.get("last_tool"), "last_at": rec.get("last_at"), "held": bool(rec.get("held"))}
