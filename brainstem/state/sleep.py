"""The sleep path: is the agent meant to be asleep? Answered with the lightest imports possible.

cron runs ``brainstem wake`` every few minutes and most runs find the agent
asleep, so this path imports only the store backend and the standard
library: no pydantic, no click, no HTTP client, no web3.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from brainstem.core import environment, keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.state.inbox import urgent_pending
from brainstem.store import open_store
from brainstem.store.lease import holder_is_dead

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
            return agent_sleeping_until(store, json.loads(raw)) if raw else None
        finally:
            store.close()
    except Exception:
        return None
