"""How often sandboxed code was stopped for sending a secret's value, where ``status`` and the dashboard show it.

Code in the sandbox holds placeholders only, so a value in what it sends came
from a leak or a guess: the runtime stops it and withdraws the session's
grants (``secret_refused`` in karma). The count is kept apart from karma so the
operator sees it without reading every session.
"""

from __future__ import annotations

from typing import Any

from . import keys
from .budget import today
from .errors import BrainstemError
from .kv.base import Store
from .sleep import iso, now_utc


def _read(store: Store) -> dict[str, Any]:
    try:
        rec = store.get_json(keys.SECRET_REFUSALS, default=None)
    except BrainstemError:
        rec = None
    return rec if isinstance(rec, dict) else {}


def note(store: Store, tool: str) -> None:
    """Count one stop of ``tool``."""
    rec, day = _read(store), today()
    today_count = int(rec.get("today", 0) or 0) if rec.get("date") == day else 0
    store.put(keys.SECRET_REFUSALS, {"total": int(rec.get("total", 0) or 0) + 1, "date": day,
                                     "today": today_count + 1, "last_tool": tool, "last_at": iso(now_utc())})


def counts(store: Store) -> dict[str, Any]:
    """``{"total", "today", "last_tool", "last_at"}``: every stop recorded, and today's."""
    rec = _read(store)
    return {"total": int(rec.get("total", 0) or 0),
            "today": int(rec.get("today", 0) or 0) if rec.get("date") == today() else 0,
            "last_tool": rec.get("last_tool"), "last_at": rec.get("last_at")}
