"""Which ``secret:*`` values the agent wrote itself, so they hide nothing from the operator.

Karma, the dashboard and ``brainstem tool run`` redact the secrets they know. The agent may write a
``secret:*`` key (it cannot read one), so if every stored secret counted, the agent could store an ordinary
word ("refund", a host name, its own plan) as a secret and have it blanked from everything the operator
reads. A value the agent wrote is no secret from the agent, so it is not redacted: each write of a
``secret:*`` key through the agent's view first appends the digest of its value to a runtime-owned log
(a delete appends a mark of its own), and a value counts as the agent's only while it is the last one
the agent marked. The operator's ``brainstem kv put`` (or ``del``) of the key clears its marks. A value
nobody marked (the operator's, one put into the store by other means) is redacted as before.
"""

from __future__ import annotations

import hashlib

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.store.base import Store

MAX_MARKS = 64  # per key: only the last counts; the rest are kept to show what the agent wrote
DELETED = "-"  # the mark of a delete: no digest is this


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def note(store: Store, key: str, text: str | None) -> None:
    """The agent is about to write ``text`` to ``key`` (a ``secret:*`` key; None: delete it)."""
    log = keys.agent_secret_log(key)
    if store.append(log, _digest(text) if text is not None else DELETED) > 2 * MAX_MARKS:
        store.trim_log(log, MAX_MARKS)


def forget(store: Store, key: str) -> None:
    """The operator writes ``key``: no mark of the agent's speaks for the value from now on."""
    store.delete_log(keys.agent_secret_log(key))


def agent_wrote(store: Store, key: str, value: str) -> bool:
    """Whether ``value`` of ``key`` is the one the agent wrote last (so it hides nothing). Only the last
    mark counts: the agent marking guesses of a value the operator may store later covers none of them.
    Unreadable marks: no."""
    try:
        marks = store.read_log(keys.agent_secret_log(key), -1)
    except BrainstemError:
        return False
    return bool(marks) and marks[-1] == _digest(value)


def operator_values(store: Store, found: dict[str, str]) -> dict[str, str]:
    """``found`` (label -> value) without the ``secret:*`` values the agent wrote; other labels are kept."""
    return {label: value for label, value in found.items()
            if not (keys.is_secret(label) and agent_wrote(store, label, value))}


def operator_secrets(store: Store) -> dict[str, str]:
    """Every ``secret:*`` value the operator stored (label -> value), for what shows the store to them (the
    dashboard, ``brainstem mcp``): the values the agent wrote are left out, and so is one that is not text."""
    out: dict[str, str] = {}
    for info in store.list_all(keys.SECRET_PREFIX):
        try:
            value = store.get_text(info.name)
        except BrainstemError:
            continue
        if value is not None:
            out[info.name] = value
    return operator_values(store, out)
