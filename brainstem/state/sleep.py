"""The sleep path: is the agent meant to be asleep? Answered with the lightest imports possible.

cron runs ``brainstem wake`` every few minutes and most runs find the agent
asleep, so this path imports only the store backend and the standard
library: no pydantic, no click, no HTTP client, no web3.
"""

from __future__ import annotations

import json
import random
import zlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from brainstem.core import environment, keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import BrainstemError
from brainstem.state.inbox import urgent_pending
from brainstem.store import open_store
from brainstem.store.due import LOOK
from brainstem.store.lease import held_alive, holder_is_dead

if TYPE_CHECKING:
    from brainstem.store.base import Store


def sleeping_until(wake_config: Any, now: datetime) -> datetime | None:
    """The future time the agent sleeps until, or None when it is due (missing or broken config: due)."""
    if not isinstance(wake_config, dict):
        return None
    t = parse_iso(wake_config.get("next_wake_after"))
    return t if t is not None and t > now else None


RELOOK = 600.0  # seconds between full looks at an agent's schedules: the safety net of the due index
PESSIMISTIC = "runtime:pessimistic"  # wake_config.set_by while a session runs: if it is still so later, it died


def agent_sleeping_until(store: Store, wake_config: Any, leased: bool = False,
                         urgent: bool = True) -> datetime | None:
    """When the agent is next due, or None when it is due now.

    While a session runs, ``wake_config`` holds its pessimistic advance. Found with no lease held
    (``leased``: we hold it ourselves), that session died, its host perhaps with it: the agent is due
    again at the advance's ``retry_after`` (at once after a first crash, then backing off), not at
    the end of the whole default sleep.

    An urgent message from the operator that no session has been shown yet makes a sleeping agent
    due now (``urgent``: False asks what the schedule alone says), unless a session is running: that
    one's end lets the next wake see it."""
    now = now_utc()
    until = sleeping_until(wake_config, now)
    if until is None:
        return None
    if not isinstance(wake_config, dict) or wake_config.get("set_by") != PESSIMISTIC:
        return None if urgent and urgent_pending(store) else until
    retry = parse_iso(wake_config.get("retry_after"))
    if retry is not None and retry >= until:
        retry = None
    now_for_urgent = urgent and urgent_pending(store)
    if retry is None and not now_for_urgent:
        return until
    if not leased:
        holder = store.lease_owner(keys.WAKE_LEASE)
        if holder is not None and not holder_is_dead(holder):
            return until  # running (here or on another host): its own end will set the schedule
    if now_for_urgent:
        return None
    return None if retry <= now else retry


def schedules_due(store: Store, now: datetime | None = None) -> bool:
    """Whether the agent's schedules need the runner now, whatever its own sleep says: a schedule's
    ``next_run`` has come (or it has none yet), a run of one died (it started, has no outcome, and its
    run lease is gone), or a value under ``schedule:`` is not a schedule and has not been reported.

    For the sleep path: one read of the agent's due index (:mod:`brainstem.store.due`) while nothing in
    it is due; a full look (a list call, a get for each schedule) when the index has nothing of the
    agent's or its next full look is due, every :data:`RELOOK` seconds. A value the runner already
    reported as not a schedule is not due again until it changes, so a broken schedule never sends every
    tick down the full path."""
    return bool(due_now(store, now))


def due_now(store: Store, now: datetime | None = None) -> list[str]:
    """The keys under ``schedule:`` that need the runner now, found from the agent's due index; each entry
    found wrong on the way is corrected. A full look (:func:`full_look`) when the index has no entry of
    the agent's, or its :data:`~brainstem.store.due.LOOK` entry is due."""
    now = now or now_utc()
    first = store.due_first()
    if first is not None and first[1] > now.timestamp():
        return []
    entries = [k for k, _ in store.due_keys(until=now.timestamp())] if first is not None else []
    if first is None or LOOK in entries:
        return full_look(store, now)
    return recheck(store, entries, now)


def recheck(store: Store, keys_: list[str], now: datetime | None = None) -> list[str]:
    """Of ``keys_`` (under ``schedule:``), those that need the runner now; the entry of each of the others
    set from what its value says now (removed for one that is gone)."""
    now = now or now_utc()
    reported: list[dict] = []  # read once, when something looks due
    due = []
    for key in keys_:
        exists, text = _read(store, key)
        at, entry = _at(store, key, text, now) if exists else (None, None)
        if at is not None and at <= now:
            if not reported:
                reported.append(reported_problems(store))
            if reported[0].get(key) != digest(text):
                due.append(key)
                continue
            entry = None  # reported: nothing to do until it changes
        store.set_due(key, None if entry is None else entry.timestamp())
    return due


def full_look(store: Store, now: datetime | None = None) -> list[str]:
    """Every key under ``schedule:`` that needs the runner now, from a list of them (on Redis, a scan of
    the keyspace) and a get of each; the agent's due index made to agree with what was found, and its
    next full look set :data:`RELOOK` seconds on (less a little, so the agents of a fleet spread out)."""
    now = now or now_utc()
    found = [k for k in store.list_all(keys.SCHEDULE_PREFIX) if k.name.startswith(keys.SCHEDULE_PREFIX)]
    indexed = dict(store.due_keys(limit=len(found) + 1000))
    reported: list[dict] = []
    due, entries = [], {}
    for info in found:
        text = None if info.is_log else _read(store, info.name)[1]
        at, entry = _at(store, info.name, text, now)
        if at is not None and at <= now:
            if not reported:
                reported.append(reported_problems(store))
            if reported[0].get(info.name) != digest(text, info.is_log):
                due.append(info.name)
            else:
                entry = None
        entries[info.name] = None if entry is None else entry.timestamp()
    for key in set(indexed) - set(entries) - {LOOK}:
        entries[key] = None  # gone: written around Brainstem
    for key, at in entries.items():
        if indexed.get(key) != at:
            store.set_due(key, at)
    store.set_due(LOOK, now.timestamp() + RELOOK * random.uniform(0.8, 1.0))
    return due


def _read(store: Store, key: str) -> tuple[bool, str | None]:
    """(whether ``key`` holds something, its text: None when it is not text, a problem the runner reports)."""
    try:
        text = store.get_text(key)
    except BrainstemError:
        return True, None
    return text is not None, text


def _at(store: Store, key: str, text: str | None, now: datetime) -> tuple[datetime | None, datetime | None]:
    """(when the value at ``key`` needs the runner, its entry in the index). Due ``now`` when its time has
    come, its run died, or it is plainly not a schedule (all of which the runner handles); None while it is
    paused. A run under way is not due, but its entry stays ``now`` so that each look asks whether its
    process died. The rest of the checks are the runner's."""
    try:
        raw = json.loads(text) if text is not None else None
    except ValueError:
        return now, now
    if not isinstance(raw, dict):
        return now, now
    schedule_id = key[len(keys.SCHEDULE_PREFIX):]
    if raw.get("last_run") and raw.get("last_outcome") is None:  # started, and no outcome yet
        if held_alive(store, keys.SCHEDULE_RUN_LEASE + schedule_id) is None \
                and store.get_text(keys.schedule_running(schedule_id)) is not None:
            return now, now
        return _next(raw, now), now
    at = _next(raw, now)
    return at, at


def _next(raw: dict, now: datetime) -> datetime | None:
    if raw.get("enabled", True) is False:
        return None
    next_run = raw.get("next_run")
    t = parse_iso(next_run) if isinstance(next_run, str) else None
    return now if t is None or t <= now else t


def reported_problems(store: Store) -> dict:
    """The values under ``schedule:`` the runner reported as not schedules: key -> :func:`digest`."""
    try:
        value = json.loads(store.get_text(keys.SCHEDULE_PROBLEMS) or "{}")
    except (ValueError, BrainstemError):
        return {}
    return value if isinstance(value, dict) else {}


def digest(text: str | None, is_log: bool = False) -> str:
    """A short fingerprint of a value under ``schedule:`` (what was reported of it stands until it changes)."""
    if is_log:
        return "log"
    if text is None:
        return "not text"
    return f"{zlib.crc32(text.encode('utf-8', 'surrogatepass')):08x}-{len(text)}"


def asleep_message(until: datetime) -> str:
    return f"asleep until {iso(until)}"


def asleep_line(until: datetime, *, quiet: bool = False, verbose: bool = False, log_format: str = "text",
                tty: bool = False) -> str | None:
    """What ``brainstem wake`` prints when the agent is asleep, the same on the light path and the full
    one: nothing from cron (not a terminal) or with --quiet; the time it sleeps until on a terminal
    or with --verbose; with --log-format json, a ``wake_result`` line when --verbose."""
    if log_format == "json":
        if not verbose:
            return None
        return json.dumps({"event": "wake_result", "status": "asleep", "outcome": None, "session_id": None,
                           "next_wake_after": iso(until), "operator_action": None,
                           "message": asleep_message(until)})
    return asleep_message(until) if verbose or (tty and not quiet) else None


def asleep_fast() -> datetime | None:
    """For ``brainstem wake``: the wake time if asleep, else None (then the full path runs and
    reports any problem properly). Never raises."""
    if environment.env_file():
        return None  # settings may come from a file: let the full path read them
    try:
        # No retries here: an unreachable store or a value that is not text (or not JSON) means
        # "due", and the full path reports it in one line.
        store = open_store(check=False, retry_seconds=0, register=False)
        try:
            raw = store.get_text(keys.WAKE_CONFIG)
            until = agent_sleeping_until(store, json.loads(raw)) if raw else None
            # A sleeping agent's schedules still run: one due sends the wake down the full path.
            return None if until is None or schedules_due(store) else until
        finally:
            store.close()
    except Exception:
        return None
