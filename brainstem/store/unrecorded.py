"""Session ends the store could not take: kept on local disk until the next wake can record them.

A session that loses its store for longer than it waits (an outage of more than
a few seconds) cannot write its own end. Without a note, the next wake finds
its breadcrumb and records it as ``crashed``, which is the agent's fault and
counts towards auto-restore: an operator's Redis maintenance would roll back
the agent's work. So the session leaves a note here, in the runtime's state
directory (``$XDG_STATE_HOME/brainstem/unrecorded``, else
``~/.local/state/brainstem/unrecorded``), and the next wake on this host
records the end the note names. A wake on another host, which cannot see the
note, still records ``crashed``.

Notes are tiny, owner-only, keyed by the store and agent, and deleted once the
end is recorded: by the wake that records it, or, when a wake on another host
closed the session first, by the next wake here (:func:`sweep`). A note that
cannot be written is no worse than none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from brainstem.core import environment


def _dir() -> Path:
    return environment.state_home() / "brainstem" / "unrecorded"


def _agent(store_id: str) -> str:
    return hashlib.sha256(store_id.encode("utf-8")).hexdigest()[:16]


def _path(store_id: str, session_id: str) -> Path:
    safe = "".join(c for c in session_id if c.isalnum() or c == "-")[:64]
    return _dir() / f"{_agent(store_id)}-{safe}.json"


def remember(store_id: str, session_id: str, outcome: str, reason: str | None) -> bool:
    """Leave a note that ``session_id`` ended with ``outcome``; False when it could not be written."""
    try:
        d = _dir()
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        p = _path(store_id, session_id)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"session_id": session_id, "outcome": outcome, "reason": reason}, f)
        return True
    except OSError:
        return False


def recall(store_id: str, session_id: str | None) -> dict | None:
    """The note for ``session_id``, or None (none, or unreadable)."""
    if not session_id:
        return None
    try:
        note = json.loads(_path(store_id, session_id).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(note, dict) and note.get("session_id") == session_id and isinstance(note.get("outcome"), str):
        return note
    return None


def forget(store_id: str, session_id: str) -> None:
    try:
        _path(store_id, session_id).unlink()
    except OSError:
        pass


def sweep(store_id: str, keep: str | None) -> list[str]:
    """Delete this store's notes but the one for session ``keep`` (the session the store still has to
    close, if any); returns the sessions whose notes went. Every other session of the store is closed
    already, by a wake on any host, so no wake will ever read its note."""
    try:
        paths = sorted(_dir().glob(f"{_agent(store_id)}-*.json"))
    except OSError:
        return []
    swept = []
    for p in paths:
        if keep is not None and p == _path(store_id, keep):
            continue
        try:
            p.unlink()
        except OSError:
            continue
        swept.append(p.stem[len(_agent(store_id)) + 1:])
    return swept
