"""Replay: a recorded session, run again against today's prompts, config, tools and code.

Karma is the test set. A session's karma holds what replay needs: everything
up to its ``context`` entry is the context the session saw (ground truth,
effort, crash data, the loaded keys, the last reflection), each ``llm_call``
holds its request and answer, and each ``fetch`` its response (capped). Replay
copies that prefix, then runs orient, the plan and reflection again:

* in a throwaway overlay of the store (:mod:`brainstem.store.overlay`): no key,
  schedule, session history or daily spend changes;
* LLM answers come from the recording wherever the request is the same (the
  same model and messages; clock times and durations in them are ignored).
  Otherwise ``live`` asks the model (priced, budgeted, counted towards today's
  spend, and its karma kept as ``replay-…``), or the call is a
  ``changed_request``;
* tools run in the sandbox against the overlay; their fetches are answered with
  what the original session received, and a fetch it never made fails.

:func:`compare` sets old beside new (plan, step outcomes and results, store
writes, cost, reflection); nothing in the comparison depends on the clock, so
the same session and config give byte-identical output.

Deep reflection's gate (:mod:`brainstem.session.gate`) runs proposed changes
through it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from brainstem import __version__
from brainstem.core import events, keys, outcomes
from brainstem.core.errors import BrainstemError
from brainstem.core.json_numbers import finite_or
from brainstem.core.untrusted import from_record
from brainstem.llm.chokepoint import LLMError
from brainstem.llm.messages import parse_tool_calls
from brainstem.llm.openrouter import LLMResponse
from brainstem.session.build import build_session, check_ready, hardcoded_provider, make_budget
from brainstem.session.cycle import Course, plan_and_execute
from brainstem.state import history as session_history
from brainstem.state.budget import DailyLedger, daily_spent
from brainstem.state.config import effective_models, load_defaults
from brainstem.store import karma as karma_mod
from brainstem.store.base import Store
from brainstem.store.karma import Karma, Redactor
from brainstem.store.overlay import OverlayStore
from brainstem.tools.policy import ToolPolicy

# Entries re-recorded with the answer that served them: what the original call logged on its way
# (an adapter's fetches, a tier falling back), so the karma a reflection reads is the same.
_CALL_SIDE = frozenset({events.FETCH, events.TOOL_LOG, events.PROVIDER_FALLBACK, events.SECRET_REFUSED,
                        events.SECRET_NOT_GRANTED, events.COST_ANOMALY})
_VOLATILE = [  # clock readings in prompts (a karma digest's times and durations): not part of "the same request"
    (re.compile(r"\d\d:\d\d:\d\d\.\d{3} \+\s*\d+\.\d\ds"), "T +E"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "TIME"),
    (re.compile(r"\b(duration_ms|elapsed_ms|elapsed_s)=[\d.]+"), r"\1=N"),
    (re.compile(r"\b\d+ ms\b"), "N ms"),
    (re.compile(r"\btier=\S+"), "tier=T"),
]
CHARS_PER_TOKEN = 4  # an answer cut by a smaller max_tokens keeps about this many characters a token


class ReplayError(BrainstemError):
    """The session cannot be replayed (unknown, trimmed, recorded by an older version...)."""

    exit_code = 2


class ChangedRequest(LLMError):
    """The request is not the recorded one and no live call is allowed."""

    final = True


def normalised(request: dict) -> str:
    """What makes two requests "the same": the model and every message after the soul, clock readings out."""
    def norm(text: Any) -> str:
        text = str(text)
        for pattern, repl in _VOLATILE:
            text = pattern.sub(repl, text)
        return text

    messages = [(m.get("role"), norm(m.get("content")), *_calls_of(m)) for m in request.get("messages", [])[1:]]
    return json.dumps([request.get("model"), messages], ensure_ascii=False)


def _calls_of(message: dict) -> list:
    """An agent step's turn: the calls an assistant message made, or the call a tool message answers."""
    if message.get("role") == "tool":
        return [message.get("tool_call_id")]
    calls = message.get("tool_calls")
    if not calls:
        return []
    return [[(c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments")]
            for c in calls if isinstance(c, dict)]


# --- the recording ---

@dataclass
class Recording:
    id: str
    entries: list[dict]
    prefix: list[dict]  # up to and including the context entry: the context the session saw
    context: dict
    start: dict
    end: dict

    @property
    def rest(self) -> list[dict]:
        return self.entries[len(self.prefix):]

    def llm_calls(self) -> list[dict]:
        return [e for e in self.rest if e.get("event") == events.LLM_CALL and not e.get("failed")]

    def fetches(self) -> list[dict]:
        return [e for e in self.rest if e.get("event") == events.FETCH]


def load(store: Store, ref: str) -> Recording:
    """The recording of session ``ref`` (an id or a number), or :class:`ReplayError` saying why not."""
    sid = session_history.resolve_session(store, ref) or ref
    entries = karma_mod.read(store, sid)
    if not entries:
        if session_history.has(store, sid):
            raise ReplayError(f"session {sid}: its karma was trimmed (older than BRAINSTEM_KARMA_RETENTION_DAYS); "
                              "it cannot be replayed")
        raise ReplayError(f"no session {ref!r}: `brainstem sessions` lists the sessions that can be replayed")
    start = next((e for e in entries if e.get("event") == events.SESSION_START), None)
    end = next((e for e in reversed(entries) if e.get("event") == events.SESSION_END), None)
    if start is None:
        raise ReplayError(f"session {sid}: the start of its karma was trimmed; it cannot be replayed")
    if start.get("dry_run"):
        raise ReplayError(f"session {sid} is a dry run: its tools never ran, so there is nothing to replay them from")
    if end is None:
        raise ReplayError(f"session {sid} never finished (it is running, or it crashed); only finished sessions "
                          "can be replayed")
    if end.get("kind") == "deep_reflect":
        raise ReplayError(f"session {sid} was a deep reflection; replay runs sessions that planned")
    if end.get("kind") == "reflex":
        raise ReplayError(f"wake {sid} was handled by a reflex; it made no plan to replay")
    at = next((i for i, e in enumerate(entries) if e.get("event") == events.CONTEXT), None)
    if at is not None and entries[at].get("too_large"):
        raise ReplayError(f"session {sid}: the context it saw ({entries[at]['too_large']} characters) was too "
                          "large to record, so it cannot be replayed (lower config:defaults memory caps)")
    if at is None or not isinstance(entries[at].get("context"), dict):
        raise ReplayError(f"session {sid} was recorded by an older version of brainstem (its karma has no context "
                          f"entry); sessions recorded by {__version__} or later can be replayed")
    return Recording(id=sid, entries=entries, prefix=entries[:at + 1], context=from_record(entries[at]["context"]),
                     start=start, end=end)


# --- answers from the recording ---

class RecordedAnswers:
    """The LLM as a replay sees it (tier ``replay``): recorded answers to the same requests; else a live
    call (``live``), the recorded answer at the same place (``assume``, the gate), or :class:`ChangedRequest`."""

    tier = "replay"

    def __init__(self, recording: Recording, record, live=None, assume: bool = False):
        self.record = record
        self.live = live
        self.simulated = bool(getattr(live, "simulated", False))  # a cassette live: no answer moves money
        self.assume = assume
        self.by_request: dict[str, deque] = defaultdict(deque)
        self.by_place: dict[tuple, deque] = defaultdict(deque)
        rest = recording.rest
        for i, e in enumerate(rest):
            if e.get("event") != events.LLM_CALL or e.get("failed") or not isinstance(e.get("request"), dict):
                continue
            side, j = [], i - 1
            while j >= 0 and rest[j].get("event") in _CALL_SIDE:
                side.insert(0, rest[j])
                j -= 1
            call = {**e, "side": side}
            self.by_request[normalised(e["request"])].append(call)
            self.by_place[(e.get("purpose"), e.get("step_id"))].append(call)
        self.used: dict[str, int] = {"recorded": 0, "live": 0, "assumed": 0, "changed_request": 0}
        self.last_live = False
        # (purpose, step id) of the call being asked: the chokepoint does not pass them to a provider,
        # so the LLM's call is wrapped to set them (see _track_place).
        self.current: tuple[str | None, str | None] = (None, None)

    def _take(self, call: dict) -> None:
        place = (call.get("purpose"), call.get("step_id"))
        for q in (self.by_request[normalised(call["request"])], self.by_place[place]):
            try:
                q.remove(call)
            except ValueError:
                pass

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse:
        self.last_live = False
        queue = self.by_request.get(normalised(request))
        purpose, step_id = self.current
        call, how = (queue[0], "recorded") if queue else (None, None)
        if call is None and self.assume:
            place = self.by_place.get((purpose, step_id))
            call, how = (place[0], "assumed") if place else (None, None)
        if call is None:
            if self.live is not None:
                self.used["live"] += 1
                self.last_live = True
                return self.live.complete(request, timeout=timeout, deadline=deadline)
            self.used["changed_request"] += 1
            raise ChangedRequest(f"changed_request: the {purpose} request differs from the recorded one "
                                 "(run with --live to ask the model)")
        self._take(call)
        self.used[how] += 1
        for e in call["side"]:
            self.record(e["event"], **{k: v for k, v in e.items() if k not in ("t", "elapsed_ms", "event")})
        content, truncated = str(call.get("response") or ""), bool(call.get("truncated"))
        out_tokens = int(call.get("output_tokens") or 0)
        if out_tokens > request.get("max_tokens", out_tokens):  # the model would have been cut off here
            content, truncated = content[:request["max_tokens"] * CHARS_PER_TOKEN], True
        usage = {"prompt_tokens": call.get("input_tokens") or 0, "completion_tokens": out_tokens,
                 "reasoning_tokens": call.get("reasoning_tokens") or 0, "cost": call.get("cost") or 0.0}
        calls = parse_tool_calls(call.get("tool_calls")) if request.get("tools") else []
        return LLMResponse(content=content, usage=usage, finish_reason="length" if truncated else call.get(
            "finish_reason"), truncated=truncated, model=request["model"], raw={}, tool_calls=calls)


class RecordedFetches:
    """Each fetch a replayed tool makes, answered with what the original session received for the same
    tool, method and URL (query strings are not recorded: same path, in order)."""

    def __init__(self, recording: Recording):
        self.queues: dict[tuple, deque] = defaultdict(deque)
        for e in recording.fetches():
            self.queues[self._key(e.get("tool"), e.get("method"), e.get("scheme"), e.get("host"), e.get("port"),
                                  e.get("path"))].append(e)

    @staticmethod
    def _key(tool, method, scheme, host, port, path) -> tuple:
        return (tool, str(method).upper(), scheme, (host or "").lower(), port, path or "/")

    def answer(self, tool: str, method: str, url: str) -> dict:
        from brainstem.sandbox.egress import FetchError

        try:
            parts = urlsplit(url)
            port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
            key = self._key(tool, method, parts.scheme, parts.hostname, port, parts.path)
        except ValueError:
            raise FetchError(f"replay: {url[:100]!r} is not a URL the original session fetched") from None
        queue = self.queues.get(key)
        if not queue:
            raise FetchError(f"replay: the original session made no such fetch ({method} {parts.scheme}://"
                             f"{parts.hostname}{parts.path}); a replay never reaches the world")
        e = queue.popleft()
        if e.get("error") and not isinstance(e.get("response"), dict):
            raise FetchError(str(e["error"]))
        resp = e.get("response") if isinstance(e.get("response"), dict) else {}
        text = resp.get("text") or ""
        cut = resp.get("truncated") or bool(resp.get("text_cut_at"))
        parsed = None
        if not cut and text.strip():
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
        return {"status": resp.get("status", e.get("status")), "headers": resp.get("headers") or {}, "text": text,
                "json": parsed, "url": url, "truncated": bool(cut)}


# --- running it ---

@dataclass
class Replayed:
    recording: Recording
    entries: list[dict]  # the replay's own, after the copied context
    outcome: str
    cost: float
    answers: dict[str, int]
    karma_id: str | None = None  # where a live replay's karma was kept
    problems: list[str] = field(default_factory=list)


def rerun(settings, store: Store, recording: Recording, *, live: bool = False, assume: bool = False,
        staged: dict[str, Any] | None = None, max_seconds: float | None = None, cassette=None) -> Replayed:
    """Run ``recording`` again in an overlay of ``store``, with ``staged`` keys put there first;
    ``max_seconds`` caps its time budget (the gate runs inside a session's own). ``cassette`` (a
    provider) answers in place of the live model: simulated, so today's spend and ceiling are untouched."""
    paid = live and cassette is None  # only the real model's answers are money
    kept = {keys.DAILY_COST, keys.COST_ANOMALIES} if paid else set()
    overlay = OverlayStore(store, passthrough=kept.__contains__)
    for key, value in (staged or {}).items():
        overlay.put(key, value)
    sid = recording.id
    overlay.fresh_log(keys.karma(sid))
    karma = Karma(overlay, sid, Redactor(settings.known_secrets()))
    for e in recording.prefix:  # the context the session saw, as it saw it
        overlay.append(keys.karma(sid), karma_mod.encode_entry(e))
    soul, orient_template = check_ready(overlay, settings, need_key=paid)
    problems: list[str] = []
    defaults, models = load_defaults(overlay, problems), effective_models(overlay, problems)
    left_today = finite_or(recording.start.get("daily_budget_left"), settings.max_daily_cost)
    if paid:
        left_today = min(left_today, max(0.0, settings.max_daily_cost - daily_spent(store)))
    budget = make_budget(defaults, settings, left_today)
    if max_seconds is not None:
        budget.max_duration = min(budget.max_duration, max(0.0, max_seconds))
    context = dict(recording.context)
    effort = context.get("effort") if isinstance(context.get("effort"), str) else "low"
    number = int(finite_or(recording.start.get("number"), 0))
    answers = RecordedAnswers(recording, karma.record, assume=assume,
                              live=(cassette or hardcoded_provider(settings)) if live else None)
    if paid:  # real money is held against today's ceiling and booked; recorded answers cost nothing today
        budget.daily = DailyLedger(store, settings.max_daily_cost, billable=lambda: answers.last_live)
    session = build_session(settings, overlay, sid=sid, number=number, karma=karma, budget=budget,
                            defaults=defaults, models=models, soul=soul, context=context, mode="replay",
                            effort=effort, providers=[answers])
    session.tool_policy = ToolPolicy.from_settings(settings, fetch_replay=RecordedFetches(recording),
                                                   on_secrets=session.learn_secrets)
    _track_place(session.llm, answers)
    course = Course(store=overlay, settings=settings, karma=karma, id=sid, number=session.number,
                    budget=budget, defaults=defaults, mode="replay")
    course.session = session
    try:
        plan_and_execute(course, session, orient_template, left_today)
    except Exception as exc:  # the one try/except of a replay, as of a session: an outcome, never a traceback
        course.outcome = outcomes.ERROR
        karma.record(events.FATAL_ERROR, error=f"{type(exc).__name__}: {exc}"[:1000])
    entries = karma_mod.read(overlay, sid)[len(recording.prefix):]
    karma_id = None
    if answers.used["live"]:  # real calls were made: their record is kept, under an id of its own
        karma_id = f"replay-{uuid.uuid4().hex[:8]}"
        for e in karma_mod.read(overlay, sid):
            store.append(keys.karma(karma_id), karma_mod.encode_entry({**e, "replay_of": sid}))
        session_history.note_unlisted(store, karma_id, settings.karma_retention_days)
    return Replayed(recording=recording, entries=entries, outcome=course.outcome, cost=round(budget.spent, 10),
                    answers=dict(answers.used), karma_id=karma_id, problems=problems)


def _track_place(llm, answers: RecordedAnswers) -> None:
    """Tell the answers which call (purpose, step) is being asked, so the gate can find its recorded twin."""
    inner = llm.call

    def call(**kwargs):
        answers.current = (kwargs.get("purpose"), kwargs.get("step_id"))
        return inner(**kwargs)
    llm.call = call


# --- comparing ---

def behaviour(entries: list[dict], outcome: str | None, cost: Any) -> dict:
    """What a session did, without the clock: plan, step outcomes, store writes, cost, reflection."""
    from brainstem.core.plan import PlanError, parse_plan

    plan: Any = None
    orient_answer = None
    steps: dict[str, dict] = {}
    writes: list[list] = []
    reflection: Any = None
    for e in entries:
        ev = e.get("event")
        if ev == events.LLM_CALL and e.get("purpose") == "orient":
            orient_answer = e
        elif ev == events.PLAN and orient_answer is not None:
            try:
                plan = parse_plan(str(orient_answer.get("response") or ""), bool(orient_answer.get("truncated")))
                plan = plan.model_dump(exclude_none=True)
            except PlanError as exc:
                plan = {"unparsable": str(exc)}
        elif ev == events.ORIENT_PARSE_ERROR and plan is None:
            error = str(e.get("error") or "")
            plan = "changed_request" if "changed_request" in error else None
        elif ev == events.STEP_START:
            steps[e.get("step_id")] = {"type": e.get("type"), "status": "started"}
        elif ev == events.STEP_COMPLETE:
            steps.setdefault(e.get("step_id"), {"type": e.get("type")}).update(status="ok", result=e.get("result"))
        elif ev == events.STEP_FAILED:
            error = str(e.get("error") or "")
            status = "changed_request" if "changed_request" in error else "failed"
            steps.setdefault(e.get("step_id"), {"type": e.get("type")}).update(status=status, result=error[:300])
        elif ev == events.STEP_SKIPPED:
            steps[e.get("step_id")] = {"type": e.get("type"), "status": "skipped", "result": e.get("reason")}
        elif ev == events.TOOL_WOULD_DO:
            steps.setdefault(e.get("step_id"), {"type": "action"})["not_run"] = e.get("reason")
        elif ev == events.KV_WRITE:
            writes.append([e.get("op"), e.get("key"), e.get("source"), e.get("bytes")])
        elif ev == events.REFLECT:
            reflection = {"summary": e.get("summary"), "load_keys": e.get("load_keys")}
        elif ev == events.REFLECT_CALL_FAILED and reflection is None:
            reflection = "changed_request" if "changed_request" in str(e.get("error")) else "call_failed"
        elif ev == events.REFLECT_PARSE_ERROR and reflection is None:
            reflection = "unparsable"
    if plan is None and orient_answer is None and outcome == outcomes.NO_PLAN:
        plan = "none"
    return {"plan": plan, "steps": [{"id": k, **v} for k, v in steps.items()], "writes": writes,
            "cost": round(finite_or(cost, 0.0), 6), "reflection": reflection, "outcome": outcome}


def compare(replayed: Replayed) -> dict:
    """Old beside new, and whether anything that counts as behaviour differs."""
    rec = replayed.recording
    old = behaviour(rec.rest, rec.end.get("outcome"), rec.end.get("cost"))
    new = behaviour(replayed.entries, replayed.outcome, replayed.cost)
    old_steps = {s["id"]: s for s in old["steps"]}
    new_steps = {s["id"]: s for s in new["steps"]}
    step_rows = []
    for sid in list(old_steps) + [s for s in new_steps if s not in old_steps]:
        before, now = old_steps.get(sid), new_steps.get(sid)
        step_rows.append({"id": sid, "before": before, "now": now, "same": before == now})
    parts = {
        "plan": {"before": old["plan"], "now": new["plan"], "same": old["plan"] == new["plan"]},
        "cost": {"before": old["cost"], "now": new["cost"], "same": old["cost"] == new["cost"]},
        "writes": {"before": old["writes"], "now": new["writes"], "same": old["writes"] == new["writes"]},
        "reflection": {"before": old["reflection"], "now": new["reflection"],
                       "same": old["reflection"] == new["reflection"]},
        "outcome": {"before": old["outcome"], "now": new["outcome"], "same": old["outcome"] == new["outcome"]},
    }
    differs = [k for k, v in parts.items() if not v["same"]]
    changed_steps = [r["id"] for r in step_rows if not r["same"]]
    if changed_steps:
        differs.insert(1, "steps")
    return {"session": rec.id, "same": not differs, "differs": differs, "answers": replayed.answers,
            **parts, "steps": step_rows, "karma": replayed.karma_id}


# --- printing ---

def shorten(value: Any, width: int = 60) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _plan_line(plan: Any) -> str:
    if isinstance(plan, dict) and isinstance(plan.get("steps"), list):
        names = [f"{s.get('id') or '?'} {s.get('type')}" + (f" {s['tool']}" if s.get("tool") else "")
                 for s in plan["steps"] if isinstance(s, dict)]
        return f"{len(names)} steps: " + ", ".join(names)
    return shorten(plan)


def _step_text(step: dict | None) -> str:
    if step is None:
        return "(not run)"
    status = step.get("status", "?")
    if step.get("not_run"):
        status += f" (not run: {step['not_run']})"
    return f"{status}: {shorten(step.get('result'), 40)}" if step.get("result") is not None else status


def render(report: dict) -> list[str]:
    """The report as aligned lines for a terminal: before on the left, now on the right."""
    a = report["answers"]
    lines = [f"replay of session {report['session']} against today's prompts, config, tools and code",
             f"LLM answers: {a['recorded']} recorded, {a['live']} live, {a['changed_request']} changed request"
             + (f", {a['assumed']} assumed" if a.get("assumed") else "")]
    rows = [["", "BEFORE", "NOW", ""]]

    def mark(same: bool) -> str:
        return "" if same else "DIFFERS"

    p = report["plan"]
    rows.append(["plan", _plan_line(p["before"]), "same" if p["same"] else _plan_line(p["now"]), mark(p["same"])])
    for r in report["steps"]:
        kind = (r["before"] or r["now"] or {}).get("type") or "?"
        rows.append([f"  {r['id']} {kind}", _step_text(r["before"]), "same" if r["same"] else _step_text(r["now"]),
                     mark(r["same"])])
    for name in ("writes", "cost", "reflection", "outcome"):
        part = report[name]
        if name == "writes":
            before, now = (f"{len(part['before'])}: " + shorten([w[1] for w in part["before"]], 40),
                           f"{len(part['now'])}: " + shorten([w[1] for w in part["now"]], 40))
        elif name == "cost":
            before, now = f"${part['before']:.6f}", f"${part['now']:.6f}"
        else:
            before, now = shorten(part["before"], 40), shorten(part["now"], 40)
        rows.append([name, before, "same" if part["same"] else now, mark(part["same"])])
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines.append("")
    lines += [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows]
    lines.append("")
    if report["same"]:
        lines.append("result: same behaviour")
    else:
        lines.append("result: DIFFERS in " + ", ".join(report["differs"]))
    if report.get("karma"):
        lines.append(f"live calls were made: their karma is kept as {report['karma']} (brainstem karma "
                     f"{report['karma']})")
    return lines
