"""How a session ends: its outcome recorded, the next wake set, its history written.

Whatever happened, :func:`finish` records the end of a session from its deps and its
:class:`~brainstem.session.state.SessionState` (all it needs: a session stopped before it was whole
ends the same way), waiting briefly for a store that went away (so the session is closed by itself, as
``store_unavailable``, rather than found dead by the next wake). A session whose lease
was lost records only that (:func:`lease_lost`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from brainstem.core import events, keys, outcomes
from brainstem.core.backoff import call_with_backoff
from brainstem.core.clock import iso, now_utc
from brainstem.core.errors import LeaseLost, StoreUnavailable
from brainstem.session.build import SessionDeps
from brainstem.session.cycle import CONTEXT_RECORD_CHARS
from brainstem.session.state import SessionState
from brainstem.state import history as session_history
from brainstem.state import inbox
from brainstem.state.config import DEFAULT_SLEEP_SECONDS
from brainstem.state.memory import flush_reads
from brainstem.state.versions import save_clean_snapshot
from brainstem.store import karma as karma_mod
from brainstem.store import unrecorded
from brainstem.store.base import Store
from brainstem.store.lease import Lease

MIN_SLEEP, MAX_SLEEP = 60.0, 30 * 86400.0


@dataclass
class WakeResult:
    status: str  # "asleep" | "ran"
    outcome: str | None = None
    session_id: str | None = None
    message: str = ""
    next_wake_after: str | None = None
    reason: str | None = None  # why it ended so, when its outcome alone does not say


def clamp_sleep(value: Any, default: float, longest: float = MAX_SLEEP) -> float:
    """A requested sleep in seconds, made sane: non-numeric or negative -> default; at most ``longest``
    (30 days, or less: see :func:`longest_sleep`)."""
    longest = max(MIN_SLEEP, min(longest, MAX_SLEEP))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return max(MIN_SLEEP, min(float(default), longest))
    if value >= longest:  # compared before float(): JSON allows integers far past float's range
        return longest
    return max(MIN_SLEEP, float(value))


def longest_sleep(settings: Any) -> float:
    """The longest the agent may sleep at a stretch: never past the operator's bound on deep reflection, so
    a long sleep cannot put it off (nor the inbox) beyond that."""
    return min(MAX_SLEEP, float(settings.deep_reflect_max_days) * 86400.0)


def finish(deps: SessionDeps, state: SessionState) -> WakeResult:
    """Record the end of the session. A store that went away is waited for, briefly, so the
    session is closed by itself (as ``store_unavailable``) rather than found dead by the next wake.
    A session whose lease is lost records only that, in its own karma (see :func:`lease_lost`)."""
    def attempt() -> WakeResult:
        if deps.lease is not None and deps.lease.lost.is_set():
            return lease_lost(deps, state)
        try:
            return record_end(deps, state)
        except LeaseLost:
            return lease_lost(deps, state)

    def waiting(exc: BaseException) -> None:  # unreachable, full or read-only (a failover's replica): the
        # store's fault, never the agent's; a read-only or full store may pass as soon as an unreachable one
        if state.outcome not in (outcomes.STORE_UNAVAILABLE, outcomes.INTERRUPTED):
            state.outcome, state.reason = outcomes.STORE_UNAVAILABLE, str(exc)

    try:
        return _while_the_store_is_away(attempt, on_retry=waiting)
    except StoreUnavailable as exc:
        # Gone for longer than we wait: a note on local disk, so the next wake records this
        # session as the store outage it was rather than as a crash of the agent's.
        if deps.mode != "dry_run":
            unrecorded.remember(deps.store.display_url, deps.id, outcomes.STORE_UNAVAILABLE, str(exc)[:300])
        raise


def _while_the_store_is_away(fn, on_retry=None):
    """``fn()``, tried again while the store is unavailable, for at most :data:`STORE_RETRY_SECONDS`."""
    return call_with_backoff(fn, deadline_seconds=STORE_RETRY_SECONDS, first_delay=0.25, max_delay=2.0,
                             retry_on=StoreUnavailable, on_retry=on_retry, clip_to_deadline=False)


STORE_RETRY_SECONDS = 10.0


def note_store_lost(store: Store, sid: str, lease: Lease) -> None:
    """A lease lost because the store was away: say so on local disk at once, before the store is back and
    a wake on this host finds the session's breadcrumb (see :mod:`.unrecorded`)."""
    if lease.cause == "store_unavailable":
        unrecorded.remember(store.display_url, sid, outcomes.STORE_UNAVAILABLE, lease.reason)


def lease_lost(deps: SessionDeps, state: SessionState) -> WakeResult:
    """The session's lease ran out or another wake holds it: it writes no end (the store would refuse
    it), only a ``lease_lost`` entry in its own karma, retried while the store is away as the end of a
    session is. The wake that holds the lease next finds its breadcrumb and closes it with what this
    entry says (``interrupted``, or ``store_unavailable`` when the store was gone), never as a crash
    of the agent's; with the store gone for longer, a note on local disk says so instead."""
    lease = deps.lease
    reason = (lease.reason if lease is not None else None) or "the store refused a fenced write"
    cause = (lease.cause if lease is not None else None) or "taken_over"
    def record() -> None:
        # the one thing a session without its lease still writes
        deps.karma.record_unfenced(events.LEASE_LOST, reason=reason, cause=cause, outcome=state.outcome,
                                   cost=round(deps.budget.spent, 10), steps=deps.budget.steps)

    try:
        _while_the_store_is_away(record)
    except StoreUnavailable as exc:
        unrecorded.remember(deps.store.display_url, deps.id, outcomes.STORE_UNAVAILABLE, str(exc)[:300])
    return WakeResult("lease_lost", outcome=None, session_id=deps.id,
                      message=f"session {deps.id}: stopped, its wake lease was lost ({reason}); the wake that holds "
                              f"it next records its end")


def record_end(deps: SessionDeps, state: SessionState) -> WakeResult:
    store, budget = deps.store, deps.budget
    next_wake = state.next_wake if isinstance(state.next_wake, dict) else {}
    action = outcomes.operator_action(state.outcome)
    sleep, stretched = sleep_after(deps, state, next_wake, action)
    ended = now_utc()
    next_after = iso(ended + timedelta(seconds=sleep))
    wake_cfg: dict[str, Any] = {"next_wake_after": next_after, "sleep_seconds": sleep, "set_by": deps.id}
    if action is not None:
        wake_cfg["retry_after_fault"] = state.outcome
    if stretched is not None:  # the runtime's, in the runtime's key: the agent's own config is left as it wrote it
        wake_cfg["stretched_for_runway"] = stretched
        deps.karma.record(events.SLEEP_STRETCHED, **stretched)
    if next_wake.get("effort") in ("low", "medium", "high", "max"):
        wake_cfg["effort"] = next_wake["effort"]
    store.put(keys.WAKE_CONFIG, wake_cfg)
    duration_ms = int((ended - deps.started).total_seconds() * 1000)
    entry = {"id": deps.id, "number": deps.number, "kind": state.kind, "started_at": iso(deps.started),
             "ended_at": iso(ended), "outcome": state.outcome, "cost": round(budget.spent, 10), "steps": budget.steps,
             "steps_failed": state.steps_failed, "duration_ms": duration_ms}
    if state.reason:
        entry["reason"] = state.reason
    if budget.simulated:  # answered from a cassette: this much of its cost moved no money
        entry["simulated_cost"] = round(budget.simulated, 10)
    if action is not None:
        entry["operator_action"] = action
    last = store.get_json(keys.LAST_REFLECT, default=None)
    if isinstance(last, dict) and last.get("session_id") == deps.id:
        summary = last.get("session_summary") or last.get("reflection")
        if summary:
            entry["summary"] = str(summary)[:300]
    if state.reads:
        flush_reads(store, state.reads, deps.number)
    record_tool_reads(deps, state)
    if state.outcome == outcomes.CLEAN and state.kind == "session" and state.clean_snapshot is not None:
        save_clean_snapshot(store, state.clean_snapshot, deps.id, taken_at=iso(deps.started))
    mark_inbox_read(deps, state)
    expired = None
    # A dry run and a wake handled by reflexes are no sessions: each has its karma, not a history entry.
    if state.kind == "reflex" or deps.mode == "dry_run":
        session_history.note_unlisted(store, deps.id, deps.settings.karma_retention_days, now=ended)
    else:
        # Keyed by id: a kill between this write and session_end leaves the session in the history, and
        # the next wake's crash detection skips it rather than record it a second time as crashed.
        expired = session_history.append(store, entry, retention_days=deps.settings.karma_retention_days, now=ended,
                                         on_reject=lambda why: deps.karma.record(
                                             events.CONFIG_REJECTED, key=keys.SESSION_HISTORY, reason=why,
                                             kept_raw_at=keys.REJECTED_SESSION_HISTORY))
    deps.karma.record(events.SESSION_END, outcome=state.outcome, kind=state.kind, cost=round(budget.spent, 10),
                     steps=budget.steps, duration_ms=duration_ms, next_wake_after=next_after,
                     karma_expired=expired or None, reason=state.reason, operator_action=action,
                     dry_run=deps.mode == "dry_run" or None,
                     simulated_cost=round(budget.simulated, 10) if budget.simulated else None)
    karma_mod.end_session(store, deps.id)
    what = {"reflex": "wake", "session": "session", "deep_reflect": "session"}.get(state.kind, "session")
    # As `brainstem sessions` shows it: a cassette's answers moved no money.
    cost = f"${budget.spent:.4f}" + (" (simulated)" if budget.simulated else "")
    if deps.mode == "dry_run":
        message = (f"dry run {deps.id}: {state.outcome}, {cost}, {budget.steps} steps; nothing was "
                   f"written but its karma (brainstem karma {deps.id})")
    else:
        message = (f"{what} {deps.id}: {state.outcome}, {cost}, {budget.steps} steps; "
                   f"next wake {next_after}")
    if action is not None:
        message += f"; operator: {action}"
    elif state.reason:  # why it ended so: a limit, no plan, a reflection that did not happen, a signal
        message += f" ({state.reason})"
    return WakeResult("ran", outcome=state.outcome, session_id=deps.id, next_wake_after=next_after,
                      message=message, reason=state.reason)


def sleep_after(deps: SessionDeps, state: SessionState, next_wake: dict,
                action: str | None) -> tuple[float, dict | None]:
    """(seconds until the next wake, how the runway stretched it or None)."""
    longest = longest_sleep(deps.settings)
    default_sleep = clamp_sleep(deps.defaults.wake.sleep_seconds, DEFAULT_SLEEP_SECONDS, longest)
    sleep = clamp_sleep(next_wake.get("sleep_seconds"), default_sleep, longest)
    if action is not None:
        # The operator's (or the provider's) fault: try again soon, sooner the first times, so fixing
        # it works at the next tick without --force. A clean session ends the streak.
        streak = outcomes.fault_streak(session_history.recent(deps.store, 32)) + 1
        return max(MIN_SLEEP, outcomes.fault_backoff(streak, default_sleep)), None
    if state.outcome == outcomes.INTERRUPTED:
        # Stopped from outside, its work cut short: due again as soon as the runtime is back.
        return MIN_SLEEP, None
    if state.runway and state.runway.get("stretch"):
        stretched = stretch_sleep(sleep, state.runway)
        return stretched["slept_seconds"], stretched
    return sleep, None


def stretch_sleep(sleep: float, runway: dict) -> dict:
    """The sleep asked for, stretched while the LLM balance's runway is under ``BRAINSTEM_MIN_RUNWAY_DAYS``:
    longer by the factor that makes the balance last them at the same spend a session (at most
    :data:`MAX_SLEEP`)."""
    factor = float(runway["stretch"])
    slept = MAX_SLEEP if factor * sleep >= MAX_SLEEP else max(sleep, factor * sleep)
    days = runway.get("runway_days")
    return {"asked_seconds": sleep, "slept_seconds": slept, "factor": round(min(factor, 1e6), 4),
            "runway_days": None if days is None else round(days, 4), "min_runway_days": runway.get("min_runway_days"),
            "credit": runway.get("credit"), "mean_daily_spend": runway.get("mean_daily_spend")}


def record_tool_reads(deps: SessionDeps, state: SessionState) -> None:
    """What the session's tools read from the store, for a replay to give its tools the same (after
    reflection, so no prompt shows it); past the bound of a context entry, only its size."""
    if not state.seen:
        return
    values = dict(state.seen)
    size = len(karma_mod.encode_entry(values))
    if size <= CONTEXT_RECORD_CHARS:
        deps.karma.record(events.TOOL_READS, values=values)
    else:
        deps.karma.record(events.TOOL_READS, values=None, too_large=size, limit=CONTEXT_RECORD_CHARS)


def mark_inbox_read(deps: SessionDeps, state: SessionState) -> None:
    """Mark read the operator's messages this session showed the agent, and only those (the ids its context
    was built with: a message that arrived mid-session stays unread for the next one).

    Only when the model answered the orient call that showed them. A session that never reached the
    model (the LLM endpoint down or refusing the key, no money left today, deep reflection instead of
    orient, an agent-side failure of the call) leaves them unread, so nothing the operator said is lost:
    the next session shows them again. Whatever happened after orient answered (a failed step, a stop,
    an interruption) the agent has read them. A dry run marks nothing."""
    if not state.inbox_ids or not state.inbox_answered or deps.mode != "live":
        return
    up_to = max(state.inbox_ids)
    inbox.mark_read(deps.store, up_to)
    deps.karma.record(events.INBOX_READ, ids=state.inbox_ids, up_to=up_to)


def _try(fn) -> None:
    try:
        fn()
    except StoreUnavailable:
        pass


