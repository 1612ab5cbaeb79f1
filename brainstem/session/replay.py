"""Replay: a recorded session, run again against today's prompts, config, tools and code.

Karma is the test set. A session's karma holds what replay needs: everything
up to its ``context`` entry is the context the session saw (ground truth,
effort, crash data, the loaded keys, the last reflection), each ``llm_call``
holds its request and answer, and each ``fetch`` its response (capped). Replay
copies that prefix, then runs what the session ran after it (orient, the plan
and reflection, or deep reflection) again on the recorded context: the
operator's messages it was shown, the time, balances, crash data and what
deep reflection was shown of memory all come from the recording, so only a
change of the agent (prompts, config, tools, code) can change a request:

* in a throwaway overlay of the store (:mod:`brainstem.store.overlay`): no key,
  schedule, session history or daily spend changes;
* LLM answers come from the recording wherever the request is the same (the
  same model and messages; clock times and durations in them are ignored),
  and so do failures: a call no provider answered (its ``llm_failed`` entry)
  fails again with the same error, fault and status, and nothing is asked.
  Otherwise ``live`` asks the model (priced, budgeted, counted towards today's
  spend, and its karma kept as ``replay-…``), or the call is a
  ``changed_request``;
* tools run in the sandbox against the overlay, which holds each key the
  original session's tools read as they read it (its ``tool_reads`` entry;
  the keys that define the agent excepted: those are today's); their fetches
  are answered with what the original session received, and a fetch it never
  made fails;
* the replay gate's verdicts on a change a reflection proposed are the ones the
  original session got (:class:`RecordedGate`): a replay judges nothing again.

:mod:`brainstem.session.replay_report` sets old beside new (plan, step
outcomes and results, store writes, cost, reflection) and shows how each
changed request differs.

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
from brainstem.llm.cache import plain_content
from brainstem.llm.chokepoint import LLMError
from brainstem.llm.messages import parse_tool_calls
from brainstem.llm.openrouter import LLMResponse
from brainstem.sandbox.egress import FetchError
from brainstem.session.build import (
    SessionDeps,
    SessionSpec,
    build_session,
    check_ready,
    hardcoded_provider,
    learner,
    make_budget,
)
from brainstem.session.cycle import work
from brainstem.session.replay_mcp import RecordedMCP
from brainstem.session.state import SessionState
from brainstem.state import history as session_history
from brainstem.state.budget import DailyLedger, daily_spent
from brainstem.state.config import effective_models, load_defaults
from brainstem.store import karma as karma_mod
from brainstem.store.base import Store
from brainstem.store.karma import Karma, Redactor
from brainstem.store.overlay import OverlayStore
from brainstem.tools.operator_chat import NotSent
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


def volatile_out(text: Any) -> str:
    """``text`` with its clock readings (times, durations) and the answering tier replaced by placeholders."""
    text = str(text)
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text


def normalised(request: dict) -> str:
    """What makes two requests "the same": the model and every message after the soul, clock readings out
    (and cache markers: they change what a call costs, never what it asks)."""
    messages = [(m.get("role"), volatile_out(plain_content(m.get("content"))), *_calls_of(m))
                for m in request.get("messages", [])[1:]]
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
    inbox_ids: list = field(default_factory=list)  # the operator's messages its orient was shown

    @property
    def tool_reads(self) -> dict[str, Any]:
        """Each key the session's tools read, as first read (None: absent); empty when not recorded."""
        e = next((e for e in reversed(self.rest) if e.get("event") == events.TOOL_READS), None)
        values = e.get("values") if e else None
        return values if isinstance(values, dict) else {}

    @property
    def deep(self) -> tuple[bool, str]:
        """(whether it was a deep reflection, why it was due), as the session recorded them."""
        start = next((e for e in self.rest if e.get("event") == events.DEEP_REFLECT and e.get("phase") == "start"),
                     None)
        due = self.context.get("deepReflectDue") is True and start is not None
        return due, str(start.get("reason") or "") if start else ""

    @property
    def rest(self) -> list[dict]:
        return self.entries[len(self.prefix):]

    def llm_calls(self) -> list[dict]:
        return [e for e in self.rest if e.get("event") == events.LLM_CALL and not e.get("failed")]

    def fetches(self) -> list[dict]:
        return [e for e in self.rest if e.get("event") == events.FETCH]

    def telegram_sends(self) -> list[dict]:
        return [e for e in self.rest if e.get("event") == events.TELEGRAM_SENT]


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
    if end is None:
        raise ReplayError(f"session {sid} never finished (it is running, or it crashed); only finished sessions "
                          "can be replayed")
    if end.get("detected_by"):  # closed by the wake that found it dead, not by itself
        raise ReplayError(f"session {sid} never finished (it ended {end.get('outcome')}, as session "
                          f"{end['detected_by']} found); only finished sessions can be replayed")
    if end.get("kind") == "reflex":
        raise ReplayError(f"wake {sid} was handled by a reflex; it made no plan to replay")
    at = next((i for i, e in enumerate(entries) if e.get("event") == events.CONTEXT), None)
    if at is not None and entries[at].get("too_large"):
        raise ReplayError(f"session {sid}: the context it saw ({entries[at]['too_large']} characters) was too "
                          "large to record, so it cannot be replayed (lower config:defaults memory caps)")
    if at is None or not isinstance(entries[at].get("context"), dict):
        raise ReplayError(f"session {sid} was recorded by an older version of brainstem (its karma has no context "
                          f"entry); sessions recorded by {__version__} or later can be replayed")
    ids = entries[at].get("inbox_ids")
    if not isinstance(ids, list):  # recorded before the context entry named them: as orient noted them
        ids = next((e.get("ids") for e in entries[at:] if e.get("event") == events.INBOX_SHOWN), None) or []
    return Recording(id=sid, entries=entries, prefix=entries[:at + 1], context=from_record(entries[at]["context"]),
                     start=start, end=end, inbox_ids=[i for i in ids if isinstance(i, int)])


def sessions_since(store: Store, ref: str) -> list[str]:
    """The ids of the sessions in the history from session ``ref`` (a number, or an id: its number) on,
    oldest first; empty when ``ref`` names none."""
    if ref.isdigit():
        start = int(ref)
    else:
        sid = session_history.resolve_session(store, ref)
        head = sid.split("-", 1)[0] if sid else ""
        if not head.isdigit():
            return []
        start = int(head)
    out: list[str] = []
    for h in session_history.read(store):
        found = h.get("id")
        if not isinstance(found, str) or found in out:
            continue
        head = found.split("-", 1)[0]
        number = h.get("number") if isinstance(h.get("number"), int) else int(head) if head.isdigit() else None
        if number is not None and number >= start:
            out.append(found)
    return out


# --- answers from the recording ---

class RecordedAnswers:
    """The LLM as a replay sees it (tier ``replay``): recorded answers to the same requests (a call no
    provider answered then fails now as it did, with its error, fault and status); else a live call
    (``live``), the recorded answer at the same place (``assume``, the gate), or :class:`ChangedRequest`."""

    tier = "replay"

    def __init__(self, recording: Recording, record, live=None, assume: bool = False, as_recorded=None):
        self.record = record
        # A request is compared as karma recorded its twin (a long prompt capped, secrets redacted).
        self.as_recorded = as_recorded or (lambda value: value)
        self.live = live
        self.simulated = bool(getattr(live, "simulated", False))  # a cassette live: no answer moves money
        self.assume = assume
        self.by_request: dict[str, deque] = defaultdict(deque)
        self.by_place: dict[tuple, deque] = defaultdict(deque)
        rest = recording.rest
        for i, e in enumerate(rest):
            answered = e.get("event") == events.LLM_CALL and not e.get("failed")
            if not (answered or e.get("event") == events.LLM_FAILED) or not isinstance(e.get("request"), dict):
                continue
            side: list[dict] = []
            j = i - 1
            while j >= 0 and rest[j].get("event") in _CALL_SIDE:
                side.insert(0, rest[j])
                j -= 1
            call = {**e, "side": side}
            self.by_request[normalised(e["request"])].append(call)
            self.by_place[(e.get("purpose"), e.get("step_id"))].append(call)
        self.used: dict[str, int] = {"recorded": 0, "live": 0, "assumed": 0, "changed_request": 0}
        self.last_live = False
        self.changed: list[dict] = []  # each request that was not the recorded one, beside its recorded twin
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
        queue = self.by_request.get(normalised(self.as_recorded(request)))
        purpose, step_id = self.current
        found = (queue[0], "recorded") if queue else None
        if found is None and self.assume:
            place = self.by_place.get((purpose, step_id))
            found = (place[0], "assumed") if place else None
        if found is None:
            self._note_changed(request)
            if self.live is not None:
                self.used["live"] += 1
                self.last_live = True
                return self.live.complete(request, timeout=timeout, deadline=deadline)
            self.used["changed_request"] += 1
            raise ChangedRequest(f"changed_request: the {purpose} request differs from the recorded one "
                                 "(run with --live to ask the model)")
        call, how = found
        self._take(call)
        self.used[how] += 1
        skip = getattr(self.live, "skip", None)
        if skip is not None:  # a cassette plays the whole session: this call's answer is passed over
            skip()
        for e in call["side"]:
            self.record(e["event"], **{k: v for k, v in e.items() if k not in ("t", "elapsed_ms", "event")})
        if call.get("event") == events.LLM_FAILED:  # no provider answered it then: nor now, in the same words
            self.record(events.LLM_FAILED, **{k: v for k, v in call.items() if k not in ("t", "elapsed_ms", "event",
                                                                                          "side")})
            fault = call.get("fault")
            raise LLMError(str(call.get("error") or "every provider failed"),
                           fault=fault if fault in outcomes.PROVIDER_FAULTS.values() else None,
                           status=call.get("status") if isinstance(call.get("status"), int) else None)
        content, truncated = str(call.get("response") or ""), bool(call.get("truncated"))
        out_tokens = int(call.get("output_tokens") or 0)
        if out_tokens > request.get("max_tokens", out_tokens):  # the model would have been cut off here
            content, truncated = content[:request["max_tokens"] * CHARS_PER_TOKEN], True
        usage = {"prompt_tokens": call.get("input_tokens") or 0, "completion_tokens": out_tokens,
                 "reasoning_tokens": call.get("reasoning_tokens") or 0, "cost": call.get("cost") or 0.0,
                 "cached_tokens": call.get("cached_tokens") or 0,
                 "cache_write_tokens": call.get("cache_write_tokens") or 0}
        calls = parse_tool_calls(call.get("tool_calls")) if request.get("tools") else []
        return LLMResponse(content=content, usage=usage, finish_reason="length" if truncated else call.get(
            "finish_reason"), truncated=truncated, model=request["model"], raw={}, tool_calls=calls)


    def _note_changed(self, request: dict) -> None:
        """Keep the request (as karma would record it: no soul, secrets redacted) beside the recorded one
        at the same place, for the report's diff."""
        purpose, step_id = self.current
        place = self.by_place.get((purpose, step_id))
        twin = place[0]["request"] if place else None
        now = {"model": request.get("model"), "messages": self.as_recorded(request.get("messages", [])[1:])}
        before = {"model": twin.get("model"), "messages": twin.get("messages", [])[1:]} if twin else None
        self.changed.append({"purpose": purpose, "step_id": step_id, "before": before, "now": now})


class RecordedGate:
    """The replay gate as a replay sees it: the verdicts the original session got on the changes its
    reflections proposed, in order. A replay judges no change again (that would replay other sessions
    inside this one); a change the original session never had judged is refused, as a gate that could
    not judge it refuses."""

    def __init__(self, recording: Recording):
        self.verdicts = deque(e for e in recording.rest if e.get("event") == events.REPLAY_GATE)

    def __call__(self, settings, store, staged: dict[str, Any], sessions: int, exclude=None, time_left=None) -> dict:
        report: dict[str, Any] = {"keys": sorted(staged), "replayed": [], "skipped": 0, "refused": None}
        if not self.verdicts:
            return {**report, "refused": "replay: the original session had no such change judged"}
        e = self.verdicts.popleft()
        return {**report, "replayed": e.get("replayed") or [], "skipped": e.get("skipped") or 0,
                "refused": e.get("refused")}


class RecordedFetches:
    """Each fetch a replayed tool makes, answered with what the original session received for the same
    tool, method and URL (query strings are not recorded: same path, in order); each Telegram send, with
    the message id the original send of that tool got."""

    def __init__(self, recording: Recording):
        self.queues: dict[tuple, deque] = defaultdict(deque)
        for e in recording.fetches():
            self.queues[self._key(e.get("tool"), e.get("method"), e.get("scheme"), e.get("host"), e.get("port"),
                                  e.get("path"))].append(e)
        self.sends: dict[Any, deque] = defaultdict(deque)
        for e in recording.telegram_sends():
            self.sends[e.get("tool")].append(e)

    def sent(self, tool: str) -> bool:
        """Whether the original session's sends of ``tool`` are not all answered yet."""
        return bool(self.sends.get(tool))

    def telegram(self, tool: str) -> Any:
        """The message id the original session's send of ``tool`` got (in order); never Telegram's."""
        queue = self.sends.get(tool)
        if not queue:
            raise NotSent("telegram: replay: the original session sent no such message; a replay never reaches "
                          "the world")
        e = queue.popleft()
        if e.get("error"):
            raise NotSent(str(e["error"]))  # what the original code was told
        return e.get("message_id")

    @staticmethod
    def _key(tool, method, scheme, host, port, path) -> tuple:
        return (tool, str(method).upper(), scheme, (host or "").lower(), port, path or "/")

    def answer(self, tool: str, method: str, url: str) -> dict:
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
    changed: list[dict] = field(default_factory=list)  # the requests that differ, beside their recorded twins


def rerun(settings, store: Store, recording: Recording, *, live: bool = False, assume: bool = False,
        staged: dict[str, Any] | None = None, max_seconds: float | None = None, cassette=None) -> Replayed:
    """Run ``recording`` again in an overlay of ``store``, with ``staged`` keys put there first;
    ``max_seconds`` caps its time budget (the gate runs inside a session's own). ``cassette`` (a
    provider) answers in place of the live model: simulated, so today's spend and ceiling are untouched."""
    paid = live and cassette is None  # only the real model's answers are money
    kept = {keys.DAILY_COST, keys.SPEND_DAYS, keys.COST_ANOMALIES} if paid else set()
    overlay = OverlayStore(store, passthrough=kept.__contains__)
    for key, value in (staged or {}).items():
        overlay.put(key, value)
    sid = recording.id
    overlay.fresh_log(keys.karma(sid))
    karma = Karma(overlay, sid, Redactor(settings.known_secrets()))
    for e in recording.prefix:  # the context the session saw, as it saw it
        overlay.append(keys.karma(sid), karma_mod.encode_entry(e))
    for key, value in recording.tool_reads.items():  # the store its tools read, as they read it
        if isinstance(key, str) and not keys.defines_agent(key) and not keys.is_runtime_owned(key):
            if isinstance(value, str):
                overlay.put(key, value)
            else:
                overlay.delete(key)
    soul, orient_template = check_ready(overlay, settings, need_key=paid)
    problems: list[str] = []
    defaults, models = load_defaults(overlay, problems), effective_models(overlay, problems)
    left_today = finite_or(recording.start.get("daily_budget_left"), settings.max_daily_cost)
    if paid:
        left_today = min(left_today, max(0.0, settings.max_daily_cost - daily_spent(store)))
    budget = make_budget(defaults, settings, left_today)
    if max_seconds is not None:
        budget.max_duration = min(budget.max_duration, max(0.0, max_seconds))
    effort = recording.context.get("effort")
    state = SessionState(context=dict(recording.context), effort=effort if isinstance(effort, str) else "low",
                         inbox_ids=list(recording.inbox_ids))
    number = int(finite_or(recording.start.get("number"), 0))
    answers = RecordedAnswers(recording, karma.record, assume=assume, as_recorded=karma.as_recorded,
                              live=(cassette or hardcoded_provider(settings)) if live else None)
    if paid:  # real money is held against today's ceiling and booked; recorded answers cost nothing today
        budget.daily = DailyLedger(store, settings.max_daily_cost, billable=lambda: answers.last_live)
    deps = SessionDeps(id=sid, number=number, settings=settings, store=overlay, karma=karma, budget=budget,
                       defaults=defaults, models=models, soul=soul,
                       mode="dry_run" if recording.start.get("dry_run") else "replay",  # a dry run's tools: not run
                       check_change=RecordedGate(recording))
    policy = ToolPolicy.from_settings(settings, fetch_replay=RecordedFetches(recording), on_secrets=learner(karma),
                                      mcp_replay=RecordedMCP(recording))
    session = build_session(deps, state, SessionSpec(providers=[answers], policy=policy))
    _track_place(session.llm, answers)
    try:
        work(session, orient_template, left_today, recording.deep)
    except Exception as exc:  # the one try/except of a replay, as of a session: an outcome, never a traceback
        state.outcome = outcomes.ERROR
        karma.record(events.FATAL_ERROR, error=f"{type(exc).__name__}: {exc}"[:1000])
    entries = karma_mod.read(overlay, sid)[len(recording.prefix):]
    karma_id = None
    if answers.used["live"]:  # real calls were made: their record is kept, under an id of its own
        karma_id = f"replay-{uuid.uuid4().hex[:8]}"
        for e in karma_mod.read(overlay, sid):
            store.append(keys.karma(karma_id), karma_mod.encode_entry({**e, "replay_of": sid}))
        session_history.note_unlisted(store, karma_id, settings.karma_retention_days)
    return Replayed(recording=recording, entries=entries, outcome=state.outcome, cost=round(budget.spent, 10),
                    answers=dict(answers.used), karma_id=karma_id, problems=problems, changed=answers.changed)


def _track_place(llm, answers: RecordedAnswers) -> None:
    """Tell the answers which call (purpose, step) is being asked, so the gate can find its recorded twin."""
    inner = llm.call

    def call(**kwargs):
        answers.current = (kwargs.get("purpose"), kwargs.get("step_id"))
        return inner(**kwargs)
    llm.call = call
