"""Orient: the session's one call for a plan.

The orient prompt (``prompt:orient``, the agent's) is rendered with the soul,
models, resources, config, tools and context; the answer is parsed leniently and
validated (:mod:`brainstem.core.plan`). An answer that is no plan gets one repair
call with the reason; then the session has no plan. A failure that is the
operator's or the provider's (the key, credit, endpoint) is raised for the
lifecycle to record as such, never as a bad plan.
"""

from __future__ import annotations

from brainstem.core import events, keys
from brainstem.core.plan import Plan, PlanError, parse_plan
from brainstem.core.settings import Settings
from brainstem.llm.chokepoint import LLMError
from brainstem.session.build import Session
from brainstem.session.context import with_inbox
from brainstem.session.prompt_cache import next_session, orient_kind, render_parts
from brainstem.session.stopping import SessionStopped
from brainstem.state import inbox
from brainstem.state.budget import Budget, BudgetExceeded, clamp


def orient(session: Session, template: str) -> Plan | None:
    """Ask for a plan; one repair attempt with the validation error; None when there is none."""
    deps, state = session.deps, session.state
    missing: list[str] = []
    variables = {"soul": deps.soul, "models": session.models_for_prompt(), "resources": deps.store.get_json(
        keys.CONFIG_RESOURCES, default={}), "config": deps.defaults.model_dump(), "tools": session.tools_for_prompt(),
        "context": state.context}
    # In parts, stable first (see prompt_cache): joined, the prompt as the template renders it.
    parts = render_parts(with_inbox(template, state.context), variables, orient_kind, on_missing=missing.append)
    # {{page}}-style names are plan references the prompt may show as examples; only a path
    # into a real template variable that does not resolve is a mistake worth recording.
    missing = [m for m in missing if m.split(".")[0] in variables]
    if missing:
        session.record(events.TEMPLATE_MISSING_VARIABLE, template=keys.PROMPT_ORIENT, names=sorted(set(missing)))
    cfg = deps.defaults.orient
    turns: list[dict] = []  # the failed answer and its repair request
    ask: str | list[str] = parts
    reuse = next_session(session)
    if state.inbox_ids:
        # Put before the model: an urgent one among them wakes the agent no more, answered or not. They
        # stay unread until the model answers (below) and the session ends (see ending.record_end).
        inbox.note_shown(deps.store, max(state.inbox_ids))
        session.record(events.INBOX_SHOWN, ids=state.inbox_ids)
    error = ""
    for attempt in (1, 2):
        try:
            result = session.llm.call(purpose="orient", model=cfg.model, prompt=ask, max_tokens=cfg.max_output_tokens,
                                effort=state.effort if state.effort != "low" else cfg.effort, history=turns,
                                reuse=reuse)
            state.inbox_answered = True  # the model has read the prompt that showed them
        except (BudgetExceeded, SessionStopped) as exc:
            if attempt == 1:
                raise  # recorded by the chokepoint as budget_exceeded; the session ends budget_exhausted
            return _no_plan(session, attempt, f"orient repair refused: {exc}")
        except LLMError as exc:
            if exc.fault is not None:
                # The key, the credit or the endpoint: not the agent's fault, so not a failing session for
                # auto-restore (recorded as llm_fault by the caller, with what the operator must do).
                raise
            return _no_plan(session, attempt, f"orient call failed: {exc}")
        try:
            plan = parse_plan(result.content, result.truncated)
        except PlanError as exc:
            error = str(exc)
            session.record(events.ORIENT_PARSE_ERROR, attempt=attempt, error=error, answer=result.content[:2000])
            # The prompt as it was sent (marked for caching, when it was), so the repair reads it from the cache.
            sent = result.sent_prompt or {"role": "user", "content": "".join(parts)}
            turns = [sent, {"role": "assistant", "content": result.content}]
            ask = (f"Your answer could not be used as a plan: {exc}. Reply with only the corrected JSON object "
                   "(keys: steps, session_budget, mid_session_tripwires, next_wake_config), nothing else.")
            continue
        session.record(events.PLAN, steps=len(plan.steps), types=[st.type for st in plan.steps][:50],
                 session_budget=plan.session_budget.model_dump(exclude_none=True) if plan.session_budget else None)
        return plan
    session.state.reason = f"orient gave no usable plan: {error}"[:300]
    return None


def _no_plan(session: Session, attempt: int, error: str) -> Plan | None:
    """No plan from this attempt, and none to come: recorded, and the session's reason."""
    session.record(events.ORIENT_PARSE_ERROR, attempt=attempt, error=error)
    session.state.reason = f"orient gave no usable plan: {error}"[:300]
    return None


def plan_budget(plan: Plan, budget: Budget, settings: Settings, left_today: float) -> tuple[float, int, float]:
    """The session budget once the plan is known: what the plan asks, clamped under the operator's
    ceilings and what is left of today's."""
    pb = plan.session_budget
    if pb is None:
        return budget.max_cost, budget.max_steps, budget.max_duration
    return (min(clamp(pb.max_cost, settings.max_session_cost, budget.max_cost), left_today),
            int(clamp(pb.max_steps, settings.max_session_steps, budget.max_steps)),
            clamp(pb.max_duration_seconds, settings.max_session_seconds, budget.max_duration))
