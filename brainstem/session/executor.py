"""The step loop: action, think, agent, conditional, subplan, reflect and reply steps under hard budgets.

Read it top to bottom: :meth:`Executor.run` walks a list of steps; each step
is checked against the budget, skipped if it depends on something that
failed, has its ``{{variables}}`` substituted inside the parsed structure,
runs with retries, and stores its result. Failure is soft per step (recorded,
dependants skipped, the session goes on) unless the step says
``on_fail: stop_session`` or a mid-session tripwire fires.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from brainstem.core import events, keys, outcomes
from brainstem.core.plan import (
    KNOWN_TYPES,
    ActionStep,
    AgentStep,
    ConditionalStep,
    MidSessionTripwire,
    PlanError,
    ReflectStep,
    ReplyStep,
    SubPlan,
    SubplanStep,
    ThinkStep,
    UnknownStep,
    parse_plan,
)
from brainstem.core.templates import capped, references, render, substitute, to_text
from brainstem.core.untrusted import Untrusted
from brainstem.llm.chokepoint import LLMError
from brainstem.session.agent_step import AgentStepFailed, run_agent
from brainstem.session.reply import ReplyRefused, run_reply
from brainstem.session.stopping import SessionStopped
from brainstem.state.budget import BudgetExceeded

# Internal: a subplan that ran out of its own budget ends the subplan, not the session.
SUBPLAN_BUDGET = "subplan_budget"

_TRAILING = re.compile(r"[\s.!?,;:'\"`*)\]]+$")
_LEADING = re.compile(r"^[\s'\"`*(\[]+")


def normalise_answer(text: str) -> str:
    """Lower-case, trimmed of whitespace, quotes and trailing punctuation: ``" Yes!\\n"`` -> ``"yes"``."""
    return _LEADING.sub("", _TRAILING.sub("", text.strip().lower()))


def match_branch(answer: str, branches: dict[str, Any]) -> str | None:
    """The branch an answer selects: an exact match after normalising, else a branch named by its first word."""
    norm = normalise_answer(answer)
    by_norm = {normalise_answer(k): k for k in branches if k != "default"}
    if norm in by_norm:
        return by_norm[norm]
    first = normalise_answer(re.split(r"[\s,.;:!?]+", norm, maxsplit=1)[0]) if norm else ""
    return by_norm.get(first)


class StopSession(Exception):
    def __init__(self, outcome: str, reason: str):
        super().__init__(reason)
        self.outcome = outcome


class Executor:
    """Runs a plan's steps for one :class:`~brainstem.session.build.Session` (its failed steps counted in
    its state)."""

    def __init__(self, session, tripwires: list[MidSessionTripwire] | None = None,
                 reflect: Callable[[], Any] | None = None):
        self.session = session
        self.tripwires = tripwires or []
        self.reflect = reflect
        self.results: dict[str, Any] = {}
        # result name -> where an untrusted result came from: "tool:NAME", or "step:ID" for a model's answer
        # to a prompt that held untrusted text. Prompts show these results wrapped (_prompt_results).
        self.sources: dict[str, str] = {}
        self.failed_names: set[str] = set()
        self.failed_ids: set[str] = set()
        self.done_ids: set[str] = set()
        self.reflected = False
        self.stop: StopSession | None = None
        self._auto_id = 0

    # --- the loop ---
    def run(self, steps: list, depth: int = 0) -> None:
        for step in steps:
            if self.stop is not None:
                return
            try:
                self.run_step(step, depth)
            except StopSession as stop:
                self.stop = stop
                return

    def run_step(self, step, depth: int) -> None:
        session = self.session
        deps = session.deps
        sid = self._step_id(step)
        try:
            deps.stop.check()
            deps.budget.before_step()
        except (BudgetExceeded, SessionStopped) as exc:
            session.record(events.BUDGET_EXCEEDED, limit=exc.limit, step_id=sid, reason=str(exc),
                           **deps.budget.snapshot())
            raise _stop_for(exc) from None
        if isinstance(step, UnknownStep):
            session.record(events.UNKNOWN_STEP_TYPE, step_id=sid, type=step.type,
                     known=list(KNOWN_TYPES))
            self._failed(step, sid, f"unknown step type {step.type!r}", cascade_only=True)
            return
        blocked = self._blocked_by(step)
        if blocked:
            session.record(events.STEP_SKIPPED, step_id=sid, type=step.type, reason=blocked)
            self.failed_ids.add(sid)
            if step.store_result_as:
                self.failed_names.add(step.store_result_as)
            return
        deps.budget.steps += 1
        session.record(events.STEP_START, step_id=sid, type=step.type, depth=depth, step_number=deps.budget.steps,
                 max_steps=deps.budget.max_steps)
        retries = self._retries(step)
        last_error = "failed"
        for attempt in range(1, retries + 2):
            try:
                value, source = self._execute(step, sid, depth, attempt)
            except (BudgetExceeded, SessionStopped) as exc:
                self.failed_ids.add(sid)
                if step.store_result_as:
                    self.failed_names.add(step.store_result_as)
                self.session.record(events.STEP_FAILED, step_id=sid, type=step.type, error=str(exc))
                raise _stop_for(exc) from None
            except StopSession:
                raise
            except _StepFailure as exc:
                last_error = str(exc)
                if exc.final:
                    break
                continue
            self._succeeded(step, sid, value, source)
            self._check_cost_tripwire()
            return
        if attempt > 1:  # retries were made and all failed (a final error is not retried)
            session.record(events.RETRY_FAILED, step_id=sid, attempts=attempt, error=last_error)
        self._failed(step, sid, last_error)

    # --- one attempt of one step ---
    def _execute(self, step, sid: str, depth: int, attempt: int) -> tuple[Any, str | None]:
        if isinstance(step, ActionStep):
            args = self._substitute(step.input, for_prompt=False)
            out = self.session.run_tool(step.tool, args, attempt=attempt, step_id=sid)
            if not out.ok:
                raise _StepFailure(f"tool {step.tool}: {out.error}", final=not out.retryable)
            return out.value, f"tool:{step.tool}"
        if isinstance(step, ThinkStep):
            prompt = self._substitute(step.prompt, for_prompt=True)
            model = step.model or self.session.deps.defaults.orient.model
            max_tokens = step.max_tokens or self.session.deps.defaults.execution.think_max_tokens
            answer = self._ask("think", sid, model, to_text(prompt), max_tokens, step.effort).content
            return answer, self._derived_source(step.prompt, sid)
        if isinstance(step, AgentStep):
            prompt = to_text(self._substitute(step.prompt, for_prompt=True))
            try:
                answer = run_agent(self.session, step, sid, prompt)
            except AgentStepFailed as exc:
                raise _StepFailure(str(exc), final=exc.final) from None
            return answer, f"step:{sid}"  # tool results were in its conversation: untrusted like them
        if isinstance(step, ConditionalStep):
            return self._conditional(step, sid, depth), self._derived_source(step.prompt, sid)
        if isinstance(step, SubplanStep):
            return self._subplan(step, sid, depth), None
        if isinstance(step, ReplyStep):
            try:
                return run_reply(self.session, sid, self._substitute(step.to, for_prompt=False),
                                 self._substitute(step.text, for_prompt=False)), None
            except ReplyRefused as exc:
                raise _StepFailure(str(exc), final=True) from None
        if isinstance(step, ReflectStep):
            if self.reflected:
                return "already reflected this session", None
            if self.reflect is not None:
                self.reflect()
                self.reflected = True
            return None, None
        raise _StepFailure(f"unhandled step type {getattr(step, 'type', '?')}", final=True)

    def _ask(self, purpose: str, sid: str, model: str, prompt: str, max_tokens: int, effort: str | None = None):
        try:
            result = self.session.llm.call(purpose=purpose, model=model, prompt=prompt, max_tokens=max_tokens,
                                     effort=effort, step_id=sid)
        except LLMError as exc:
            raise _StepFailure(str(exc), final=exc.final or "unknown model" in str(exc)) from None
        if not result.content.strip():
            raise _StepFailure(f"{purpose}: the model returned an empty answer"
                               + (" (cut off by max_tokens)" if result.truncated else ""))
        return result

    def _conditional(self, step: ConditionalStep, sid: str, depth: int) -> str:
        options = [k for k in step.branches if k != "default"]
        prompt = to_text(self._substitute(step.prompt, for_prompt=True))
        prompt += f"\n\nAnswer with exactly one of: {', '.join(options)}. No other words."
        model = step.model or self.session.deps.defaults.reflect.model
        answer = self._ask("conditional", sid, model, prompt, 50).content
        chosen = match_branch(answer, step.branches)
        if chosen is None:
            fallback: str | None
            if step.default in step.branches:
                fallback = step.default
            else:
                fallback = "default" if "default" in step.branches else None
            self.session.record(events.CONDITIONAL_NO_MATCH, step_id=sid, answer=answer[:200], branches=options,
                                default=fallback)
            if fallback is None:
                raise _StepFailure(f"answer {answer[:80]!r} matches no branch ({', '.join(options)}) and there is "
                                   "no default branch", final=True)
            chosen = fallback
        self.run(step.branches[chosen], depth)
        return normalise_answer(answer) if chosen != "default" else "default"

    def _subplan(self, step: SubplanStep, sid: str, depth: int) -> dict:
        session = self.session
        deps = session.deps
        limit = deps.defaults.execution.max_subplan_depth
        if depth + 1 > limit:
            session.record(events.SUBPLAN_DEPTH_EXCEEDED, step_id=sid, depth=depth + 1, max_depth=limit)
            raise _StepFailure(f"subplan depth {depth + 1} exceeds the limit of {limit}", final=True)
        template = deps.store.get(keys.PROMPT_SUBPLAN) or DEFAULT_SUBPLAN_PROMPT
        max_steps = step.max_steps or 5
        prompt = render(template, {"goal": step.goal, "maxSteps": max_steps, "maxCost": step.max_cost,
                                   "depth": depth + 1, "results": self.results_for_prompt(),
                                   "tools": session.tools_for_prompt(), "models": session.models_for_prompt()})
        model = step.planner_model or deps.defaults.orient.model
        try:
            with deps.budget.cap(cost=step.max_cost):  # planning is part of what the subplan may spend
                answer = self._ask("subplan", sid, model, prompt, deps.defaults.orient.max_output_tokens)
        except BudgetExceeded as exc:
            if exc.limit != "subplan":
                raise
            raise _StepFailure(f"planning the subplan would exceed its max_cost of ${step.max_cost}",
                               final=True) from None
        try:
            sub = parse_plan(answer.content, answer.truncated, model=SubPlan)
        except PlanError as exc:
            raise _StepFailure(f"subplan: {exc}") from None
        steps = sub.steps[:max_steps]
        with deps.budget.cap(cost=step.max_cost, steps=max_steps):
            self.run(steps, depth + 1)
        if self.stop is not None and self.stop.outcome == SUBPLAN_BUDGET:
            session.record(events.BUDGET_EXCEEDED, limit="subplan", step_id=sid, reason=str(self.stop))
            self.stop = None
        return {"steps_planned": len(sub.steps), "steps_run": len(steps)}

    # --- bookkeeping ---
    def _succeeded(self, step, sid: str, value: Any, source: str | None) -> None:
        self.done_ids.add(sid)
        if step.store_result_as:
            self.results[step.store_result_as] = value
            self.failed_names.discard(step.store_result_as)
            if source:
                self.sources[step.store_result_as] = source
        self.session.record(events.STEP_COMPLETE, step_id=sid, type=step.type, stored_as=step.store_result_as,
                      result=_preview(value))

    def _failed(self, step, sid: str, error: str, cascade_only: bool = False) -> None:
        self.failed_ids.add(sid)
        self.session.state.steps_failed += 1
        if step.store_result_as:
            self.failed_names.add(step.store_result_as)
        if not cascade_only:
            self.session.record(events.STEP_FAILED, step_id=sid, type=step.type, error=error)
        on_fail = (step.failure.on_fail if step.failure and step.failure.on_fail
                   else self.session.deps.defaults.failure_handling.on_fail)
        if on_fail == "stop_session":
            raise StopSession(outcomes.STOPPED, f"step {sid} failed and asks to stop the session: {error}")
        for tw in self.tripwires:
            if tw.condition == "step_fails":
                self.session.record(events.TRIPWIRE_FIRED, condition="step_fails", step_id=sid)
                raise StopSession(outcomes.STOPPED, f"tripwire step_fails fired at step {sid}")

    def _check_cost_tripwire(self) -> None:
        for tw in self.tripwires:
            if tw.condition == "cost_above" and tw.value is not None and self.session.deps.budget.spent > tw.value:
                self.session.record(events.TRIPWIRE_FIRED, condition="cost_above", value=tw.value,
                              spent=round(self.session.deps.budget.spent, 6))
                raise StopSession(outcomes.STOPPED, f"tripwire cost_above {tw.value} fired")

    def _blocked_by(self, step) -> str | None:
        for dep in step.depends_on:
            if dep in self.failed_ids:
                return f"depends on step {dep}, which failed or was skipped"
            if dep not in self.done_ids:
                return f"depends on step {dep}, which has not run"
        fields = step.model_dump(exclude={"branches", "store_result_as", "id", "depends_on", "failure"})
        bad = references(fields) & self.failed_names
        if bad:
            return f"references {', '.join(sorted(bad))}, which failed"
        return None

    def _substitute(self, obj: Any, for_prompt: bool) -> Any:
        if not for_prompt:
            return substitute(obj, self.results)  # a tool's input: the raw values
        return render(obj, self._prompt_results()) if isinstance(obj, str) else obj

    def _prompt_results(self) -> dict[str, Any]:
        """Stored results as prompt variables: untrusted ones marked with their source."""
        return {name: Untrusted(value, self.sources[name]) if name in self.sources else value
                for name, value in self.results.items()}

    def _derived_source(self, prompt: Any, sid: str) -> str | None:
        """A model's answer to a prompt that showed untrusted results is untrusted too (it may repeat them)."""
        return f"step:{sid}" if references(prompt) & self.sources.keys() else None

    def results_for_prompt(self, max_chars: int | None = None) -> dict[str, Any]:
        """Stored results, each capped and marked: bounded for any prompt, and shown there as data.

        Tool results (and answers derived from them) name their source; every other result is a record
        of this session's work (a model's answer, a branch taken) and is marked as a step result.
        """
        cap = max_chars or self.session.deps.defaults.execution.max_result_chars
        out = {}
        for name, value in self.results.items():
            value = capped(value, cap)
            out[name] = Untrusted(value, self.sources.get(name) or f"result:{name}")
        return out

    def _retries(self, step) -> int:
        if step.failure is not None and step.failure.retries is not None:
            return step.failure.retries
        return self.session.deps.defaults.failure_handling.retries

    def _step_id(self, step) -> str:
        if step.id:
            return step.id
        self._auto_id += 1
        step.id = f"auto{self._auto_id}"
        return step.id


def _stop_for(exc: BudgetExceeded | SessionStopped) -> StopSession:
    # A subplan's own cap ends only that subplan; any other limit ends the session.
    if isinstance(exc, SessionStopped):
        return StopSession(outcomes.INTERRUPTED, str(exc))
    return StopSession(SUBPLAN_BUDGET if exc.limit == "subplan" else outcomes.BUDGET_EXHAUSTED, str(exc))


class _StepFailure(Exception):
    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final  # retrying cannot help (unknown model, depth exceeded...)


def _preview(value: Any, limit: int = 500) -> Any:
    text = to_text(value)
    return value if len(text) <= limit else text[:limit] + "…"


DEFAULT_SUBPLAN_PROMPT = (
    "Plan the sub-goal below as JSON: {\"steps\": [...]} using the same step format as the main plan, "
    "at most {{maxSteps}} steps.\n\nGoal: {{goal}}\n\nResults so far: {{results}}\n\nTools: {{tools}}")
