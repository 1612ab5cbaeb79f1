"""The dead: a session whose breadcrumb is still there when the next wake starts.

The next wake closes it (once: closing is idempotent, so a wake killed while
closing it does not record it twice) and shows orient what it was doing when it
died: its breadcrumb and the capped tail of its karma, marked untrusted (it
holds what tools returned). A session that lost its store and left a note on
local disk (:mod:`brainstem.store.unrecorded`) is closed with the outcome the note
names, not as a crash; a note about a session that a wake on another host closed
first is swept by the next wake here (:func:`sweep_notes`).
"""

from __future__ import annotations

from collections.abc import Callable

from brainstem.core import events, keys, outcomes
from brainstem.core.untrusted import untrusted
from brainstem.state import history as session_history
from brainstem.store import karma as karma_mod
from brainstem.store import unrecorded
from brainstem.store.base import Store
from brainstem.store.lease import host_name

CRASH_ENTRIES = 40
CRASH_ENTRY_CHARS = 600


def crash_data(store: Store, breadcrumb: dict) -> dict:
    """What orient learns of a dead session: its breadcrumb and the tail of its karma, capped."""
    dead_id = breadcrumb.get("id")
    if not dead_id:
        return {"session_id": None, "note": "the last session died; its breadcrumb was unreadable",
                "breadcrumb": untrusted(breadcrumb.get("raw"), "karma:breadcrumb")}
    entries = karma_mod.read(store, dead_id, start=-CRASH_ENTRIES)
    total = store.log_length(keys.karma(dead_id))
    capped = []
    for e in entries:
        text = karma_mod.encode_entry(e)
        capped.append(e if len(text) <= CRASH_ENTRY_CHARS else {"event": e.get("event"), "t": e.get("t"),
                                                                 "truncated": text[:CRASH_ENTRY_CHARS]})
    # Its karma holds what its tools returned, logged and raised: untrusted, wrapped when rendered.
    data = {"session_id": dead_id, "started_at": breadcrumb.get("started_at"), "entries_total": total,
            "last_entries": untrusted(capped, f"karma:{dead_id}")}
    if total == 0:
        data["note"] = "the last session died before recording anything"
    return data


def _lease_lost_entry(store: Store, session_id: str | None) -> dict | None:
    """The ``lease_lost`` entry a session that lost its lease left at the end of its karma, if any."""
    if not session_id:
        return None
    tail = karma_mod.read(store, session_id, start=-3)
    return next((e for e in reversed(tail) if e.get("event") == events.LEASE_LOST), None)


def close_dead(store: Store, breadcrumb: dict, detected_by: str,
               on_reject: Callable[[str], None] | None = None) -> dict | None:
    """Close the session ``breadcrumb`` names, if nobody has; return what orient should learn of it when
    it crashed (None when it was closed already, or ended for a reason that is no crash)."""
    data = crash_data(store, breadcrumb)
    note = unrecorded.recall(store.display_url, breadcrumb.get("id"))
    lost = _lease_lost_entry(store, breadcrumb.get("id"))
    if lost is not None and note is None:  # its lease was lost and it stopped: the runtime's doing, not the agent's
        outcome = outcomes.STORE_UNAVAILABLE if lost.get("cause") == "store_unavailable" else outcomes.INTERRUPTED
        action = {"operator_action": outcomes.operator_action(outcome)} if outcomes.operator_action(outcome) else {}
        closed = session_history.close_dead_session(
            store, breadcrumb, outcome, detected_by=detected_by, on_reject=on_reject,
            reason=f"its wake lease was lost: {lost.get('reason')}"[:300], **action)
    elif note is not None:  # it lost the store, and left word of it here
        closed = session_history.close_dead_session(
            store, breadcrumb, note["outcome"], detected_by=detected_by, on_reject=on_reject,
            reason=note.get("reason"), operator_action=outcomes.operator_action(note["outcome"]))
        unrecorded.forget(store.display_url, breadcrumb["id"])
    elif breadcrumb.get("host") and breadcrumb.get("host") != host_name():
        # Another host stopped renewing its lease: it may have died, or frozen, or lost the store or the
        # network while its session ran on. From here that cannot be told apart, and none of it is the
        # agent's doing: not a crash, and it never counts towards auto-restore.
        closed = session_history.close_dead_session(
            store, breadcrumb, outcomes.HOST_LOST, detected_by=detected_by, on_reject=on_reject,
            reason=f"host {breadcrumb.get('host')!r} stopped renewing the wake lease"[:300],
            operator_action=outcomes.operator_action(outcomes.HOST_LOST))
    else:  # on this host, its process is gone: it crashed
        closed = session_history.close_dead_session(store, breadcrumb, outcomes.CRASHED, detected_by=detected_by,
                                                    on_reject=on_reject)
    # Closed now as a crash (or cut off with its host), or a breadcrumb too damaged to name its session:
    # orient hears of it, to pick the work up.
    if ((closed is not None and closed.get("outcome") in (outcomes.CRASHED, outcomes.HOST_LOST))
            or (closed is None and breadcrumb.get("id") is None)):
        return data
    return None


def sweep_notes(store: Store) -> list[str]:
    """Delete this host's notes about sessions of ``store`` that are closed. Every close, on any host,
    clears or replaces the breadcrumb, so only the session the breadcrumb names can still use its note;
    the others' notes would stay on disk for ever. Returns the sessions whose notes went."""
    breadcrumb = karma_mod.read_breadcrumb(store)
    return unrecorded.sweep(store.display_url, keep=breadcrumb.get("id") if breadcrumb else None)
