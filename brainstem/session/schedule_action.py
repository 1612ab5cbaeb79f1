"""One run of a schedule: its tool, the summary it may ask for, and the message to the operator.

:mod:`.schedule_run` hands here a run it has claimed (its run lease held, its writes fenced by it). The
tool runs through the same :func:`~brainstem.tools.services.run_tool` a session's step does, under the
operator's policy: its mode and the operator's floors (``manual`` never runs on its own: ``refused``;
``supervised`` runs and waits in the review inbox as a session's run would), its grants, the write
quotas. What it spends is held to one session's ceiling (``BRAINSTEM_MAX_SESSION_COST``) and to
today's, which every process of the agent books against: a run that would pass either is ``refused``.

``synthesize`` is exactly one LLM call through the chokepoint (the soul as its system message, the
tool's result in it as untrusted text, the model a think step would use); ``notify`` sends the message
to the inbox, as the agent, or to the operator's Telegram chat. A message that cannot be made or sent is
recorded in the run's karma; the run's outcome stays the tool's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from brainstem.core import events, keys
from brainstem.core.errors import BrainstemError
from brainstem.core.settings import Settings
from brainstem.core.untrusted import Untrusted
from brainstem.llm.chokepoint import LLM, LLMError, is_simulated
from brainstem.llm.meter import WireMeter
from brainstem.session import credit_floor
from brainstem.session.build import agent_view, hardcoded_provider, learner, queue_review, screen_answers
from brainstem.state import inbox, refusals
from brainstem.state.budget import Budget, BudgetExceeded, DailyLedger, daily_spent, note_anomaly
from brainstem.state.config import effective_models, load_defaults, operator_models
from brainstem.state.schedules import FAILED, OK, REFUSED, Schedule
from brainstem.store.base import Store
from brainstem.store.karma import Karma
from brainstem.tools.bot_api import SEND_TIMEOUT
from brainstem.tools.operator_chat import NotSent, send
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import ToolOutcome, run_tool

MESSAGE_CHARS = 4000  # what one message may hold (the inbox's, and within Telegram's 4096)


@dataclass
class Done:
    """How a run went: its outcome and why, what it cost, and the message made of it and where it went."""

    outcome: str
    reason: str | None = None
    cost: float = 0.0
    message: str | None = None
    notified: str | None = None  # where the message went ("inbox", "telegram"); None: nowhere
    notify_error: str | None = None  # why it was not made or not sent


class _Run:
    """What one run works with: its store view, recorder, budget and policy."""

    def __init__(self, settings: Settings, store: Store, karma: Karma, schedule: Schedule, run_id: str,
                 providers: Sequence | None):
        self.settings, self.store, self.karma, self.schedule, self.run_id = settings, store, karma, schedule, run_id
        self.providers = list(providers) if providers is not None else None
        self.seen: set[str] = set()
        # Answered only from a cassette, it moves no money: today's real spend does not shrink it.
        simulated = bool(self.providers) and all(is_simulated(p) for p in self.providers or ())
        left_today = max(0.0, settings.max_daily_cost - (0.0 if simulated else daily_spent(store)))
        self.budget = Budget(max_cost=min(settings.max_session_cost, left_today), max_steps=1,
                             max_duration=settings.max_session_seconds, reserve_fraction=0.0,
                             daily=DailyLedger(store, settings.max_daily_cost))
        self.simulated = simulated
        self.daily_binds = left_today <= settings.max_session_cost  # today's ceiling, not the per-run one
        self.models = effective_models(store, [])
        self.meter = WireMeter(models=self.models, budget=self.budget, record=self.record,
                               llm_base_url=settings.llm_base_url, on_anomaly=self.on_anomaly,
                               operator_ids=frozenset(m.id for m in operator_models(store).models))
        self.policy = ToolPolicy.from_settings(settings, meter=self.meter, on_secrets=learner(karma))

    def record(self, event: str, **fields: Any) -> dict:
        self.seen.add(event)
        return self.karma.record(event, **fields)

    def on_anomaly(self, anomaly: dict) -> None:
        note_anomaly(self.store, anomaly, self.run_id)


def perform(settings: Settings, store: Store, karma: Karma, schedule: Schedule, run_id: str,
            providers: Sequence | None = None) -> Done:
    """Run ``schedule``'s tool once, make its message and send it; the outcome and what it cost."""
    run = _Run(settings, store, karma, schedule, run_id, providers)
    done, value = _refused_before(run), None
    if done is None:
        with closing(run.policy):  # an MCP tool's server ends with the run
            out = _run_tool(run)
        done, value = _judge(run, out), (out.value if out.ok else out.error)
    if done.outcome in (OK, FAILED):
        done = _message(run, done, value)
    if done.message is not None and schedule.notify != "none":
        _notify(run, done)
    done.cost = round(run.budget.spent, 10)
    return done


def _refused_before(run: _Run) -> Done | None:
    """``refused`` before the tool runs: the agent's code is held, or a summary is asked for and no money
    is left under the ceilings to pay for it (nothing is spent beyond them)."""
    if refusals.held(run.store):
        return Done(REFUSED, refusals.HELD_MESSAGE)
    if run.schedule.synthesize:
        left, limit = run.budget.headroom(simulated=run.simulated)
        limit = "daily" if run.daily_binds and not run.simulated else limit
        if left <= 0:
            ceiling = run.budget.daily.ceiling if limit == "daily" and run.budget.daily else run.budget.max_cost
            run.record(events.BUDGET_EXCEEDED, limit=limit, purpose="synthesize", spent=round(run.budget.spent, 6),
                       budget=round(ceiling, 6))
            return Done(REFUSED, f"nothing left under the {_ceiling_name(limit)} to pay for its summary; not run")
    return None


def _ceiling_name(limit: str) -> str:
    return "daily ceiling (BRAINSTEM_MAX_DAILY_COST)" if limit == "daily" else \
        "per-run ceiling (BRAINSTEM_MAX_SESSION_COST)"


def _run_tool(run: _Run) -> ToolOutcome:
    settings, schedule = run.settings, run.schedule
    cap = settings.review_max_per_session

    def review_room() -> str | None:
        return None if cap > 0 else "BRAINSTEM_REVIEW_MAX_PER_SESSION is 0: no run is queued for review"

    def supervised(outcome: ToolOutcome) -> None:  # the run waits for the operator's verdict
        queue_review(run.store, run.karma, run.run_id, schedule.tool, None, schedule.input, outcome, cap)

    return run_tool(schedule.tool, dict(schedule.input), store=run.store,
                    agent_kv=agent_view(run.store, run.karma, run.run_id, settings), record=run.record,
                    policy=run.policy,
                    max_timeout_ms=int(run.budget.max_duration * 1000), enforce_mode=True,
                    on_supervised=supervised, review_room=review_room, floors=settings.mode_floors())


def _judge(run: _Run, out: ToolOutcome) -> Done:
    """The run's outcome from the tool's."""
    if out.not_run == "manual":
        return Done(REFUSED, f"{run.schedule.tool} is manual (its mode, or the operator's floor for it): it never "
                             "runs on its own; the operator runs it with brainstem tool run")
    if out.not_run is not None:
        return Done(REFUSED, out.error or f"not run: {out.not_run}")
    if events.BUDGET_EXCEEDED in run.seen:
        return Done(REFUSED, f"a spend ceiling stopped it: {out.error or 'its request was refused'}"[:300])
    if not out.ok:
        return Done(FAILED, str(out.error or "the tool failed")[:300])
    return Done(OK)


def _message(run: _Run, done: Done, value: Any) -> Done:
    """The text sent: the summary ``synthesize`` asks for of a result, else the result (or the failure)."""
    schedule = run.schedule
    if done.outcome == FAILED:
        done.message = _capped(f"schedule {schedule.id}: {schedule.tool} failed: {value}", run)
        return done
    plain = _capped(f"schedule {schedule.id}: {schedule.tool}: {_as_text(value)}", run)
    if not schedule.synthesize:
        done.message = plain
        return done
    held = None if run.simulated else credit_floor.blocked_now(run.store)
    if held is not None:  # no paid call while the credit floor or the 402 breaker holds, between wakes too
        done.message, done.notify_error = plain, f"no summary was asked for ({held}): the result was sent as it is"
        return done
    try:
        answer = _synthesize(run, value)
    except BudgetExceeded as exc:  # it would pass a ceiling: refused, and nothing is sent
        return Done(REFUSED, f"its summary would pass the {_ceiling_name(exc.limit)}: {exc}"[:300])
    except LLMError as exc:
        done.message, done.notify_error = plain, f"synthesize failed, the result was sent as it is: {exc}"[:300]
        return done
    done.message = _capped(answer, run) if answer.strip() else plain
    return done


def _synthesize(run: _Run, value: Any) -> str:
    """One LLM call: the schedule's prompt, and the tool's result as untrusted text; its answer."""
    schedule, store = run.schedule, run.store
    defaults = load_defaults(store, [])
    llm = LLM(models=run.models, budget=run.budget, record=run.record, soul=store.get(keys.SOUL) or "",
              providers=run.providers if run.providers is not None else [hardcoded_provider(run.settings)],
              fallback_model=None, call_timeout=run.settings.llm_timeout, on_anomaly=run.on_anomaly,
              screen=screen_answers(store, run.karma, run.policy))
    result = Untrusted(value, f"tool:{schedule.tool}")
    prompt = (f"{schedule.synthesize}\n\nThe result of the tool {schedule.tool}, run by the schedule "
              f"{schedule.id}:\n{result.text()}")
    answer = llm.call(purpose="synthesize", model=defaults.orient.model, prompt=prompt,
                      max_tokens=defaults.execution.think_max_tokens)
    return answer.content


def _notify(run: _Run, done: Done) -> None:
    """Send the message where the schedule says; a failure is kept in ``notify_error``."""
    schedule, text = run.schedule, done.message or ""
    try:
        if schedule.notify == "inbox":
            message = inbox.post(run.store, text, sender="agent",
                                 extra={"via": "schedule", "schedule": schedule.id, "run": run.run_id})
            done.notified = f"inbox:{message['id']}"
        elif schedule.notify == "telegram":
            sent = send(run.policy, text, SEND_TIMEOUT, tool=schedule.tool, record=run.record, charge=_free)
            done.notified = f"telegram:{sent.get('message_id')}"
    except (NotSent, inbox.InboxError, BrainstemError) as exc:
        error = f"{schedule.notify}: not sent: {exc}"[:300]
        done.notify_error = f"{done.notify_error}; {error}" if done.notify_error else error


def _free(_what: str, _size: int) -> None:
    """The runtime's own message: not code's, so no write quota is charged for it."""


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _capped(text: str, run: _Run) -> str:
    """``text`` with every secret the run knows redacted, cut to what one message may hold."""
    text = run.karma.redact(str(text))
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 20] + " [cut]"


def describe(done: Done) -> dict[str, Any]:
    """The fields of the ``schedule_run`` entry a run's :class:`Done` gives."""
    fields: dict[str, Any] = {"reason": done.reason, "notified": done.notified, "notify_error": done.notify_error}
    if done.message is not None:
        fields["message"] = done.message
    return {k: v for k, v in fields.items() if v is not None}

