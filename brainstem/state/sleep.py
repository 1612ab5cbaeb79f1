"""The sleep path: is the agent meant to be asleep? Answered with the lightest imports possible.

cron runs ``brainstem wake`` every few minutes and most runs find the agent
asleep, so this path imports only the store backend and the standard
library: no pydantic, no click, no HTTP client, no web3.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime
from typing import TYPE_CHECKING, Any

from brainstem.core import environment, keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import BrainstemError
from brainstem.state.inbox import urgent_pending
from brainstem.store import open_store
from brainstem.store.lease import held_alive, holder_is_dead

if TYPE_CHECKING:
    from brainstem.store.base import Store


def sleeping_until(wake_config: Any, now: datetime) -> datetime | None:
    """The future time the agent sleeps until, or None when it is due (missing or broken config: due)."""
    if not isinstance(wake_config, dict):
        return None
    t = parse_iso(wake_config.get("next_wake_after"))
    return t if t is not None and t > now else None


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

    For the sleep path: one list call when there are no schedules, a get for each when there are (and
    a few more only for one that looks due). A value the runner already reported as not a schedule is
    not due again until it changes, so a broken schedule never sends every tick down the full path."""
    return schedules_look(store, now)[0]


def schedules_look(store: Store, now: datetime | None = None) -> tuple[bool, datetime | None]:
    """(:func:`schedules_due`, the earliest ``next_run`` still to come among the enabled schedules)."""
    found = [k for k in store.list(keys.SCHEDULE_PREFIX).keys if k.name.startswith(keys.SCHEDULE_PREFIX)]
    now = now or now_utc()
    reported: list[dict] = []  # read once, when something looks due
    earliest: datetime | None = None
    for info in found:
        text = None if info.is_log else _text(store, info.name)
        look = _look(store, info.name, text, now)
        if look is not True:
            earliest = look if earliest is None or (look is not None and look < earliest) else earliest
            continue
        if not reported:
            reported.append(reported_problems(store))
        if reported[0].get(info.name) != digest(text, info.is_log):
            return True, earliest
    return False, earliest


def _text(store: Store, key: str) -> str | None:
    try:
        return store.get_text(key)
    except BrainstemError:
        return None  # not text: a problem the runner reports (once)


def _look(store: Store, key: str, text: str | None, now: datetime) -> bool | datetime | None:
    """True when the value at ``key`` is due, its run died, or it is plainly not a schedule (all of which
    the runner handles); else its ``next_run`` (None: disabled). The rest of the checks are the runner's."""
    try:
        raw = json.loads(text) if text is not None else None
    except ValueError:
        return True
    if not isinstance(raw, dict):
        return True
    schedule_id = key[len(keys.SCHEDULE_PREFIX):]
    if raw.get("last_run") and raw.get("last_outcome") is None:  # started, and no outcome yet
        if held_alive(store, keys.SCHEDULE_RUN_LEASE + schedule_id) is None \
                and store.get_text(keys.schedule_running(schedule_id)) is not None:
            return True
    if raw.get("enabled", True) is False:
        return None
    next_run = raw.get("next_run")
    if next_run is None:
        return True  # the runner fills it in
    t = parse_iso(next_run) if isinstance(next_run, str) else None
    return True if t is None or t <= now else t


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
