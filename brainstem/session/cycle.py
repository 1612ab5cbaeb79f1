"""The middle of a session: reflexes, then deep reflection or orient, the plan and reflection.

A session's :class:`~brainstem.session.state.SessionState` is filled in here as it goes; the wake
(:mod:`brainstem.session.wake`) starts it, and :mod:`brainstem.session.ending`
records how it ended. Replay runs :func:`work` on a recorded session's context,
so a replayed session takes exactly the path a live one does.
"""

from __future__ import annotations

from typing import Any

from brainstem.core import events, keys, outcomes
from brainstem.core.clock import iso
from brainstem.core.mcp_config import is_mcp
from brainstem.core.untrusted import to_record
from brainstem.llm.chokepoint import LLM, LLMError
from brainstem.session.build import Session
from brainstem.session.context import load_session_context
from brainstem.session.executor import Executor
from brainstem.session.interrupt import stop_reason
from brainstem.session.orient import orient, plan_budget
from brainstem.session.reflect import deep_memory, run_deep_reflect, run_reflect
from brainstem.session.stopping import OUTCOMES, SessionStopped, stop_of
from brainstem.state import config, reflexes
from brainstem.state import history as session_history
from brainstem.state.budget import BudgetExceeded
from brainstem.store import karma as karma_mod
from brainstem.tools.tool import ToolError, load_tool

CONTEXT_RECORD_CHARS = 1_000_000  # orient's context as karma records it for replay


def think(session: Session, orient_template: str, left_today: float, deep: tuple[bool, str]) -> None:
    """Deep reflection when it is due, else orient, the plan and reflection."""
    state, context = session.state, session.state.context
    load_session_context(session)
    due, why = deep
    context["deepReflectDue"] = due
    if due:  # what deep reflection is shown of memory, recorded with the rest
        context.update(deep_memory(session))
    # What replay needs to run this session again with the context it saw: bounded by the memory caps
    # in config:defaults, and never more than CONTEXT_RECORD_CHARS (past that, replay says it cannot).
    recorded = to_record(context)
    size = len(karma_mod.encode_entry(recorded))
    if size <= CONTEXT_RECORD_CHARS:
        session.record(events.CONTEXT, context=recorded, inbox_ids=state.inbox_ids or None)
    else:
        session.record(events.CONTEXT, context=None, too_large=size, limit=CONTEXT_RECORD_CHARS)
    work(session, orient_template, left_today, deep)


def work(session: Session, orient_template: str, left_today: float, deep: tuple[bool, str]) -> None:
    """What a session does once its context is recorded (a replay starts here, on the recorded one):
    deep reflection when it is due, else orient, the plan and reflection."""
    state = session.state
    due, why = deep
    if due:
        state.kind = "deep_reflect"
        session.record(events.DEEP_REFLECT, phase="start", reason=why)
        state.next_wake = run_deep_reflect(session)
        missed_reflection(session, "deep reflection")
    else:
        plan_and_execute(session, orient_template, left_today)


class CallTally:
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
        llm.call = call  # type: ignore[method-assign]  # this session's LLM, counted from here on

    def reset(self) -> None:
        self.ok = self.failed = 0
        self.last = None


def plan_and_execute(session: Session, orient_template: str, left_today: float) -> None:
    """Orient, then the plan's steps, then reflection (unless the runtime is shutting down)."""
    deps, state = session.deps, session.state
    budget = deps.budget
    tally = CallTally(session.llm)
    try:
        plan = orient(session, orient_template)
    except (BudgetExceeded, SessionStopped) as exc:
        # No money (or time) left to plan with: a budget outcome, not a bad plan. Stopped from outside
        # while planning: interrupted (the wake gives no reason then).
        state.outcome = OUTCOMES[stop_of(exc).reason] or state.outcome
        if isinstance(exc, BudgetExceeded):
            state.reason = f"no plan was asked for: {exc}"[:300]
        return
    except LLMError as exc:  # the hard-coded tier failed for the operator's or the provider's reasons
        llm_fault(session, exc, "orient")
        return
    if plan is None:
        state.outcome = outcomes.NO_PLAN  # its reason: orient gave it, from its last orient_parse_error
        return
    tally.reset()
    budget.max_cost, budget.max_steps, budget.max_duration = plan_budget(plan, budget, deps.settings, left_today)
    session.record(events.BUDGET, **budget.snapshot())

    def reflect() -> None:
        state.reflect_wake = run_reflect(session, executor.results_for_prompt(), plan.model_dump(exclude_none=True))

    executor = Executor(session, plan.mid_session_tripwires, reflect=reflect)
    executor.run(plan.steps)
    if executor.stop is not None:
        state.outcome = executor.stop.outcome
        state.reason = stop_reason() if state.outcome == outcomes.INTERRUPTED else str(executor.stop)[:300] or None
    # Shutting down: finish fast; the next session reflects on this one's karma.
    if not executor.reflected and state.outcome != outcomes.INTERRUPTED and not deps.stop.cancel.is_set():
        reflect()
    state.next_wake = state.reflect_wake or plan.next_wake_config
    missed_reflection(session, "reflection")
    if state.outcome == outcomes.CLEAN and tally.failed and not tally.ok and tally.last is not None:
        # Every call after orient failed: the session did nothing it meant to; not clean.
        llm_fault(session, tally.last, "every call after orient")
        if state.outcome == outcomes.ERROR:
            state.reason = f"every LLM call after orient failed: {tally.last}"[:300]


def missed_reflection(session: Session, during: str) -> None:
    """A session whose reflection did not happen does not end as if it had. Its call refused by a limit:
    ``budget_exhausted``. A deep reflection (the session's one piece of work) failed at the provider: that
    fault's outcome; answered unusably: ``no_reflection``. After a plan that ran, a reflection lost to the
    provider or to an unusable answer leaves the outcome ``clean`` with the reason given. A stop from
    outside is the wake's to record (``interrupted``, or the lost lease)."""
    state, missed = session.state, session.state.missed
    if missed is None or state.outcome != outcomes.CLEAN or isinstance(missed.exc, SessionStopped):
        return
    deep = state.kind == "deep_reflect"
    if isinstance(missed.exc, LLMError) and deep:
        llm_fault(session, missed.exc, during)
        return
    if isinstance(missed.exc, BudgetExceeded):
        state.outcome = outcomes.BUDGET_EXHAUSTED
    elif deep:
        state.outcome = outcomes.NO_REFLECTION
    state.reason = f"{during} did not happen: {missed.error}"[:300]


def llm_fault(session: Session, exc: LLMError, during: str) -> None:
    """An LLM failure that ended (or emptied) the session: its fault outcome, or ``error`` when it is
    the agent's own (an unknown model, its adapter)."""
    state = session.state
    if exc.fault is None:
        state.outcome, state.reason = outcomes.ERROR, str(exc)[:300]
        return
    state.outcome, state.reason = exc.fault, f"{during}: {exc}"[:300]
    session.record(events.LLM_FAULT, outcome=exc.fault, status=exc.status, during=during, error=str(exc)[:1000],
                   operator_action=outcomes.operator_action(exc.fault))


def check_reflexes(session: Session, facts: dict, now, deep_due: bool = False,
                   urgent_inbox: bool = False) -> float | None:
    """Fire the reflexes whose conditions hold (:mod:`.reflexes`); the seconds to sleep when one of them
    handled the wake, else None (the wake goes on to orient, with any effort a reflex set). When deep
    reflection is due (``deep_due``), or an urgent message from the operator waits (``urgent_inbox``), a
    reflex's tools run but it does not put the agent back to sleep."""
    store, state = session.deps.store, session.state
    try:
        rules, fired_at = reflexes.load(store)
    except reflexes.ReflexError as exc:  # written around Brainstem: ignored whole, never half-applied
        session.record(events.CONFIG_REJECTED, key=keys.CONFIG_REFLEXES, reason=str(exc))
        return None
    if not rules:
        return None
    fs = reflexes.facts(facts.get("balances"), facts.get("kvUsage"), state.effort, session_history.recent(store, 100),
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
        ok = reflex_tools(session, rule)
        if rule.do.effort is not None:  # raises the effort; a tripwire's higher effort stands
            state.effort = state.context["effort"] = max_effort(state.effort, rule.do.effort)
        if rule.do.sleep_seconds is not None and ok:
            if deep_due:
                # A reflex never skips a due deep reflection: the agent must always get to reconsider its
                # rules, or one that sleeps on every wake would keep it asleep for good.
                session.record(events.REFLEX_SUPPRESSED, reflex=rule.name, reason="deep_reflection_due",
                               note="its tools ran; its sleep is held back so deep reflection runs")
                continue
            if urgent_inbox:
                # Nor an urgent message from the operator: it would wake the agent again at once.
                session.record(events.REFLEX_SUPPRESSED, reflex=rule.name, reason="urgent_inbox",
                               note="its tools ran; its sleep is held back so the agent reads its operator's "
                                    "urgent message")
                continue
            sleep_for = rule.do.sleep_seconds
            break
    return sleep_for


def reflex_tools(session: Session, rule) -> bool:
    """Run a reflex's tool calls in order, under the session's budgets; False (recorded) when one is
    missing, refused by the budget or fails: the wake then goes on to a normal session."""
    deps = session.deps
    for i, call in enumerate(rule.do.tools):
        step_id = f"reflex:{rule.name}:{i + 1}"
        try:
            if not is_mcp(call.tool):  # an MCP tool's server is asked when it runs
                load_tool(deps.store, call.tool)
            deps.stop.check()
            deps.budget.before_step()
        except (ToolError, BudgetExceeded, SessionStopped) as exc:
            session.record(events.REFLEX_FAILED, reflex=rule.name, tool=call.tool, error=str(exc))
            return False
        deps.budget.steps += 1
        out = session.run_tool(call.tool, call.input, step_id=step_id)
        if not out.ok:
            session.record(events.REFLEX_FAILED, reflex=rule.name, tool=call.tool, error=out.error)
            return False
    return True


def max_effort(a: str, b: Any) -> str:
    return config.max_effort(a, b if isinstance(b, str) else None)
