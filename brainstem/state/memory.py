"""Memory hygiene: which keys the agent actually uses, so deep reflection can prune and reorganise.

Reads are counted in the session (a Counter, no I/O) and merged into
``stats:reads`` once at the end: one read-modify-write per session, bounded
by the number of keys. Notes the agent leaves itself are kept with the time
each was written (``stats:notes``), so deep reflection treats them as memory,
not as truth.

Notes and the summary's key names reach prompts only marked untrusted
(:func:`notes_for_prompt`, and deep reflection marks :func:`summary`): a note
is the agent's own words but may quote tool output, and tools choose key names.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import now_iso
from brainstem.core.untrusted import Untrusted
from brainstem.store.base import Store

MAX_NOTES = 20
IGNORED = ("karma:", "history:", "stats:", "session:", "__")


def flush_reads(store: Store, reads: Counter, session_number: int) -> None:
    if not reads:
        return
    stats = store.get_json(keys.READS, default={})
    stats = stats if isinstance(stats, dict) else {}
    now = now_iso(ms=True)
    for key, n in reads.items():
        rec = stats.get(key) if isinstance(stats.get(key), dict) else {"count": 0}
        stats[key] = {"count": int(rec.get("count", 0)) + n, "last_read": now, "last_session": session_number}
    store.put(keys.READS, stats)


def remember_note(store: Store, note: str, session_id: str) -> None:
    if not isinstance(note, str) or not note.strip():
        return
    notes = store.get_json(keys.NOTES, default=[])
    notes = notes if isinstance(notes, list) else []
    notes.append({"session_id": session_id, "written_at": now_iso(ms=True), "note": note[:2000]})
    store.put(keys.NOTES, notes[-MAX_NOTES:])


def notes_for_prompt(store: Store) -> Untrusted:
    """The notes of past selves, each with when it was written, marked untrusted for a prompt."""
    notes = store.get_json(keys.NOTES, default=[])
    return Untrusted(notes if isinstance(notes, list) else [], "memory:notes")


def summary(store: Store, session_number: int, stale_after: int = 20, top: int = 10,
            max_keys: int = 2000) -> dict[str, Any]:
    """Hot keys, keys not read in ``stale_after`` sessions (or never), the largest keys, and past notes."""
    stats = store.get_json(keys.READS, default={})
    stats = stats if isinstance(stats, dict) else {}
    # Only keys the agent can act on: the soul and the runtime's own keys (session_history, wake_config...)
    # cannot be pruned, and a kv_operations batch naming one of them is rejected whole.
    names = [k.name for k in store.list_all(limit=max_keys)
             if not k.is_log and not k.name.startswith(IGNORED) and not keys.is_runtime_owned(k.name)]
    hot = sorted(((k, v.get("count", 0)) for k, v in stats.items() if isinstance(v, dict) and k in names),
                 key=lambda kv: -kv[1])[:top]
    stale = [k for k in names
             if not isinstance(stats.get(k), dict) or session_number - stats[k].get("last_session", 0) >= stale_after]
    sizes = sorted(((k, len(store.get(k) or "")) for k in names), key=lambda kv: -kv[1])[:top]
    notes = store.get_json(keys.NOTES, default=[])
    return {"hotKeys": [{"key": k, "reads": n} for k, n in hot],
            "notReadRecently": stale[:50], "notReadRecentlyCount": len(stale),
            "largestKeys": [{"key": k, "chars": n} for k, n in sizes],
            "pastNotes": notes if isinstance(notes, list) else []}
