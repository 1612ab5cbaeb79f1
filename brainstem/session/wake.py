"""One wake: the lifecycle of ``brainstem wake``, top to bottom.

0. schedules      the agent's due scheduled actions run, whatever its sleep says (:mod:`.schedule_run`)
1. asleep?        ``wake_config.next_wake_after`` in the future, and no urgent message from the operator
                  waiting (:mod:`brainstem.state.inbox`) -> return at once (:mod:`brainstem.state.sleep`)
2. lease          one wake per agent (:mod:`brainstem.store.lease`); "due?" is decided again under it
3. crashed?       ``session:current`` still present -> the last session died (:mod:`.crash`)
   restore         after three failing sessions, put back what the last clean one ran with
4. ground truth   LLM credit, USDC balance, store usage, in parallel (:mod:`.ground_truth`)
5. effort         tripwires over the facts
6. assemble       the session's views, policy and LLM cascade (:func:`.build.build_session`)
7. think          reflexes; deep reflection when due, else orient -> execute -> reflect (:mod:`.cycle`)
8. record         next wake, session history, breadcrumbs, ``session_end`` (:mod:`.ending`)

Before any work, the schedule is advanced pessimistically (next wake = now +
the default sleep), so even a session that is SIGKILLed never leaves the agent
waking every tick. One try/except around the session always records an outcome
(:mod:`brainstem.core.outcomes`). Faults that are the operator's or the infrastructure's (the LLM
key, credit or endpoint, the store) get outcomes of their own, never count towards auto-restore, and
retry on a short growing backoff (1, 2, 4 ... minutes, at most the default sleep). SIGTERM/SIGINT
to ``brainstem wake`` (:mod:`.interrupt`) end the session as ``interrupted``, lease released.
"""

from __future__ import annotations

import threading
import traceback
import uuid
from contextlib import closing
from datetime import timedelta
from typing import Any

from brainstem import __version__
from brainstem.core import events, keys, outcomes
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import LeaseHeld, LeaseLost, MalformedValue, NotText, StoreUnavailable
from brainstem.core.settings import Settings
from brainstem.core.untrusted import to_record
from brainstem.llm.chokepoint import is_simulated
from brainstem.llm.meter import WireMeter
from brainstem.sandbox import pool
from brainstem.session import credit_floor
from brainstem.session.build import (
    SessionDeps,
    SessionSpec,
    agent_view,
    build_session,
    check_ready,
    learner,
    make_budget,
)
from brainstem.session.crash import close_dead, sweep_notes
from brainstem.session.cycle import check_reflexes, max_effort, think
from brainstem.session.deep_schedule import deep_reflect_due
from brainstem.session.ending import WakeResult, _try, clamp_sleep, finish, longest_sleep, note_store_lost
from brainstem.session.gate import check_change
from brainstem.session.ground_truth import effort_for, fired_tripwires, read_world
from brainstem.session.interrupt import WakeInterrupted, interruptible, stop_reason
from brainstem.session.schedule_run import run_due
from brainstem.session.state import SessionState
from brainstem.session.stopping import OUTCOMES, STORE_UNAVAILABLE, SessionStopped, Stopping, stop_of
from brainstem.state import history as session_history
from brainstem.state import inbox
from brainstem.state.budget import BudgetExceeded, DailyLedger, daily_spent, note_anomaly
from brainstem.state.config import DEFAULT_SLEEP_SECONDS, effective_models, load_defaults, operator_models
from brainstem.state.sleep import PESSIMISTIC, agent_sleeping_until, asleep_message, sleeping_until
from brainstem.state.versions import auto_restore, snapshot
from brainstem.store import karma as karma_mod
from brainstem.store.base import Store
from brainstem.store.fenced import FencedStore
from brainstem.store.karma import Karma, Redactor
from brainstem.store.lease import (
    Lease,
    acquire_wake_lease,
    forget_token,
    owner_token,
    session_alive_here,
    use_host_name,
)
from brainstem.store.overlay import OverlayStore
from brainstem.tools.policy import ToolPolicy

# Outcomes a session cancelled from outside may have reached only because it was cut short: it ends
# interrupted instead (its cut-short work is not the agent's failure, nor its budget's).
CUT_SHORT = (outcomes.CLEAN, outcomes.NO_PLAN, outcomes.NO_REFLECTION, outcomes.BUDGET_EXHAUSTED)

# --- the wake --------------------------------------------------------------------

def wake(settings: Settings, store: Store, *, force: bool = False, providers: list | None = None,
         listeners=(), cancel: threading.Event | None = None, dry_run: bool = False,
         schedules: bool = True) -> WakeResult:
    """One wake cycle. Raises only for misconfiguration (ConfigError, LeaseHeld, StoreUnavailable).

    The agent's due schedules run first, whatever its own sleep says (``schedules``: False where the
    caller runs them itself, as the daemon does). ``dry_run``: one whole session now, whatever the
    schedule, with the real LLM and no side effect beyond its own karma (see :func:`dry_run_session`);
    it runs no schedule."""
    if dry_run:
        return dry_run_session(settings, store, providers=providers, listeners=listeners, cancel=cancel)
    if schedules:
        run_due(settings, store, providers=providers, listeners=listeners, cancel=cancel)
    wake_config = _read_wake_config(store)
    until = agent_sleeping_until(store, wake_config)
    if until is not None and not force:
        return WakeResult("asleep", message=asleep_message(until), next_wake_after=iso(until))

    check_ready(store, settings, need_key=providers is None)  # misconfigured: fail before changing anything
    use_host_name(settings.hostname)
    breadcrumb = karma_mod.read_breadcrumb(store)
    if breadcrumb is not None and session_alive_here(breadcrumb):
        # Its process is alive on this host: whatever the lease's clock says, it is not dead.
        raise LeaseHeld(f"another wake is running for this agent (session {breadcrumb.get('id')}, pid "
                       f"{breadcrumb.get('pid')} on this host); not waking twice")
    token = owner_token(uuid.uuid4().hex[:8])
    acquire_wake_lease(store, token, ttl_ms=int(settings.lease_seconds * 1000))
    lease = Lease(store, token, settings.lease_seconds).start()
    fenced = FencedStore(store, keys.WAKE_LEASE, token)  # the session's every write is fenced by the lease
    try:
        # Due is decided again under the lease: a wake that stalled after its first look (while
        # another ran a session and moved the schedule) must not run a second one.
        wake_config = _read_wake_config(store)
        until = agent_sleeping_until(store, wake_config, leased=True)
        if until is not None and not force:
            return WakeResult("asleep", message=asleep_message(until), next_wake_after=iso(until))
        woke_for = None
        if not force and agent_sleeping_until(store, wake_config, leased=True, urgent=False) is not None:
            woke_for = "urgent_inbox"  # the schedule alone says asleep: an urgent message woke it
        return _session(settings, fenced, wake_config, providers, listeners, cancel, lease, woke_for=woke_for)
    finally:
        interruptible(False)
        lease.stop()
        try:
            store.release_lease(keys.WAKE_LEASE, token)
        finally:
            forget_token(token)


def urgent_due(store: Store) -> int:
    """The id of an urgent message from the operator that makes the agent due now (no session has been
    shown it yet, and none is running), else 0: the daemon's inbox watch wakes such an agent at once.
    Cheap: one get while no urgent message waits."""
    return urgent_state(store)[0]


def urgent_state(store: Store) -> tuple[int, bool]:
    """(:func:`urgent_due`'s answer; whether an urgent message no session has been shown waits at all, due
    now or, while a session runs, once it ends)."""
    urgent = inbox.waiting_urgent(store)
    if not urgent:
        return 0, False
    return (urgent if agent_sleeping_until(store, _read_wake_config(store)) is None else 0), True


def dead_session_due(store: Store) -> bool:
    """True when the agent's last session died (its pessimistic advance stands and no lease is held) and
    its retry is due: the daemon's watch wakes such agents without waiting for their next tick."""
    return dead_session(store, 0.0)[0]


def dead_session(store: Store, recheck: float) -> tuple[bool, float | None]:
    """(:func:`dead_session_due`'s answer; when, in unix seconds, to ask again: ``recheck`` seconds on while
    its session runs or its pickup is under way, at its retry while a crash backs off, None once there is
    nothing to take over early: no session's advance stands, or none could be retried before it runs out)."""
    try:
        wake_config = store.get(keys.WAKE_CONFIG, "json")
    except MalformedValue:
        return False, None
    if not (isinstance(wake_config, dict) and wake_config.get("set_by") == PESSIMISTIC):
        return False, None
    now = now_utc()
    until = sleeping_until(wake_config, now)
    retry = parse_iso(wake_config.get("retry_after"))
    if until is None or retry is None or retry >= until:
        return False, None  # due anyway (the daemon's tick wakes it), or nothing to retry before that
    at = agent_sleeping_until(store, wake_config)
    if at is None:
        return True, now.timestamp() + recheck
    return False, (at.timestamp() if at < until else now.timestamp() + recheck)


def dry_run_session(settings: Settings, store: Store, *, providers: list | None = None, listeners=(),
                    cancel: threading.Event | None = None) -> WakeResult:
    """A session in a throwaway overlay of the store: tools do not run (each call is a ``tool_would_do``
    entry), and of everything it writes only its karma (marked ``dry_run``) and today's spend (the LLM
    calls are real, and so is their cost) reach the store. No lease is taken and no crash is closed:
    it changes nothing another wake could trip over."""
    check_ready(store, settings, need_key=providers is None)
    sid = f"dry-{uuid.uuid4().hex[:8]}"
    through = {keys.karma(sid), keys.SESSION_LAST_STARTED, keys.DAILY_COST, keys.DAILY_SIMULATED_COST, keys.SPEND_DAYS,
               keys.COST_ANOMALIES, keys.UNLISTED_KARMA}
    overlay = OverlayStore(store, passthrough=through.__contains__)
    return _session(settings, overlay, _read_wake_config(store), providers, listeners, cancel, None,
                    mode="dry_run", sid=sid)


def _read_wake_config(store: Store) -> Any:
    try:
        return store.get(keys.WAKE_CONFIG, "json")
    except NotText:  # not even text: due now, and the session records it as rejected and repairs it
        return "<not text>"
    except MalformedValue:  # not JSON: due now, and the session records it as rejected and repairs it
        return store.get(keys.WAKE_CONFIG)


def _next_number(store: Store) -> int:
    try:
        return store.incr(keys.SESSION_COUNTER)
    except MalformedValue:
        number = len(session_history.read(store)) + 1
        store.put(keys.SESSION_COUNTER, str(number))
        return number


def _session(settings, store, wake_config, providers, listeners, cancel, lease: Lease | None, mode: str = "live",
             sid: str | None = None, woke_for: str | None = None) -> WakeResult:
    # One user of the process's pool among others (the daemon, other agents' sessions): its end drains
    # the pool only when nothing else uses it, so a one-shot wake still leaves no worker behind.
    with pool.use(settings.sandbox_pool):
        return _whole_session(settings, store, wake_config, providers, listeners, cancel, lease, mode, sid, woke_for)


def _whole_session(settings, store, wake_config, providers, listeners, cancel, lease: Lease | None, mode: str,
                   sid: str | None, woke_for: str | None) -> WakeResult:
    dry = mode == "dry_run"
    breadcrumb = None if dry else karma_mod.read_breadcrumb(store)  # a dry run closes nothing
    number = _next_number(store)
    sid = sid or f"{number}-{uuid.uuid4().hex[:6]}"
    crash = None
    problems: list[str] = []  # recorded as config_rejected once the session's karma begins
    if not dry:
        sweep_notes(store)  # notes here about sessions a wake on another host closed
    if breadcrumb is not None:
        crash = close_dead(store, breadcrumb, detected_by=sid, on_reject=problems.append)
        if crash is None:
            breadcrumb = None
    # Restore before anything below reads the keys it may put back, so this session runs with them.
    restored = None if dry else auto_restore(store, sid)
    soul, orient_template = check_ready(store, settings, need_key=providers is None)
    defaults, models = load_defaults(store, problems), effective_models(store, problems)
    # A session answered only from a cassette moves no money: today's real spend does not shrink it.
    simulated = bool(providers) and all(is_simulated(p) for p in providers)
    left_today = max(0.0, settings.max_daily_cost - (0.0 if simulated else daily_spent(store)))
    budget = make_budget(defaults, settings, left_today)
    # Every metered request holds its worst case against today's ceiling in the store before it goes.
    budget.daily = DailyLedger(store, settings.max_daily_cost)
    # Cancelled from outside, or its lease lost: the session stops at its next step or call.
    stop = Stopping(cancel=cancel or threading.Event(), lost=lease.lost if lease is not None else threading.Event())
    if lease is not None:
        lease.on_lost = lambda lost: note_store_lost(store, sid, lost)

    karma = Karma(store, sid, Redactor(settings.known_secrets()), listeners=listeners)
    karma_mod.begin_session(store, sid, lease=lease.token if lease is not None else None)
    deps = SessionDeps(id=sid, number=number, settings=settings, store=store, karma=karma, budget=budget,
                       defaults=defaults, models=models, soul=soul, mode=mode, stop=stop, check_change=check_change,
                       lease=lease)
    state = SessionState(context={"sessionId": sid, "now": iso(deps.started), "crashData": crash},
                         clean_snapshot=snapshot(store))
    # From here on every way out records the end (or, with the store gone, leaves a note of it).
    try:
        _open(deps, wake_config, left_today, breadcrumb, crash, restored, problems, woke_for)
        interruptible(True)
        if stop.cancel.is_set():  # a signal arrived while the lease was being taken
            stop.check()
        _live(deps, state, wake_config, providers, orient_template, left_today)
        interruptible(False)
        if stop.cancel.is_set() and state.outcome in CUT_SHORT:
            stop.check()  # cancelled by the daemon or a signal: it ends interrupted, not blamed on the plan or budget
    except (SessionStopped, BudgetExceeded, LeaseLost, StoreUnavailable) as exc:  # stopped: see stopping.OUTCOMES
        interruptible(False)
        _stopped(deps, state, stop_of(exc))
    except Exception as exc:  # the one try/except: always an outcome, never a silent death
        interruptible(False)
        state.outcome = outcomes.ERROR
        state.reason = f"{type(exc).__name__}: {exc}"[:300]
        karma.record(events.FATAL_ERROR, error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc(limit=8)[-4000:])
    except WakeInterrupted as exc:  # SIGTERM/SIGINT to `brainstem wake`: recorded, the lease released, no crash
        interruptible(False)
        signal_name = str(exc)
        state.outcome, state.reason, state.clean_snapshot = outcomes.INTERRUPTED, f"received {signal_name}", None
        _try(lambda: karma.record(events.SIGNAL, signal=signal_name))
    except BaseException as exc:  # KeyboardInterrupt with no guard installed (in-process callers): record, let through
        interruptible(False)
        state.outcome, state.reason = outcomes.INTERRUPTED, type(exc).__name__
        state.next_wake = state.clean_snapshot = None
        finish(deps, state)
        raise
    return finish(deps, state)


def _stopped(deps: SessionDeps, state: SessionState, stop: SessionStopped) -> None:
    """End the session as its stop says (a signal during the lease or ground truth, the store gone...)."""
    outcome = OUTCOMES[stop.reason]
    if outcome is None:  # a fenced write refused: the lease is gone, and finish() records only that
        return
    state.outcome, state.reason = outcome, stop_reason() if outcome == outcomes.INTERRUPTED else str(stop)
    if stop.reason == STORE_UNAVAILABLE:  # the infrastructure's, not the agent's: said so in its karma
        _try(lambda: deps.karma.record(events.STORE_ERROR, error=state.reason))


def _open(deps: SessionDeps, wake_config: Any, left_today: float, breadcrumb: dict | None, crash: dict | None,
          restored: dict | None, problems: list[str], woke_for: str | None = None) -> None:
    """Advance the schedule before doing anything that could die, then record how the session starts.

    If it dies, its agent is due again at retry_after once no lease is held (its host may have died
    with it): at once after a first crash, then backing off, so a crash loop never spends every tick.
    The whole default sleep stays the advance for wakes that cannot tell."""
    store, karma, sid, dry = deps.store, deps.karma, deps.id, deps.mode == "dry_run"
    default_sleep = clamp_sleep(deps.defaults.wake.sleep_seconds, DEFAULT_SLEEP_SECONDS, longest_sleep(deps.settings))
    crashes = outcomes.crash_streak(session_history.recent(store, 32))
    retry_after = deps.started + timedelta(seconds=outcomes.crash_backoff(crashes, default_sleep))
    store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(deps.started + timedelta(seconds=default_sleep)),
                                 "set_by": PESSIMISTIC, "session_id": sid, "retry_after": iso(retry_after),
                                 "crash_streak": crashes})
    why = {}
    if woke_for == "urgent_inbox":  # why a sleeping agent woke: its operator's urgent message (its id)
        why = {"woke_for": woke_for, "urgent_message": inbox.waiting_urgent(store) or None}
    karma.record(events.SESSION_START, session_id=sid, number=deps.number, store=store.display_url,
                 version=__version__, budget=deps.budget.snapshot(), daily_budget_left=round(left_today, 6),
                 crashed_session=breadcrumb.get("id") if breadcrumb else None, dry_run=dry or None, **why)
    if crash is not None:
        karma.record(events.CRASH_DETECTED, dead_session=breadcrumb.get("id") if breadcrumb else None,
                     entries=crash.get("entries_total"), crash_data=to_record(crash))
    if restored is not None:
        karma.record(events.AUTO_RESTORE, **restored)
    for p in problems:
        karma.record(events.CONFIG_REJECTED, reason=p)
    if not dry:
        for damaged in session_history.unreported_damage(store):
            karma.record(events.HISTORY_DAMAGED, position=damaged.get("position"), session=damaged.get("id"),
                         raw=damaged.get("raw"))
    if wake_config is not None and not isinstance(wake_config, dict):
        karma.record(events.CONFIG_REJECTED, key=keys.WAKE_CONFIG, reason="wake_config was not a JSON object; repaired")


def _live(deps: SessionDeps, state: SessionState, wake_config: Any, providers: list | None, orient_template: str,
          left_today: float) -> None:
    """Ground truth and effort, the session put together, then reflexes and the session's thinking."""
    settings, store, karma, budget, sid = deps.settings, deps.store, deps.karma, deps.budget, deps.id
    defaults = deps.defaults
    agent_kv = agent_view(store, karma, sid, settings)

    def on_anomaly(anomaly: dict) -> None:
        note_anomaly(store, anomaly, sid)

    # Every request sandboxed code sends to the LLM host, from the balance checkers on, is metered.
    meter = WireMeter(models=deps.models, budget=budget, record=karma.record, llm_base_url=settings.llm_base_url,
                      on_anomaly=on_anomaly, operator_ids=frozenset(m.id for m in operator_models(store).models))
    # One policy for all code of the session, the balance checkers included: grants withdrawn after a
    # secret_refused stay withdrawn, and the write quota counts once.
    policy = ToolPolicy.from_settings(settings, meter=meter, on_secrets=learner(karma))
    with closing(policy):  # what the session started outside the sandbox (its MCP servers) ends with it
        # Ground truth is part of the session's time: at most a quarter of it.
        truth_timeout = min(settings.ground_truth_timeout, max(1.0, budget.max_duration / 4))
        # The LLM credit as a floor, and the breaker a 402 opened: before anything of the session runs.
        paying = not (providers and all(is_simulated(p) for p in providers))
        guard = credit_floor.check(settings, store, karma, timeout=truth_timeout) if paying else None
        if guard is not None and guard.blocked is not None:
            state.outcome, state.reason = outcomes.LLM_NO_CREDIT, guard.blocked
            if deps.mode == "live":
                credit_floor.tell_once(store, karma, policy, credit_floor.notice(guard.blocked,
                                                                                 credit_floor.load(store).get("breaker")))
            return
        state.runway = guard.runway if guard is not None else None
        facts = read_world(settings, store, karma, agent_kv, policy, dry_run=deps.mode == "dry_run",
                           timeout=truth_timeout,
                           llm_credit=(guard.credit, guard.why_unknown) if guard is not None and guard.read else None)
        state.context["balances"] = facts["balances"]
        state.context["kvUsage"] = facts["kvUsage"]
        fired = fired_tripwires(defaults.tripwires, facts)
        for tw in fired:
            karma.record(events.TRIPWIRE_FIRED, field=tw.field, op=tw.op, value=tw.value, effort=tw.effort)
        requested = wake_config.get("effort") if isinstance(wake_config, dict) else None
        state.effort = effort_for(max_effort(defaults.wake.default_effort, requested), fired)
        karma.record(events.EFFORT, effort=state.effort, tripwires_fired=len(fired),
                     requested=requested if isinstance(requested, str) else None)

        session = build_session(deps, state, SessionSpec(providers=providers, agent_kv=agent_kv, policy=policy,
                                                         meter=meter, on_anomaly=on_anomaly))
        deep = deep_reflect_due(store, defaults, deps.number, settings)  # (due, why): asked once, for all below
        urgent = inbox.urgent_pending(store)
        if deep[0] and urgent:
            # The operator's urgent message first: deep reflection shows no messages, and stays due for the next wake.
            karma.record(events.DEEP_REFLECT, phase="deferred", reason=deep[1],
                         note="an urgent message from the operator waits: this session orients; deep reflection "
                              "runs at the next wake")
            deep = (False, deep[1])
        sleep_for = check_reflexes(session, facts, deps.started, deep_due=deep[0], urgent_inbox=urgent)
        if sleep_for is not None:  # a reflex handled the wake: no orient, no reflection, no LLM call
            state.kind, state.outcome = "reflex", outcomes.HANDLED_BY_REFLEX
            state.next_wake = {"sleep_seconds": sleep_for}
        else:
            think(session, orient_template, left_today, deep)
        if paying and state.outcome == outcomes.LLM_NO_CREDIT and deps.mode == "live":  # the server's 402
            breaker = credit_floor.trip(settings, store, karma, sid, timeout=truth_timeout,
                                        default_sleep=clamp_sleep(defaults.wake.sleep_seconds, DEFAULT_SLEEP_SECONDS))
            credit_floor.tell_once(store, karma, policy,
                                   credit_floor.notice("the LLM server answered 402 (out of credit)", breaker))
