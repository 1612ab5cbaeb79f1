"""When deep reflection comes, and what happens when it keeps failing.

The agent asks for its interval (``config:defaults.deep_reflect``, a deep reflection's
``next_deep_reflect``); the operator bounds it (``BRAINSTEM_DEEP_REFLECT_MAX_SESSIONS`` / ``_DAYS``), so it
can neither be put off for good nor come twice in a row. One that fails backs off, and one that keeps
failing by the agent's doing has what it runs on put back as the last one that worked had it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from brainstem.core import events, keys
from brainstem.core.clock import now_iso, parse_iso
from brainstem.core.json_numbers import finite_or
from brainstem.llm.chokepoint import LLMError
from brainstem.session.stopping import SessionStopped
from brainstem.state.budget import BudgetExceeded
from brainstem.state.config import Defaults
from brainstem.state.versions import restore_last_clean, versions, who_wrote
from brainstem.store.base import Store

DEEP_RESTORE_AFTER = 3  # deep reflections failed by the agent's doing in a row before what it runs on is put back
DEEP_DEPENDS_ON = (keys.PROMPT_DEEP, keys.CONFIG_DEFAULTS, keys.CONFIG_MODELS)  # as the last one that worked had them


def _schedule(store: Store) -> dict:
    sched = store.get_json(keys.DEEP_REFLECT_SCHEDULE, default=None)
    return sched if isinstance(sched, dict) else {}


def deep_intervals(sched: dict, defaults: Defaults, settings) -> tuple[int, float]:
    """(sessions, days) between two deep reflections: what the agent asked for (its schedule ``sched``, else
    its defaults), held within the operator's bounds, so it cannot put deep reflection off for good."""
    dr = defaults.deep_reflect
    sessions = finite_or(sched.get("after_sessions"), dr.default_interval_sessions)
    days = finite_or(sched.get("after_days"), dr.default_interval_days)
    return (int(min(max(sessions, 1), settings.deep_reflect_max_sessions)),
            min(max(days, 0.0), settings.deep_reflect_max_days))


def deep_reflect_due(store, defaults: Defaults, session_number: int, settings,
                     now: datetime | None = None) -> tuple[bool, str]:
    """Due by sessions or days since the last one (with no schedule yet, by session count alone), within the
    operator's bounds (``deep_intervals``). Never two in a row: the session after a deep reflection orients,
    so the operator's messages are read however often the agent asks for one. One that failed is tried at
    the next session, then after 2, 4, 8... sessions (up to the operator's bounds, in sessions and in days),
    so a deep reflection that keeps failing still lets orient run."""
    now = now or datetime.now(timezone.utc)
    sched = _schedule(store)
    after_sessions, after_days = deep_intervals(sched, defaults, settings)
    missed = int(finite_or(sched.get("missed"), 0))
    if missed > 0:
        wait = min(settings.deep_reflect_max_sessions, 2 ** min(missed - 1, 20))  # bound by the operator
        retry_at = int(finite_or(sched.get("missed_session"), 0)) + wait
        missed_at = parse_iso(sched.get("missed_at"))
        waited_days = missed_at is not None and now - missed_at >= timedelta(days=settings.deep_reflect_max_days)
        if session_number < retry_at and not waited_days:
            return False, f"the last {missed} deep reflection(s) failed: the next try is at session {retry_at}"
    if "last_session" not in sched:
        due = session_number >= after_sessions
        return due, f"session {session_number} of first interval {after_sessions}"
    last = int(finite_or(sched.get("last_session"), 0))
    since = session_number - last
    if last > 0 and since < 2:
        return False, "the last session was a deep reflection: this one orients"
    if since >= after_sessions:
        return True, f"{since} sessions since the last (every {after_sessions:g})"
    last_at = parse_iso(sched.get("last_at"))
    if last_at is not None and now - last_at >= timedelta(days=after_days):
        return True, f"{(now - last_at).days} days since the last (every {after_days:g} days)"
    return False, f"{since} of {after_sessions:g} sessions"


def missed(session, failed: BaseException | None) -> None:
    """A deep reflection that did not happen: its schedule counts the miss (for the retry's wait), and after
    a few in a row of the agent's doing, what it runs on (``prompt:deep``, the defaults, the models) is put
    back as the last one that worked had it, never past what the operator wrote since.
    A stop from outside is no miss; the provider or the daily ceiling is one, but not of the agent's doing."""
    deps = session.deps
    if isinstance(failed, SessionStopped) or deps.stop.cancel.is_set():  # cut short from outside: no miss
        return
    store = deps.store
    sched = dict(_schedule(store))
    sched["missed"] = int(finite_or(sched.get("missed"), 0)) + 1
    sched["missed_session"] = deps.number
    sched["missed_at"] = now_iso(ms=True)
    # The agent's own doing: an unusable answer, or a call its own configuration broke (an unknown model).
    # A session's ceiling refusing the call is the agent's doing too: it chose the model and its price.
    unusable = (isinstance(failed, LLMError) and failed.fault is None) or (
        isinstance(failed, BudgetExceeded) and failed.limit != "daily") or not isinstance(failed, (LLMError,
                                                                                                   BudgetExceeded))
    sched["unusable"] = int(finite_or(sched.get("unusable"), 0)) + 1 if unusable else 0
    store.put(keys.DEEP_REFLECT_SCHEDULE, sched)
    if sched["unusable"] < DEEP_RESTORE_AFTER:
        return
    worked = store.get_json(keys.LAST_WORKING_DEEP, default=None)
    if not isinstance(worked, dict):  # none has worked yet: what each key held before the agent first changed it
        first = {k: vs[0] for k in DEEP_DEPENDS_ON if (vs := versions(store, k))}
        worked = {"at": None, "values": {k: v.get("value") for k, v in first.items()
                                         if who_wrote(v) in ("operator", "initial")}}
    restored = restore_last_clean(store, deps.id, only=DEEP_DEPENDS_ON, saved=worked)
    if restored:
        session.record(events.AUTO_RESTORE, restored=restored, failed_deep_reflections=sched["unusable"])


def worked(store: Store) -> None:
    """A deep reflection worked: what it ran on is the state a later failing one goes back to."""
    store.put(keys.LAST_WORKING_DEEP, {"at": now_iso(ms=True), "values": {k: store.get(k) for k in DEEP_DEPENDS_ON}})
