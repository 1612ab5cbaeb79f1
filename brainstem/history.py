"""``session_history``: one summary per session, bounded, and what keeps karma bounded with it.

Every session ends with an entry (outcome, cost, steps, duration, summary).
The history keeps the last ``HISTORY_MAX`` entries; a session that leaves it
takes its karma along, and karma older than the retention age is dropped
while its summary stays (both in the same write that adds an entry). Together they keep the store flat however long the
agent lives.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from . import events, keys
from .karma import Karma
from .kv.base import Store
from .sleep import now_utc, parse_iso

HISTORY_MAX = 1000


def read(store: Store) -> list[dict]:
    h = store.get_json(keys.SESSION_HISTORY, default=[])
    return [e for e in h if isinstance(e, dict)] if isinstance(h, list) else []


def append(store: Store, entry: dict, retention_days: float | None = None, now: datetime | None = None) -> int:
    """Add ``entry``; drop the karma of sessions that leave the history or pass the retention age
    (counted back from ``now``, the end of the session being added).

    One read and one write of the history, however much is trimmed. Returns how many
    sessions' karma expired by age.
    """
    history = read(store)
    history.append(entry)
    # A session that leaves the history takes its karma with it.
    for dropped in history[:-HISTORY_MAX]:
        if isinstance(dropped.get("id"), str) and not dropped.get("karma_expired"):
            store.delete_log(keys.karma(dropped["id"]))
    history = history[-HISTORY_MAX:]
    expired = 0
    if retention_days is not None:
        cutoff = (now or now_utc()) - timedelta(days=retention_days)
        for h in history:
            if h is entry or h.get("karma_expired") or not isinstance(h.get("id"), str):
                continue
            when = parse_iso(h.get("ended_at") or h.get("started_at"))
            if when is not None and when < cutoff:
                store.delete_log(keys.karma(h["id"]))
                h["karma_expired"] = True
                expired += 1
    store.put(keys.SESSION_HISTORY, history)
    return expired


def close_dead_session(store: Store, crumb: dict, outcome: str, **fields: Any) -> None:
    """Record the end of a session that cannot record it itself (it crashed, or was cut off):
    an entry in the history and a ``session_end`` in its own karma."""
    sid = crumb.get("id")
    append(store, {"id": sid, "outcome": outcome, "started_at": crumb.get("started_at"), **fields})
    if sid:
        Karma(store, sid).record(events.SESSION_END, outcome=outcome, **fields)
