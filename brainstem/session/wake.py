"""One wake: the lifecycle of ``brainstem wake``, top to bottom.

1. asleep?        ``wake_config.next_wake_after`` in the future -> return at once (:mod:`.sleep`)
2. lock           one wake per agent (:mod:`.lock`); "due?" is decided again under the lock
3. crashed?       ``session:current`` still present -> the last session died (:mod:`.crash`)
   restore         after three failing sessions, put back what the last clean one ran with
4. ground truth   LLM credit, USDC balance, store usage, in parallel (:mod:`.ground_truth`)
5. effort         tripwires over the facts
6. context        loaded keys and a bounded index of the store (:mod:`.context`)
7. deep reflect when due, else orient (:mod:`.orient`) -> execute (:mod:`.executor`) -> reflect
8. record         next wake, session history, breadcrumbs, ``session_end``

Before any work, the schedule is advanced pessimistically (next wake = now +
the default sleep), so even a session that is SIGKILLed never leaves the agent
waking every tick. One try/except around the session always records an outcome
(:mod:`.outcomes`). Faults that are the operator's or the infrastructure's (the LLM key,
credit or endpoint, the store) get outcomes of their own, never count towards auto-restore, and
retry on a short growing backoff (1, 2, 4 ... minutes, at most the default sleep). SIGTERM/SIGINT
to ``brainstem wake`` (:mod:`.interrupt`) end the session as ``interrupted``, lock released.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from brainstem import __version__
from brainstem.core import events, keys, outcomes
from brainstem.core.errors import ConfigError, LeaseLost, LockHeld, MalformedValue, NotText, StoreUnavailable
from brainstem.core.settings import Settings
from brainstem.core.untrusted import to_record
from brainstem.llm.chokepoint import LLM, LLMError
from brainstem.llm.meter import WireMeter
from brainstem.llm.providers import OpenRouterProvider
from brainstem.session.context import load_session_context
from brainstem.session.crash import close_dead
from brainstem.session.executor import Executor
from brainstem.session.ground_truth import effort_for, fired_tripwires, read_world
from brainstem.session.interrupt import WakeInterrupted, interruptible, stop_reason
from brainstem.session.orient import orient, plan_budget
from brainstem.session.reflect import deep_reflect_due, run_deep_reflect, run_reflect
from brainstem.session.session import Session
from brainstem.state import history as session_history
from brainstem.state.budget import Budget, BudgetExceeded, DailyLedger, clamp, daily_spent, note_anomaly
from brainstem.state.config import Defaults, effective_models, load_defaults
from brainstem.state.guarded import AgentKV
from brainstem.state.sleep import PESSIMISTIC, agent_sleeping_until, asleep_message, iso, now_utc, sleeping_until
from brainstem.state.versions import auto_restore, record_write, save_clean_snapshot, snapshot
from brainstem.store import karma as karma_mod
from brainstem.store import unrecorded
from brainstem.store.base import Store
from brainstem.store.karma import Karma, Redactor
from brainstem.store.lease import (
    Lease,
    acquire_wake_lock,
    forget_token,
    owner_token,
    session_alive_here,
    use_host_name,
)
from brainstem.tools.services import ToolPolicy

MIN_SLEEP, MAX_SLEEP = 60.0, 30 * 86400.0
CONTEXT_RECORD_CHARS = 1_000_000  # orient's context as karma records it for replay


@dataclass
class WakeResult:
    status: str  # "asleep" | "ran"
    outcome: str | None = None
    session_id: str | None = None
    message: str = ""
    next_wake_after: str | None = None


# --- times ---

def clamp_sleep(value: Any, default: float) -> float:
    """A requested sleep in seconds, made sane: non-numeric or negative -> default; at most 30 days."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return max(MIN_SLEEP, min(float(default), MAX_SLEEP))
    if value >= MAX_SLEEP:  # compared before float(): JSON allows integers far past float's range
        return MAX_SLEEP
    return max(MIN_SLEEP, float(value))


# --- the wake --------------------------------------------------------------------

def check_ready(store: Store, settings: Settings, need_key: bool = True) -> tuple[str, str]:
    """The soul and the orient prompt, or a one-line misconfiguration error."""
    soul = store.get(keys.SOUL)
    if not soul or not soul.strip():
        raise ConfigError(f"no soul in {store.display_url}: run `brainstem seed --soul FILE` (or --example-soul)")
    orient = store.get(keys.PROMPT_ORIENT)
    if not orient or not orient.strip():
        raise ConfigError(f"no prompt:orient in {store.display_url}: run `brainstem seed`")
    if need_key and "openrouter.ai" in settings.openrouter_base_url and settings.openrouter_api_key is None:
        raise ConfigError("OPENROUTER_API_KEY is not set (or point OPENROUTER_BASE_URL at another "
                          "OpenAI-compatible server)")
    return soul, orient


def hardcoded_provider(settings: Settings) -> OpenRouterProvider:
    key = settings.openrouter_api_key.get_secret_value() if settings.openrouter_api_key else None
    return OpenRouterProvider(settings.openrouter_base_url, key, max_attempts=settings.llm_max_attempts,
                              backoff_base=settings.llm_backoff)


def cascade(settings: Settings, session: Session) -> list:
    """Tier 1 (the agent's adapter), tier 2 (its last working version), tier 3 (hard-coded)."""
    from brainstem.core.secrets import public_url
    from brainstem.state import lineage
    from brainstem.tools.adapters import dynamic_providers

    floor = lineage.floor(session.store, "provider:llm", settings.mode_floors())
    dynamic = dynamic_providers(session.store, session.agent_kv, session.record, session.policy(),
                                base_url=public_url(settings.openrouter_base_url), mode_floor=floor,
                                dry_run=session.mode == "dry_run")
    return [*dynamic, hardcoded_provider(settings)]


def wake(settings: Settings, store: Store, *, force: bool = False, providers: list | None = None,
         listeners=(), cancel: threading.Event | None = None, dry_run: bool = False) -> WakeResult:
    """One wake cycle. Raises only for misconfiguration (ConfigError, LockHeld, StoreUnavailable).

    ``dry_run``: one whole session now, whatever the schedule, with the real LLM and no side effect
    beyond its own karma (see :func:`dry_run_session`)."""
    if dry_run:
        return dry_run_session(settings, store, providers=providers, listeners=listeners, cancel=cancel)
    wake_config = _read_wake_config(store)
    until = agent_sleeping_until(store, wake_config)
    if until is not None and not force:
        return WakeResult("asleep", message=asleep_message(until), next_wake_after=iso(until))

    check_ready(store, settings, need_key=providers is None)  # misconfigured: fail before changing anything
    use_host_name(settings.hostname)
    running_here = karma_mod.unfinished_session(store)
    if running_here is not None and session_alive_here(running_here):
        # Its process is alive on this host: whatever the lock's clock says, it is not dead.
        raise LockHeld(f"another wake is running for this agent (session {running_here.get('id')}, pid "
                       f"{running_here.get('pid')} on this host); not waking twice")
    token = owner_token(uuid.uuid4().hex[:8])
    acquire_wake_lock(store, token, ttl_ms=int(settings.lease_seconds * 1000))
    lease = Lease(store, token, settings.lease_seconds).start()
    store.lease = (keys.WAKE_LOCK, token)  # from here the schedule, history and breadcrumb are fenced
    try:
        # Due is decided again under the lock: a wake that stalled after its first look (while
        # another ran a session and moved the schedule) must not run a second one.
        wake_config = _read_wake_config(store)
        until = agent_sleeping_until(store, wake_config, locked=True)
        if until is not None and not force:
            return WakeResult("asleep", message=asleep_message(until), next_wake_after=iso(until))
        return _session(settings, store, wake_config, providers, listeners, cancel, lease)
    finally:
        interruptible(False)
        lease.stop()
        store.lease = None
        try:
            store.release_lock(keys.WAKE_LOCK, token)
        finally:
            forget_token(token)


def dead_session_due(store: Store) -> bool:
    """True when the agent's last session died (its pessimistic advance stands and no lease is held) and
    its retry is due: the daemon's sweep wakes such agents without waiting for their next tick."""
    try:
        wake_config = store.get(keys.WAKE_CONFIG, "json")
    except MalformedValue:
        return False
    return (isinstance(wake_config, dict) and wake_config.get("set_by") == PESSIMISTIC
            and sleeping_until(wake_config, now_utc()) is not None and agent_sleeping_until(store, wake_config) is None)


def dry_run_session(settings: Settings, store: Store, *, providers: list | None = None, listeners=(),
                    cancel: threading.Event | None = None) -> WakeResult:
    """A session in a throwaway overlay of the store: tools do not run (each call is a ``tool_would_do``
    entry), and of everything it writes only its karma (marked ``dry_run``) and today's spend (the LLM
    calls are real, and so is their cost) reach the store. No lock is taken and no crash is closed:
    it changes nothing another wake could trip over."""
    from brainstem.store.overlay import OverlayStore

    check_ready(store, settings, need_key=providers is None)
    sid = f"dry-{uuid.uuid4().hex[:8]}"
    through = {keys.karma(sid), keys.SESSION_LAST_STARTED, keys.DAILY_COST, keys.COST_ANOMALIES, keys.UNLISTED_KARMA}
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


def make_budget(defaults: Defaults, settings: Settings, left_today: float,
                cancel: threading.Event | None = None) -> Budget:
    """The agent's configured budget, clamped under the operator's ceilings and what is left of today's."""
    budget = Budget(
        max_cost=min(clamp(defaults.session_budget.max_cost, settings.max_session_cost, 0.10), left_today),
        max_steps=int(clamp(defaults.session_budget.max_steps, settings.max_session_steps, 12)),
        max_duration=clamp(defaults.session_budget.max_duration_seconds, settings.max_session_seconds, 600),
        reserve_fraction=defaults.execution.reflect_reserve_fraction)
    if cancel is not None:
        budget.cancel = cancel
    return budget


def _next_number(store: Store) -> int:
    try:
        return store.incr(keys.SESSION_COUNTER)
    except MalformedValue:
        number = len(session_history.read(store)) + 1
        store.put(keys.SESSION_COUNTER, str(number))
        return number


@dataclass
class _Run:
    """One session's bookkeeping, filled in as it goes; :func:`_finish` closes it from this."""
    store: Store
    settings: Settings
    karma: Karma
    id: str
    number: int
    budget: Budget
    defaults: Defaults
    started: Any = field(default_factory=now_utc)
    outcome: str = outcomes.CLEAN
    reason: str | None = None  # why it ended so, when the outcome alone does not say (faults, interruptions)
    kind: str = "session"
    next_wake: dict | None = None
    reflect_wake: dict | None = None  # what reflection asked for; wins over the plan's request
    executor: Executor | None = None
    session: Session | None = None
    clean_snapshot: dict | None = None  # the watched keys as this session found them (auto-restore)
    mode: str = "live"  # or "dry_run"
    lease: Lease | None = None  # None: a dry run or a replay, which hold none


def _session(settings, store, wake_config, providers, listeners, cancel, lease: Lease | None, mode: str = "live",
             sid: str | None = None) -> WakeResult:
    dry = mode == "dry_run"
    crumb = None if dry else karma_mod.unfinished_session(store)  # a dry run closes nothing
    number = _next_number(store)
    sid = sid or f"{number}-{uuid.uuid4().hex[:6]}"
    crash = None
    problems: list[str] = []  # recorded as config_rejected once the session's karma begins
    if crumb is not None:
        crash = close_dead(store, crumb, detected_by=sid, on_reject=problems.append)
        if crash is None:
            crumb = None
    # Restore before anything below reads the keys it may put back, so this session runs with them.
    restored = None if dry else auto_restore(store, sid)
    soul, orient_template = check_ready(store, settings, need_key=providers is None)
    defaults, models = load_defaults(store, problems), effective_models(store, problems)
    left_today = max(0.0, settings.max_daily_cost - daily_spent(store))
    budget = make_budget(defaults, settings, left_today, cancel)
    # Every metered request holds its worst case against today's ceiling in the store before it goes.
    budget.daily = DailyLedger(store, settings.max_daily_cost)
    if lease is not None:
        budget.lost = lease.lost  # a lost lease stops the session at its next step or call
        lease.on_lost = lambda lost: _note_store_lost(store, sid, lost)

    karma = Karma(store, sid, Redactor(settings.known_secrets()), listeners=listeners)
    karma_mod.begin_session(store, sid, lease=lease.token if lease is not None else None)
    run = _Run(store=store, settings=settings, karma=karma, id=sid, number=number, budget=budget, defaults=defaults,
               clean_snapshot=snapshot(store), mode=mode, lease=lease)
    # From here on every way out records the end (or, with the store gone, leaves a note of it).
    try:
        # Advance the schedule before doing anything that could die.
        # If it dies, its agent is due again at retry_after once no lease is held (its host may have
        # died with it): at once after a first crash, then backing off, so a crash loop never spends
        # every tick. The whole default sleep stays the advance for wakes that cannot tell.
        default_sleep = clamp_sleep(defaults.wake.sleep_seconds, 21600)
        crashes = outcomes.crash_streak(session_history.recent(store, 32))
        retry_after = run.started + timedelta(seconds=outcomes.crash_backoff(crashes, default_sleep))
        store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(run.started + timedelta(seconds=default_sleep)),
                                     "set_by": PESSIMISTIC, "session_id": sid, "retry_after": iso(retry_after),
                                     "crash_streak": crashes})
        karma.record(events.SESSION_START, session_id=sid, number=number, store=store.display_url, version=__version__,
                 budget=budget.snapshot(), daily_budget_left=round(left_today, 6),
                 crashed_session=crumb.get("id") if crumb else None, dry_run=dry or None)
        if crash is not None:
            karma.record(events.CRASH_DETECTED, dead_session=crumb.get("id"), entries=crash.get("entries_total"),
                         crash_data=to_record(crash))
        if restored is not None:
            karma.record(events.AUTO_RESTORE, **restored)
        for p in problems:
            karma.record(events.CONFIG_REJECTED, reason=p)
        if not dry:
            for damaged in session_history.unreported_damage(store):
                karma.record(events.HISTORY_DAMAGED, position=damaged.get("position"), session=damaged.get("id"),
                             raw=damaged.get("raw"))
        if wake_config is not None and not isinstance(wake_config, dict):
            karma.record(events.CONFIG_REJECTED, key=keys.WAKE_CONFIG,
                         reason="wake_config was not a JSON object; repaired")
        interruptible(True)
        if budget.cancel.is_set():  # a signal arrived while the lock was being taken
            budget.check_cancel()
        context: dict[str, Any] = {"sessionId": sid, "now": iso(run.started), "crashData": crash}
        agent_kv = AgentKV(store, karma.record, on_privileged_write=lambda key, old, new, source: record_write(
            store, key, old, new, source=source, session_id=sid))
        # Every request sandboxed code sends to the LLM host, from the balance checkers on, is metered.
        def on_anomaly(anomaly: dict) -> None:
            note_anomaly(store, anomaly, sid)

        meter = WireMeter(models=models, budget=budget, record=karma.record, llm_base_url=settings.openrouter_base_url,
                          on_anomaly=on_anomaly)
        # One policy for all code of the session, the balance checkers included: grants withdrawn after a
        # secret_refused stay withdrawn, and the write quota counts once.
        policy = ToolPolicy.from_settings(settings, meter=meter, on_secrets=lambda granted: [
            karma.redact.add(n, v) for n, v in granted.items()])
        # Ground truth is part of the session's time: at most a quarter of it.
        facts = read_world(settings, store, karma, agent_kv, policy, dry_run=mode == "dry_run",
                           timeout=min(settings.ground_truth_timeout, max(1.0, budget.max_duration / 4)))
        context["balances"] = facts["balances"]
        context["kvUsage"] = facts["kvUsage"]
        fired = fired_tripwires(defaults.tripwires, facts)
        for tw in fired:
            karma.record(events.TRIPWIRE_FIRED, field=tw.field, op=tw.op, value=tw.value, effort=tw.effort)
        requested = wake_config.get("effort") if isinstance(wake_config, dict) else None
        effort = effort_for(_max_effort(defaults.wake.default_effort, requested), fired)
        karma.record(events.EFFORT, effort=effort, tripwires_fired=len(fired),
                     requested=requested if isinstance(requested, str) else None)

        session = run.session = Session(id=sid, number=number, settings=settings, store=store, karma=karma,
                                  agent_kv=agent_kv, defaults=defaults, models=models, budget=budget,
                                  llm=None, soul=soul, effort=effort,
                                  tool_registry=store.get_json(keys.CONFIG_TOOL_REGISTRY, default={}),
                                  context=context, mode=mode)
        session.tool_policy = policy
        session.llm = LLM(models=models, budget=budget, record=karma.record, soul=soul,
                    providers=providers if providers is not None else cascade(settings, session),
                    fallback_model=defaults.execution.fallback_model or models.fallback_model,
                    call_timeout=settings.llm_timeout, meter=meter,
                    on_anomaly=on_anomaly)
        deep = deep_reflect_due(store, defaults, number)  # (due, why): asked once, for reflexes and below
        sleep_for = check_reflexes(session, facts, run.started, deep_due=deep[0])
        if sleep_for is not None:  # a reflex handled the wake: no orient, no reflection, no LLM call
            run.kind, run.outcome, run.next_wake = "reflex", outcomes.HANDLED_BY_REFLEX, {"sleep_seconds": sleep_for}
        else:
            _think(run, session, orient_template, left_today, deep)
        interruptible(False)
        if budget.cancel.is_set() and run.outcome in (outcomes.CLEAN, outcomes.NO_PLAN, outcomes.BUDGET_EXHAUSTED):
            # the daemon or a signal is stopping it: say so, rather than blame the plan or budget
            run.outcome, run.reason = outcomes.INTERRUPTED, run.reason or stop_reason()
    except BudgetExceeded as exc:  # interrupted before the plan: a signal during the lock or ground truth
        interruptible(False)
        run.outcome = outcomes.INTERRUPTED if exc.limit == "interrupted" else outcomes.BUDGET_EXHAUSTED
        run.reason = stop_reason() if exc.limit == "interrupted" else str(exc)
    except LeaseLost:  # a fenced write refused: the lease is gone, and _finish records only that
        interruptible(False)
    except StoreUnavailable as exc:  # the store went away mid-session: the infrastructure's, not the agent's
        interruptible(False)
        run.outcome, run.reason = outcomes.STORE_UNAVAILABLE, str(exc)
        _try(lambda: karma.record(events.STORE_ERROR, error=run.reason))
    except Exception as exc:  # the one try/except: always an outcome, never a silent death
        interruptible(False)
        run.outcome = outcomes.ERROR
        run.reason = f"{type(exc).__name__}: {exc}"[:300]
        karma.record(events.FATAL_ERROR, error=f"{type(exc).__name__}: {exc}",
                 traceback=traceback.format_exc(limit=8)[-4000:])
    except WakeInterrupted as exc:  # SIGTERM/SIGINT to `brainstem wake`: recorded, the lock released, no crash
        interruptible(False)
        signal_name = str(exc)
        run.outcome, run.reason, run.clean_snapshot = outcomes.INTERRUPTED, f"received {signal_name}", None
        _try(lambda: karma.record(events.SIGNAL, signal=signal_name))
    except BaseException as exc:  # KeyboardInterrupt with no guard installed (in-process callers): record, let through
        interruptible(False)
        run.outcome, run.reason, run.next_wake, run.clean_snapshot = (outcomes.INTERRUPTED, type(exc).__name__,
                                                                      None, None)
        _finish(run)
        raise
    return _finish(run)


def _think(run: _Run, session: Session, orient_template: str, left_today: float, deep: tuple[bool, str]) -> None:
    """Deep reflection when it is due, else orient, the plan and reflection."""
    store, context = run.store, session.context
    load_session_context(session, context)
    due, why = deep
    context["deepReflectDue"] = due
    # What replay needs to run this session again with the context it saw: bounded by the memory caps
    # in config:defaults, and never more than CONTEXT_RECORD_CHARS (past that, replay says it cannot).
    recorded = to_record(context)
    size = len(karma_mod.encode_entry(recorded))
    if size <= CONTEXT_RECORD_CHARS:
        session.record(events.CONTEXT, context=recorded)
    else:
        session.record(events.CONTEXT, context=None, too_large=size, limit=CONTEXT_RECORD_CHARS)
    if due:
        from brainstem.state.memory import summary as memory_summary

        context["memoryStats"] = memory_summary(store, run.number)
        run.kind = "deep_reflect"
        session.record(events.DEEP_REFLECT, phase="start", reason=why)
        tally = _CallTally(session.llm)
        run.next_wake = run_deep_reflect(session)
        if tally.failed and not tally.ok and tally.last is not None:  # its one call failed: not clean
            _llm_fault(run, session, tally.last, "deep reflection")
    else:
        _plan_and_execute(run, session, orient_template, left_today)


def check_reflexes(session: Session, facts: dict, now, deep_due: bool = False) -> float | None:
    """Fire the reflexes whose conditions hold (:mod:`.reflexes`); the seconds to sleep when one of them
    handled the wake, else None (the wake goes on to orient, with any effort a reflex set). When deep
    reflection is due (``deep_due``) a reflex's tools run but it does not put the agent back to sleep."""
    from brainstem.state import reflexes

    store = session.store
    try:
        rules, fired_at = reflexes.load(store)
    except reflexes.ReflexError as exc:  # written around Brainstem: ignored whole, never half-applied
        session.record(events.CONFIG_REJECTED, key=keys.CONFIG_REFLEXES, reason=str(exc))
        return None
    if not rules:
        return None
    fs = reflexes.facts(facts.get("balances"), facts.get("kvUsage"), session.effort, session_history.recent(store, 100),
                        now)
    sleep_for = None
    for rule in rules:
        if not reflexes.holds(rule.when, fs):
            continue
        last = reflexes.cooling(rule, fired_at, now)
        if last is not None:
            session.record(events.REFLEX_SUPPRESSED, reflex=rule.name, reason="cooldown", last_fired=last,
                           cooldown_seconds=rule.cooldown_seconds)
            continue
        session.record(events.REFLEX_FIRED, reflex=rule.name, do=rule.do.model_dump(exclude_none=True))
        fired_at[rule.name] = iso(now)
        store.put(keys.REFLEX_STATE, fired_at)  # before its tools run: a crash mid-reflex still cools it
        ok = _reflex_tools(session, rule)
        if rule.do.effort is not None:  # raises the effort; a tripwire's higher effort stands
            session.effort = session.context["effort"] = _max_effort(session.effort, rule.do.effort)
        if rule.do.sleep_seconds is not None and ok:
            if deep_due:
                # A reflex never skips a due deep reflection: the agent must always get to reconsider its
                # rules, or one that sleeps on every wake would keep it asleep for good.
                session.record(events.REFLEX_SUPPRESSED, reflex=rule.name, reason="deep_reflection_due",
                               note="its tools ran; its sleep is held back so deep reflection runs")
                continue
            sleep_for = rule.do.sleep_seconds
            break
    return sleep_for


def _reflex_tools(session: Session, rule) -> bool:
    """Run a reflex's tool calls in order, under the session's budgets; False (recorded) when one is
    missing, refused by the budget or fails: the wake then goes on to a normal session."""
    from brainstem.tools.services import ToolError, load_tool

    for i, call in enumerate(rule.do.tools):
        step_id = f"reflex:{rule.name}:{i + 1}"
        try:
            load_tool(session.store, call.tool)
            session.budget.before_step()
        except (ToolError, BudgetExceeded) as exc:
            session.record(events.REFLEX_FAILED, reflex=rule.name, tool=call.tool, error=str(exc))
            return False
        session.budget.steps += 1
        out = session.run_tool(call.tool, call.input, step_id=step_id)
        if not out.ok:
            session.record(events.REFLEX_FAILED, reflex=rule.name, tool=call.tool, error=out.error)
            return False
    return True


def _try(fn) -> None:
    try:
        fn()
    except StoreUnavailable:
        pass


class _CallTally:
    """Counts the session's LLM calls that answered and that failed, from a point on (after orient)."""

    def __init__(self, llm: LLM):
        self.ok = self.failed = 0
        self.last: LLMError | None = None
        inner = llm.call

        def call(**kwargs):
            try:
                result = inner(**kwargs)
            except LLMError as exc:
                self.failed += 1
                self.last = exc
                raise
            self.ok += 1
            return result
        llm.call = call

    def reset(self) -> None:
        self.ok = self.failed = 0
        self.last = None


def _plan_and_execute(run: _Run, session: Session, orient_template: str, left_today: float) -> None:
    """Orient, then the plan's steps, then reflection (unless the runtime is shutting down)."""
    budget = run.budget
    tally = _CallTally(session.llm)
    try:
        plan = orient(session, orient_template)
    except BudgetExceeded as exc:  # no money (or time) left to plan with: a budget outcome, not a bad plan
        run.outcome = outcomes.INTERRUPTED if exc.limit == "interrupted" else outcomes.BUDGET_EXHAUSTED
        return
    except LLMError as exc:  # the hard-coded tier failed for the operator's or the provider's reasons
        _llm_fault(run, session, exc, "orient")
        return
    if plan is None:
        run.outcome = outcomes.NO_PLAN
        return
    tally.reset()
    budget.max_cost, budget.max_steps, budget.max_duration = plan_budget(plan, budget, run.settings, left_today)
    session.record(events.BUDGET, **budget.snapshot())

    def reflect() -> None:
        run.reflect_wake = run_reflect(session, executor.results_for_prompt(), plan.model_dump(exclude_none=True))

    executor = run.executor = Executor(session, plan.mid_session_tripwires, reflect=reflect)
    executor.run(plan.steps)
    if executor.stop is not None:
        run.outcome = executor.stop.outcome
    # Shutting down: finish fast; the next session reflects on this one's karma.
    if not executor.reflected and run.outcome != outcomes.INTERRUPTED and not budget.cancel.is_set():
        reflect()
    run.next_wake = run.reflect_wake or plan.next_wake_config
    if run.outcome == outcomes.CLEAN and tally.failed and not tally.ok and tally.last is not None:
        # Every call after orient failed: the session did nothing it meant to; not clean.
        _llm_fault(run, session, tally.last, "every call after orient")
        if run.outcome == outcomes.ERROR:
            run.reason = f"every LLM call after orient failed: {tally.last}"[:300]


def _llm_fault(run: _Run, session: Session, exc: LLMError, during: str) -> None:
    """An LLM failure that ended (or emptied) the session: its fault outcome, or ``error`` when it is
    the agent's own (an unknown model, its adapter)."""
    if exc.fault is None:
        run.outcome, run.reason = outcomes.ERROR, str(exc)[:300]
        return
    run.outcome, run.reason = exc.fault, f"{during}: {exc}"[:300]
    session.record(events.LLM_FAULT, outcome=exc.fault, status=exc.status, during=during, error=str(exc)[:1000],
             operator_action=outcomes.operator_action(exc.fault))


def _finish(run: _Run) -> WakeResult:
    """Record the end of the session. A store that went away is waited for, briefly, so the
    session is closed by itself (as ``store_unavailable``) rather than found dead by the next wake.
    A session whose lease is lost records only that, in its own karma (see :func:`_lease_lost`)."""
    delay, deadline = 0.25, time.monotonic() + STORE_RETRY_SECONDS
    while True:
        if run.lease is not None and run.lease.lost.is_set():
            return _lease_lost(run)
        try:
            return _record_end(run)
        except LeaseLost:
            return _lease_lost(run)
        except StoreUnavailable as exc:  # unreachable, full or read-only (a failover's replica): the store's
            # fault, never the agent's; a read-only or full store may pass as soon as an unreachable one
            if time.monotonic() + delay > deadline:
                # Gone for longer than we wait: a note on local disk, so the next wake records this
                # session as the store outage it was rather than as a crash of the agent's.
                if run.mode != "dry_run":
                    unrecorded.remember(run.store.display_url, run.id, outcomes.STORE_UNAVAILABLE, str(exc)[:300])
                raise
            if run.outcome != outcomes.STORE_UNAVAILABLE and run.outcome != outcomes.INTERRUPTED:
                run.outcome, run.reason = outcomes.STORE_UNAVAILABLE, str(exc)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


STORE_RETRY_SECONDS = 10.0


def _note_store_lost(store: Store, sid: str, lease: Lease) -> None:
    """A lease lost because the store was away: say so on local disk at once, before the store is back and
    a wake on this host finds the session's breadcrumb (see :mod:`.unrecorded`)."""
    if lease.cause == "store_unavailable":
        unrecorded.remember(store.display_url, sid, outcomes.STORE_UNAVAILABLE, lease.reason)


def _lease_lost(run: _Run) -> WakeResult:
    """The session's lease ran out or another wake holds it: it writes no end (the store would refuse
    it), only a ``lease_lost`` entry in its own karma, retried while the store is away as the end of a
    session is. The wake that holds the lease next finds its breadcrumb and closes it with what this
    entry says (``interrupted``, or ``store_unavailable`` when the store was gone), never as a crash
    of the agent's; with the store gone for longer, a note on local disk says so instead."""
    lease = run.lease
    reason = (lease.reason if lease is not None else None) or "the store refused a fenced write"
    cause = (lease.cause if lease is not None else None) or "taken_over"
    delay, deadline = 0.25, time.monotonic() + STORE_RETRY_SECONDS
    while True:
        try:
            with run.store.unfenced():  # the one thing a session without its lease still writes
                run.karma.record(events.LEASE_LOST, reason=reason, cause=cause, outcome=run.outcome,
                                 cost=round(run.budget.spent, 10), steps=run.budget.steps)
            break
        except StoreUnavailable as exc:
            if time.monotonic() + delay > deadline:
                unrecorded.remember(run.store.display_url, run.id, outcomes.STORE_UNAVAILABLE, str(exc)[:300])
                break
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return WakeResult("lease_lost", outcome=None, session_id=run.id,
                      message=f"session {run.id}: stopped, its wake lease was lost ({reason}); the wake that holds "
                              f"it next records its end")


def _record_end(run: _Run) -> WakeResult:
    store, budget = run.store, run.budget
    next_wake = run.next_wake if isinstance(run.next_wake, dict) else {}
    default_sleep = clamp_sleep(run.defaults.wake.sleep_seconds, 21600)
    sleep = clamp_sleep(next_wake.get("sleep_seconds"), run.defaults.wake.sleep_seconds)
    action = outcomes.operator_action(run.outcome)
    if action is not None:
        # The operator's (or the provider's) fault: try again soon, sooner the first times, so fixing
        # it works at the next tick without --force. A clean session ends the streak.
        streak = outcomes.fault_streak(session_history.recent(store, 32)) + 1
        sleep = max(MIN_SLEEP, outcomes.fault_backoff(streak, default_sleep))
    elif run.outcome == outcomes.INTERRUPTED:
        # Stopped from outside, its work cut short: due again as soon as the runtime is back.
        sleep = MIN_SLEEP
    ended = now_utc()
    wake_cfg = {"next_wake_after": iso(ended + timedelta(seconds=sleep)), "sleep_seconds": sleep, "set_by": run.id}
    if action is not None:
        wake_cfg["retry_after_fault"] = run.outcome
    if next_wake.get("effort") in ("low", "medium", "high", "max"):
        wake_cfg["effort"] = next_wake["effort"]
    store.put(keys.WAKE_CONFIG, wake_cfg)
    duration_ms = int((ended - run.started).total_seconds() * 1000)
    entry = {"id": run.id, "number": run.number, "kind": run.kind, "started_at": iso(run.started),
             "ended_at": iso(ended), "outcome": run.outcome, "cost": round(budget.spent, 10), "steps": budget.steps,
             "steps_failed": run.executor.steps_failed if run.executor else 0, "duration_ms": duration_ms}
    if run.reason:
        entry["reason"] = run.reason
    if action is not None:
        entry["operator_action"] = action
    last = store.get_json(keys.LAST_REFLECT, default=None)
    if isinstance(last, dict) and last.get("session_id") == run.id:
        summary = last.get("session_summary") or last.get("reflection")
        if summary:
            entry["summary"] = str(summary)[:300]
    if run.session is not None and run.session.reads:
        from brainstem.state.memory import flush_reads

        flush_reads(store, run.session.reads, run.number)
    if run.outcome == outcomes.CLEAN and run.kind == "session" and run.clean_snapshot is not None:
        save_clean_snapshot(store, run.clean_snapshot, run.id)
    expired = None
    # A dry run and a wake handled by reflexes are no sessions: each has its karma, not a history entry.
    if run.kind == "reflex" or run.mode == "dry_run":
        session_history.note_unlisted(store, run.id, run.settings.karma_retention_days, now=ended)
    else:
        # Keyed by id: a kill between this write and session_end leaves the session in the history, and
        # the next wake's crash detection skips it rather than record it a second time as crashed.
        expired = session_history.append(store, entry, retention_days=run.settings.karma_retention_days, now=ended,
                                         on_reject=lambda why: run.karma.record(
                                             events.CONFIG_REJECTED, key=keys.SESSION_HISTORY, reason=why,
                                             kept_raw_at=keys.REJECTED_SESSION_HISTORY))
    run.karma.record(events.SESSION_END, outcome=run.outcome, kind=run.kind, cost=round(budget.spent, 10),
                     steps=budget.steps, duration_ms=duration_ms, next_wake_after=wake_cfg["next_wake_after"],
                     karma_expired=expired or None, reason=run.reason, operator_action=action,
                     dry_run=run.mode == "dry_run" or None)
    karma_mod.end_session(store, run.id)
    what = {"reflex": "wake", "session": "session", "deep_reflect": "session"}.get(run.kind, "session")
    if run.mode == "dry_run":
        message = (f"dry run {run.id}: {run.outcome}, ${budget.spent:.4f}, {budget.steps} steps; nothing was "
                   f"written but its karma (brainstem karma {run.id})")
    else:
        message = (f"{what} {run.id}: {run.outcome}, ${budget.spent:.4f}, {budget.steps} steps; "
                   f"next wake {wake_cfg['next_wake_after']}")
    if action is not None:
        message += f"; operator: {action}"
    elif run.outcome == outcomes.INTERRUPTED and run.reason:
        message += f" ({run.reason})"
    return WakeResult("ran", outcome=run.outcome, session_id=run.id, next_wake_after=wake_cfg["next_wake_after"],
                      message=message)


def _max_effort(a: str, b: Any) -> str:
    from brainstem.state.config import max_effort

    return max_effort(a, b if isinstance(b, str) else None)
