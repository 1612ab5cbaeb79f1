"""Which ``secret:*`` values the agent wrote itself, so they hide nothing from the operator.

Karma, the dashboard and ``brainstem tool run`` redact the secrets they know. The agent may write a
``secret:*`` key (it cannot read one), so if every stored secret counted, the agent could store an ordinary
word ("refund", a host name, its own plan) as a secret and have it blanked from everything the operator
reads. A value the agent wrote is no secret from the agent, so it is not redacted: each write of a
``secret:*`` key through the agent's view first appends the digest of its value to a runtime-owned log
(the append is atomic, and comes before the value, so no order of writes leaves an agent's value
unmarked). A value nobody marked (the operator's ``brainstem kv put``, a value put into the store by
other means) is redacted as before.
"""

from __future__ import annotations

import hashlib

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.store.base import Store

MAX_MARKS = 64  # per key: enough for the values a run of writes races through


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def note(store: Store, key: str, text: str) -> None:
    """The agent is about to write ``text`` to ``key`` (a ``secret:*`` key): mark it as the agent's."""
    log = keys.agent_secret_log(key)
    if store.append(log, _digest(text)) > 2 * MAX_MARKS:
        store.trim_log(log, MAX_MARKS)


def agent_wrote(store: Store, key: str, value: str) -> bool:
    """Whether ``value`` of ``key`` is one the agent wrote (so it hides nothing). Unreadable marks: no."""
    try:
        return _digest(value) in store.read_log(keys.agent_secret_log(key))
    except BrainstemError:
        return False


def operator_values(store: Store, found: dict[str, str]) -> dict[str, str]:
    """``found`` (label -> value) without the ``secret:*`` values the agent wrote; other labels are kept."""
    return {label: value for label, value in found.items()
            if not (keys.is_secret(label) and agent_wrote(store, label, value))}
