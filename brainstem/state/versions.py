"""Versions of self-modified keys, so an operator (or the runtime) can roll them back.

Every write of a privileged key (``prompt:*``, ``config:*``, ``tool:*``,
``provider:*``, ``wisdom``), by the agent or by the operator, appends the new
value to ``history:{key}``, a bounded list of ``{version, value, at,
session_id, source}``. The first write of a key that already had a value
records that value first, as version 1 ("initial"), so the original is never
lost. Version numbers only grow; the oldest versions are dropped past the cap.
"""

from __future__ import annotations

import difflib
from typing import Any

from brainstem.core import keys, outcomes
from brainstem.core.clock import now_iso, parse_iso
from brainstem.core.errors import BrainstemError, NotFound
from brainstem.state import history as session_history
from brainstem.store.base import Store

MAX_VERSIONS = 20
# What auto-restore watches: the keys whose breakage stops a session from planning.
WATCHED = (keys.PROMPT_ORIENT, keys.PROMPT_DEEP, keys.CONFIG_DEFAULTS, keys.CONFIG_MODELS,
           keys.PROVIDER_LLM_CODE, keys.PROVIDER_LLM_META)


def history_key(key: str) -> str:
    return keys.VERSIONS_PREFIX + key


def versions(store: Store, key: str) -> list[dict]:
    raw = store.get_json(history_key(key), default=[])
    if not isinstance(raw, list):
        return []
    return [v for v in raw if isinstance(v, dict) and isinstance(v.get("version"), int)]


VERSIONED = "prompt:*, config:*, tool:*, provider:*, wisdom"


def no_versions_message(key: str) -> str:
    """Why ``key`` has no versions to show: a versionable key not changed yet, or a key never versioned."""
    if keys.is_privileged(key):
        return f"no versions recorded yet for {key}; versions are kept from its first change on"
    return f"{key} is not versioned (only {VERSIONED} are)"


def record_write(store: Store, key: str, old: str | None, new: str | None, *, source: str,
                 session_id: str | None = None) -> int | None:
    """Append ``new`` (None: a delete) as the next version; returns its number."""
    if not keys.is_privileged(key):
        return None
    if _by_operator(source, session_id):
        # Kept apart from the history, which the agent's own writes can fill past its cap, and kept even
        # when the value is the one the agent last wrote: what the operator set is theirs from now on.
        store.put(keys.operator_write(key), {"value": new, "at": now_iso(ms=True), "source": source})
    vs = versions(store, key)
    if not vs and old is not None:
        vs.append({"version": 1, "value": old, "at": None, "session_id": None, "source": "initial"})
    if vs and vs[-1].get("value") == new:
        return vs[-1]["version"]  # writing the same value again is not a new version
    number = (vs[-1]["version"] + 1) if vs else 1
    vs.append({"version": number, "value": new, "at": now_iso(ms=True), "session_id": session_id, "source": source})
    store.put(history_key(key), vs[-MAX_VERSIONS:])
    return number


def find(store: Store, key: str, version: int | None) -> tuple[dict, list[dict]]:
    """A version (default: the one before the current value) and the whole list."""
    vs = versions(store, key)
    if not vs:
        # A key that is never versioned, or a version asked for by number, names nothing: exit 2, like an
        # unknown session. A versionable key not changed yet has nothing to go back to: a state, not a bad name.
        if version is not None or not keys.is_privileged(key):
            raise NotFound(no_versions_message(key))
        raise BrainstemError(no_versions_message(key))
    if version is None:
        if len(vs) < 2:
            raise BrainstemError(f"{key!r} has only one version; nothing to go back to")
        return vs[-2], vs
    for v in vs:
        if v["version"] == version:
            return v, vs
    have = ", ".join(str(v["version"]) for v in vs)
    raise NotFound(f"{key!r} has no version {version} (kept: {have})")


def diff(store: Store, key: str, version: int | None = None) -> str:
    """Unified diff from a version (default: the previous one) to the current value."""
    old, _ = find(store, key, version)
    return unified_diff(old.get("value") or "", store.get(key) or "", f"{key} (version {old['version']})",
                        f"{key} (current)")


def unified_diff(before: str, after: str, fromfile: str, tofile: str) -> str:
    """``before`` to ``after`` as a unified diff ("" when they are the same); a last line without its
    newline is shown as if it had one."""
    a = [line if line.endswith("\n") else line + "\n" for line in before.splitlines(keepends=True)]
    b = [line if line.endswith("\n") else line + "\n" for line in after.splitlines(keepends=True)]
    return "".join(difflib.unified_diff(a, b, fromfile=fromfile, tofile=tofile))


def rollback(store: Store, key: str, version: int | None = None, *, source: str = "operator:rollback",
             session_id: str | None = None) -> dict:
    """Restore a version (default: the previous one); the restore is itself a new version."""
    target, _ = find(store, key, version)
    current = store.get(key)
    value = target.get("value")
    if value is None:
        store.delete(key)
    else:
        store.put(key, value)
    new_version = record_write(store, key, current, value, source=source, session_id=session_id)
    return {"key": key, "restored_version": target["version"], "new_version": new_version}


def snapshot(store: Store) -> dict[str, Any]:
    """The watched keys as a session starts with them."""
    return {k: store.get(k) for k in WATCHED}


def save_clean_snapshot(store: Store, snap: dict[str, Any], session_id: str, taken_at: str | None = None) -> None:
    """``snap`` as the last clean session's, ``at`` the time it was taken (the session's start): a write the
    operator made while that session ran is newer than what it ran with, and stands."""
    store.put(keys.LAST_CLEAN_SNAPSHOT, {"session_id": session_id, "at": taken_at or now_iso(ms=True),
                                        "values": snap})


# The agent's own failures. Interruptions and operator/infrastructure faults (a bad key, no credit,
# an outage, the store going away) are never the agent's: they neither count nor break a streak's count.
FAILING_OUTCOMES = outcomes.FAILING
NEUTRAL_OUTCOMES = (outcomes.INTERRUPTED, *outcomes.OPERATOR_FAULTS)


def failing_streak(entries: list) -> list[str]:
    """Ids of the sessions that failed in a row at the end of the history (crash, no plan, error)."""
    streak = []
    for h in reversed(entries):
        if not isinstance(h, dict) or h.get("outcome") in NEUTRAL_OUTCOMES:
            continue
        if h.get("outcome") not in FAILING_OUTCOMES:
            break
        streak.append(str(h.get("id")))
    return list(reversed(streak))


def auto_restore(store: Store, session_id: str, threshold: int = 3) -> dict | None:
    """After ``threshold`` failing sessions in a row, restore the last clean session's versions, once per streak."""
    streak = failing_streak(session_history.recent(store, 100))
    if len(streak) < threshold:
        return None
    mark = store.get_json(keys.AUTO_RESTORE_MARK, default={})
    if isinstance(mark, dict) and mark.get("streak_start") == streak[0]:
        return None  # already restored for this streak: do not loop
    restored = restore_last_clean(store, session_id)
    store.put(keys.AUTO_RESTORE_MARK, {"streak_start": streak[0], "at": now_iso(ms=True), "session_id": session_id,
                                  "restored": restored})
    return {"failed_sessions": streak, "restored": restored}


def restore_last_clean(store: Store, session_id: str, only: tuple[str, ...] = WATCHED,
                       saved: dict | None = None) -> list[str]:
    """Put back every watched key (of ``only``) that differs from what the last clean session ran with
    (or ``saved``: ``{"at", "values"}``). What the operator wrote since is theirs: a key whose value the
    operator set after that session is put back to the operator's value, never past it."""
    saved = saved if saved is not None else store.get_json(keys.LAST_CLEAN_SNAPSHOT, default=None)
    if not isinstance(saved, dict) or not isinstance(saved.get("values"), dict):
        return []
    restored = []
    for key, value in saved["values"].items():
        if key not in WATCHED or key not in only:
            continue
        mine = operator_value_since(store, key, saved.get("at"))
        if mine is not None:
            value = mine[0]
        current = store.get(key)
        if current == value:
            continue
        if value is None:
            store.delete(key)
        else:
            store.put(key, value)
        record_write(store, key, current, value, source="runtime:auto_restore", session_id=session_id)
        restored.append(key)
    return restored


def operator_value_since(store: Store, key: str, at: Any) -> tuple[str | None] | None:
    """``(value,)`` of the operator's latest write of ``key`` after ``at`` (an ISO time; None: ever), or
    None when the operator has not written it since."""
    since = parse_iso(at)
    mine = store.get_json(keys.operator_write(key), default=None)
    if isinstance(mine, dict) and parse_iso(mine.get("at")) is not None:
        written = parse_iso(mine.get("at"))
        if since is not None and written is not None and written < since:
            return None
        value = mine.get("value")
        return (value if isinstance(value, str) else None,)
    for v in reversed(versions(store, key)):  # a store from before operator writes were kept apart
        if who_wrote(v) != "operator":
            continue
        written = parse_iso(v.get("at"))
        if since is None or (written is not None and written >= since):
            value = v.get("value")
            return (value if isinstance(value, str) else None,)
        return None
    return None


# --- every change, across keys ---

def _by_operator(source: str, session_id: str | None) -> bool:
    return session_id is None and source.startswith(("operator", "seed"))


def who_wrote(version: dict) -> str:
    """Who a version came from: the session that wrote it, the operator, or the runtime."""
    source = str(version.get("source") or "")
    if version.get("session_id"):
        return str(version["session_id"])
    if source.startswith(("operator", "seed")):
        return "operator"
    return source.split(":", 1)[0] or "unknown"


def changes(store: Store, since: Any = None) -> list[dict]:
    """Every recorded write of a versioned key, across keys, oldest first: ``{at, key, version,
    who, source, session_id, deleted, bytes}``. ``since`` (a datetime) keeps the changes made at or
    after it. The value a key had before its history began (version 1, ``initial``) is not a change
    and is left out; values are left out too (``brainstem history KEY --json`` has them)."""
    out = []
    for info in store.list_all(keys.VERSIONS_PREFIX):
        key = info.name[len(keys.VERSIONS_PREFIX):]
        if info.is_log or not keys.is_privileged(key):
            continue
        for v in versions(store, key):
            at = parse_iso(v.get("at"))
            if at is None or (since is not None and at < since):
                continue
            value = v.get("value")
            out.append({"at": v.get("at"), "key": key, "version": v["version"], "who": who_wrote(v),
                        "source": v.get("source"), "session_id": v.get("session_id"), "deleted": value is None,
                        "bytes": None if value is None else len(str(value).encode())})
    out.sort(key=lambda c: (parse_iso(c["at"]), c["key"], c["version"]))
    return out
