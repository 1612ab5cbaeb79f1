"""Reflection at the end of every session, and deep reflection every so often.

Reflection writes short-term memory (``last_reflect``) and may ask for keys to
load next time, a wake time and KV operations. Deep reflection rewrites
long-term memory (``wisdom``), config, model details and the orient prompt.
Everything they ask to write goes through the guarded view; anything invalid
is rejected and recorded while the rest still applies. A reflection that did
not happen (its call refused by a limit, failed at the provider, or answered
with something unusable) keeps the previous memory and is noted on the
session's state (``missed``) for the session's outcome to say so; a deep
reflection that did not happen leaves its schedule as it was, so it stays due.

What their prompts show is marked by where it came from
(:mod:`brainstem.core.untrusted`): karma (tool logs, results, errors, fetched
text), step results, the plan, the last reflection, notes, wisdom and session
summaries (the agent's own words, which may quote tool output) are rendered
in trust boundaries; costs, balances, the current config and the orient
prompt under review are the runtime's and the agent's configuration, shown
as they are.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brainstem.core import events, keys
from brainstem.core.clock import now_iso
from brainstem.core.errors import KVWriteRefused, NotText
from brainstem.core.json_numbers import finite_or
from brainstem.core.plan import PlanError, parse_object
from brainstem.core.templates import render
from brainstem.core.timeline import format_entry
from brainstem.core.untrusted import Untrusted, untrusted
from brainstem.llm.cache import Reuse
from brainstem.llm.chokepoint import LLMError
from brainstem.session import deep_schedule
from brainstem.session.prompt_cache import next_session, reflect_kind, render_parts
from brainstem.session.state import Missed
from brainstem.session.stopping import SessionStopped
from brainstem.state import history as session_history
from brainstem.state.budget import BudgetExceeded
from brainstem.state.config import Defaults, Models
from brainstem.state.guarded import check_value
from brainstem.state.memory import notes_for_prompt, remember_note
from brainstem.state.memory import summary as memory_summary
from brainstem.state.review import tool_records
from brainstem.store.base import encode
from brainstem.store.karma import read as read_karma

KARMA_LINES_FOR_REFLECT = 150
KARMA_CHARS_FOR_REFLECT = 20_000


class ReflectOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    session_summary: str = ""
    note_to_future_self: str = ""
    next_orient_context: dict[str, Any] = Field(default_factory=dict)
    next_wake_config: dict[str, Any] | None = None
    kv_operations: list[Any] | None = None
    model_details_updates: dict[str, Any] | None = None


class DeepReflectOutput(BaseModel):
    model_config = ConfigDict(extra="allow")
    reflection: str = ""
    note_to_future_self: str = ""
    updated_wisdom: str | None = None
    kv_operations: list[Any] | None = None
    updated_defaults: dict[str, Any] | None = None
    updated_model_details: dict[str, Any] | None = None
    orient_prompt_proposals: list[dict[str, Any]] | None = None
    next_deep_reflect: dict[str, Any] | None = None
    next_wake_config: dict[str, Any] | None = None


def karma_digest(store, session_id: str, lines: int = KARMA_LINES_FOR_REFLECT,
                 chars: int = KARMA_CHARS_FOR_REFLECT) -> Untrusted:
    """The session's flight recorder as readable lines, the newest kept when it is too long.

    Marked untrusted as a whole (``.value`` is the text): tool logs, results and errors, fetched text
    and key names are in it, beside the runtime's own fields, so it is only ever shown as data.
    """
    entries = read_karma(store, session_id)
    text = "\n".join(format_entry(e) for e in entries[-lines:])
    if len(entries) > lines:
        text = f"[{len(entries) - lines} earlier entries omitted]\n" + text
    return Untrusted(text[-chars:], f"karma:{session_id}")


def _ask_json(session, purpose: str, prompt: str | list[str], cfg, reuse: Reuse | None = None
              ) -> tuple[dict | None, str | None, BaseException | None]:
    """(object, None, None), or (None, why it failed, the exception of a call that failed). Uses the
    budget's reserved slice.

    A call that could not be made (the provider failed, the budget refused) is recorded here as
    ``reflect_call_failed``, with the fault when it is the provider's; the caller then records only
    that the reflection is missing, not a parse error the model never made.
    """
    try:
        result = session.llm.call(purpose=purpose, model=cfg.model, prompt=prompt, max_tokens=cfg.max_output_tokens,
                            effort=cfg.effort, use_reserve=True, reuse=reuse)
    except (BudgetExceeded, SessionStopped, LLMError) as exc:
        fields: dict[str, Any] = {"kind": "deep"} if purpose == "deep_reflect" else {}
        if isinstance(exc, LLMError):
            fields.update(fault=exc.fault, status=exc.status)
        else:
            fields["limit"] = exc.limit
        session.record(events.REFLECT_CALL_FAILED, error=f"{purpose} call failed: {exc}", **fields)
        return None, f"{purpose} call failed: {exc}", exc
    try:
        return parse_object(result.content, result.truncated), None, None
    except PlanError as exc:
        return None, str(exc), None


def _validated(raw: dict | None, error: str | None, model: type[BaseModel], label: str):
    """(validated output, None) or (None, why not)."""
    if raw is None:
        return None, error
    try:
        return model.model_validate(raw), None
    except ValidationError as exc:
        e = exc.errors()[0]
        return None, f"{label} does not validate: {e['loc']}: {e['msg']}"


# --- reflect ---------------------------------------------------------------

def run_reflect(session, results: dict[str, Any], plan: dict | None) -> dict | None:
    """Reflect on this session; returns the ``next_wake_config`` it asked for (or None)."""
    deps = session.deps
    previous = deps.store.get_json(keys.LAST_REFLECT, default=None)
    template = deps.store.get(keys.PROMPT_REFLECT) or DEFAULT_REFLECT_PROMPT
    # results come marked from the executor (results_for_prompt); the plan and the last reflection are
    # model output that may quote what the model read.
    # The last reflection as orient saw it (the context a replay reproduces), else as stored.
    shown = (session.state.context["lastReflect"] if "lastReflect" in session.state.context
             else untrusted(previous, "memory:last_reflect"))
    variables = {"karma": karma_digest(deps.store, deps.id), "sessionCost": round(deps.budget.spent, 6),
                 "results": results, "plan": untrusted(plan, f"plan:{deps.id}"),
                 "context": {"lastReflect": shown, "balances": session.state.context.get("balances"),
                             "schedules": session.state.context.get("schedules")}}
    raw, error, failed = _ask_json(session, "reflect", render_parts(template, variables, reflect_kind),
                                   deps.defaults.reflect, next_session(session))
    out, error = _validated(raw, error, ReflectOutput, "reflection")
    if out is None:
        _missed(session, error, failed)
        kept = previous if isinstance(previous, dict) else {}
        failure = {"session_id": deps.id, "at": now_iso(ms=True), "error": error}
        kept = {**kept, ("call_error" if failed is not None else "parse_error"): failure}
        deps.store.put(keys.LAST_REFLECT, kept)
        return None
    remember_note(deps.store, out.note_to_future_self, deps.id)
    # Only the known fields are memory: unknown ones are ignored (and named in karma), not stored.
    memory = out.model_dump(include=set(ReflectOutput.model_fields) - {"kv_operations", "model_details_updates"},
                            exclude_none=True)
    memory.update({"session_id": deps.id, "written_at": now_iso(ms=True)})
    deps.store.put(keys.LAST_REFLECT, memory)
    unknown = sorted(out.model_extra or {})  # the fields ReflectOutput does not name
    session.record(events.REFLECT, summary=out.session_summary[:500],
                   load_keys=out.next_orient_context.get("load_keys"), ignored_fields=unknown or None)
    # The agent's orient prompt and config change through the replay gate, from any reflection.
    if out.kv_operations and not (_touches(out.kv_operations, GATED_KEYS)
                                  and replay_gate(session, out.kv_operations, None, None, "reflect")):
        _apply_operations(session, out.kv_operations, "reflect")
    if out.model_details_updates:
        apply_model_details(session, out.model_details_updates, "reflect")
    return out.next_wake_config


def _missed(session, error: str | None, failed: BaseException | None, **fields: Any) -> None:
    """Note a reflection that did not happen on the session's state (its outcome says so), and record a
    parse error when the model answered (a failed call is recorded as ``reflect_call_failed`` already)."""
    error = error or "no answer"
    if failed is None:
        session.record(events.REFLECT_PARSE_ERROR, error=error, **fields)
    session.state.missed = Missed(error[:300], failed)


def _apply_operations(session, ops: list, source: str) -> bool:
    """True when the batch was applied; a rejected batch (nothing written) is False."""
    try:
        session.agent_kv.apply_operations(ops, source=source)
    except KVWriteRefused:
        return False  # recorded by the guarded view; the rest of the reflection still applies
    return True


# --- deep reflect ------------------------------------------------------------

DEEP_MEMORY = ("wisdom", "notes", "toolRecords", "replayGate", "memoryStats", "sessionHistory", "recentKarma")


def deep_memory(session) -> dict[str, Any]:
    """What deep reflection is shown of the agent's memory as it stands now (wisdom, notes, past sessions,
    review verdicts, the last gate check, memory statistics): put in the session's context before the
    context is recorded, so a replay shows the model what the session saw, not what the store holds later."""
    deps = session.deps
    store = deps.store
    # Wisdom, notes and summaries are the agent's own words but may quote tool output: marked.
    return {"wisdom": untrusted(_text_or_none(store, keys.WISDOM), "memory:wisdom") or "",
            "notes": notes_for_prompt(store),
            # Each supervised tool's record (the operator's verdicts), and how the last proposed change fared.
            "toolRecords": untrusted(tool_records(store) or None, "review:tool-records"),
            "replayGate": untrusted(store.get_json(keys.REPLAY_GATE, default=None), "memory:replay-gate"),
            # key names (tools choose them) and past notes
            "memoryStats": untrusted(memory_summary(store, deps.number), "memory:statistics"),
            "sessionHistory": Untrusted(session_history.recent(store, 30), "memory:session_history"),
            "recentKarma": recent_karma(store, deps.id)}


def run_deep_reflect(session) -> dict | None:
    """Deep reflection; returns the next_wake_config it asked for. It moves the schedule forward only when
    it happened: one that did not (a limit, the provider, an unusable answer) stays due, and says why in
    ``session.state.missed``."""
    deps = session.deps
    store = deps.store
    template = store.get(keys.PROMPT_DEEP) or DEFAULT_DEEP_PROMPT
    if not all(name in session.state.context for name in DEEP_MEMORY):  # not filled in before it was recorded
        session.state.context.update(deep_memory(session))
    context = session.state.context
    # The orient prompt and the defaults are its configuration, under review: shown as they are.
    variables = {
        "wisdom": context["wisdom"],
        "recentKarma": context["recentKarma"],
        "orientPrompt": store.get(keys.PROMPT_ORIENT) or "",
        "currentDefaults": deps.defaults.model_dump(),
        "sessionHistory": context["sessionHistory"],
        "models": session.models_for_prompt(),
        "context": context,
    }
    raw, error, failed = _ask_json(session, "deep_reflect", render(template, variables), deps.defaults.deep_reflect)
    out, error = _validated(raw, error, DeepReflectOutput, "deep reflection")
    if out is None:  # not done: it stays due, after a wait that grows with each miss in a row
        _missed(session, error, failed, kind="deep")
        deep_schedule.missed(session, failed)
        return None
    deep_schedule.worked(store)
    schedule = {"last_session": deps.number, "last_at": now_iso(ms=True),
                "after_sessions": deps.defaults.deep_reflect.default_interval_sessions,
                "after_days": deps.defaults.deep_reflect.default_interval_days}
    remember_note(store, out.note_to_future_self, deps.id)
    applied = []
    if out.updated_wisdom is not None:
        if _put(session, keys.WISDOM, out.updated_wisdom):
            applied.append("wisdom")
    merged = merged_defaults(session, out.updated_defaults) if out.updated_defaults else None
    proposed = next((p["proposed_text"] for p in out.orient_prompt_proposals or [] if isinstance(p, dict)
                     and isinstance(p.get("proposed_text"), str) and p["proposed_text"].strip()), None)
    both = [k for k, v in ((keys.CONFIG_DEFAULTS, merged), (keys.PROMPT_ORIENT, proposed))
            if v is not None and _touches(out.kv_operations, (k,))]
    refused: str | None
    if both:  # two values for one gated key: the gate could replay one and the store be left with the other
        refused = f"replay_gate: {', '.join(both)} written twice (kv_operations and a proposal); nothing applied"
        session.record(events.KV_OPERATIONS_REJECTED, source="deep_reflect", reason=refused)
    else:
        refused = replay_gate(session, out.kv_operations, merged, proposed)
    if out.kv_operations and not (refused and _touches(out.kv_operations, GATED_KEYS)):
        if _apply_operations(session, out.kv_operations, "deep_reflect"):
            applied.append("kv_operations")
    if merged is not None and not refused:
        if _put(session, keys.CONFIG_DEFAULTS, merged):
            applied.append("defaults")
    if out.updated_model_details:
        if apply_model_details(session, out.updated_model_details, "deep_reflect"):
            applied.append("model_details")
    if proposed is not None and not refused:
        if _put(session, keys.PROMPT_ORIENT, proposed):
            applied.append("orient_prompt")
    nxt = out.next_deep_reflect or {}
    bounds = deps.settings
    schedule["after_sessions"] = int(min(max(finite_or(nxt.get("after_sessions"), schedule["after_sessions"]), 1),
                                         bounds.deep_reflect_max_sessions))
    schedule["after_days"] = min(bounds.deep_reflect_max_days,
                                 max(0.01, finite_or(nxt.get("after_days"), schedule["after_days"])))
    store.put(keys.DEEP_REFLECT_SCHEDULE, schedule)
    memory = {"reflection": out.reflection[:4000], "note_to_future_self": out.note_to_future_self,
              "session_id": deps.id, "written_at": now_iso(ms=True), "kind": "deep"}
    previous = store.get_json(keys.LAST_REFLECT, default={})
    if isinstance(previous, dict) and previous.get("next_orient_context"):
        memory["next_orient_context"] = previous["next_orient_context"]
    store.put(keys.LAST_REFLECT, memory)
    session.record(events.DEEP_REFLECT, applied=applied, next_deep_reflect=schedule)
    return out.next_wake_config


def _put(session, key: str, value: Any) -> bool:
    try:
        session.agent_kv.put(key, value, source="deep_reflect")
        return True
    except KVWriteRefused:
        return False


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def merged_defaults(session, update: dict) -> dict | None:
    """config:defaults with ``update`` deep-merged in, validated; None (recorded) when the result is invalid."""
    current = session.deps.store.get_json(keys.CONFIG_DEFAULTS, default=None)
    if not isinstance(current, dict):
        current = session.deps.defaults.model_dump()
    merged = deep_merge(current, update)
    try:
        Defaults.model_validate(merged)
    except ValidationError as exc:
        e = exc.errors()[0]
        session.record(events.CONFIG_REJECTED, key=keys.CONFIG_DEFAULTS, update=update,
                 reason=f"{'.'.join(map(str, e['loc']))}: {e['msg']}")
        return None
    return merged


def apply_defaults_update(session, update: dict) -> bool:
    """Deep-merge into config:defaults and validate; an invalid result is rejected whole and recorded."""
    merged = merged_defaults(session, update)
    return merged is not None and _put(session, keys.CONFIG_DEFAULTS, merged)


# --- the replay gate ---------------------------------------------------------

GATED_KEYS = (keys.PROMPT_ORIENT, keys.CONFIG_DEFAULTS)


def _touches(ops: Any, names: tuple[str, ...]) -> bool:
    return isinstance(ops, list) and any(isinstance(op, dict) and (op.get("key") in names or op.get("value") in names)
                                         for op in ops)


def replay_gate(session, kv_operations: Any, merged: dict | None, proposed: str | None,
                source: str = "deep_reflect") -> str | None:
    """Replay recent clean sessions against the orient prompt and config a reflection proposes (its own
    fields, or ``kv_operations`` putting or renaming into those keys), before any of it applies. Returns
    why the change is refused, or None.

    The policy: the last ``deep_reflect.replay_gate_sessions`` clean sessions are replayed with recorded
    answers only (where the change alters a request, the model is assumed to answer as it did). A change
    under which a session that planned before no longer gets a usable plan (its orient model unknown,
    the plan cut off by a smaller ``max_output_tokens``, no money left to plan with), or that ends a
    session in error, is refused whole; so is a config that lowers ``replay_gate_sessions`` (the agent
    may not switch its own check off; the operator may, with ``brainstem kv put``). The gate fails
    closed: a change it could not replay (less than ``GATE_MIN_SECONDS`` of the session left, an error)
    is refused too. Either way the result is recorded (``replay_gate`` in karma and
    ``stats:replay_gate``; a refusal as ``kv_operations_rejected``, its reason starting
    ``replay_gate``), and the next deep reflection is shown it."""
    deps = session.deps
    # What the batch leaves in the gated keys, however it gets there (put, rename, copy); a batch the
    # store view refuses is not replayed: applying it records the refusal.
    staged = {k: v or "" for k, v in session.agent_kv.staged(kv_operations).items() if k in GATED_KEYS}
    if merged is not None:
        staged[keys.CONFIG_DEFAULTS] = encode(merged)
    if proposed is not None:
        staged[keys.PROMPT_ORIENT] = proposed
    n = deps.defaults.deep_reflect.replay_gate_sessions
    if not staged:
        return None
    for key, text in staged.items():
        try:
            check_value(deps.store, key, text)  # the gate itself may not be lowered
        except KVWriteRefused as exc:
            session.record(events.CONFIG_REJECTED, key=key, source="reflection", reason=str(exc))
            return str(exc)
    if n <= 0:
        return None
    report = _replayed(session, staged, n)
    session.record(events.REPLAY_GATE, keys=report["keys"], replayed=report["replayed"], skipped=report["skipped"],
                   refused=report["refused"])
    deps.store.put(keys.REPLAY_GATE, {**report, "session_id": deps.id, "at": now_iso(ms=True)})
    if report["refused"]:
        session.record(events.KV_OPERATIONS_REJECTED, source=source, reason=f"replay_gate: {report['refused']}",
                       keys=report["keys"], operations=kv_operations if _touches(kv_operations, GATED_KEYS) else None)
        for key in report["keys"]:
            session.record(events.CONFIG_REJECTED, key=key, source=source,
                           reason=f"refused by the replay gate: {report['refused']}")
    return report["refused"]


def _replayed(session, staged: dict[str, str], n: int) -> dict:
    """The gate's report on ``staged``. A report it could not make (no gate in this session, an error
    while replaying) refuses the change: what was not replayed is not applied."""
    deps = session.deps
    report: dict[str, Any] = {"keys": sorted(staged), "replayed": [], "skipped": 0, "refused": None}
    if deps.check_change is None:
        return {**report, "refused": "no replay gate in this session"}
    try:
        # Within this session's own time (reflection's reserve included; its lease held): the gate never
        # takes more than half of what is left for one replay, and refuses with too little left.
        return deps.check_change(deps.settings, deps.store, staged, n, exclude=deps.id,
                                    time_left=lambda: deps.budget.time_left(use_reserve=True))
    except Exception as exc:  # whatever broke, the change stays unjudged: refused, never applied
        return {**report, "refused": f"the replay failed: {type(exc).__name__}: {str(exc)[:300]}"}


def apply_model_details(session, updates: dict, source: str) -> bool:
    """Merge per-model field updates ``{alias_or_id: {field: value}}`` into config:models, validated."""
    current = session.deps.store.get_json(keys.CONFIG_MODELS, default=None)
    if not isinstance(current, dict):
        current = session.deps.models.model_dump()
    models = current.get("models") if isinstance(current.get("models"), list) else []
    reasons = []
    for name, fields in updates.items():
        target = next((m for m in models if isinstance(m, dict) and name in (m.get("alias"), m.get("id"))), None)
        if target is None or not isinstance(fields, dict):
            reasons.append(f"{name}: no such model or not an object")
            continue
        target.update({k: v for k, v in fields.items() if k not in ("id",)})
    try:
        Models.model_validate(current)
    except ValidationError as exc:
        e = exc.errors()[0]
        reasons.append(f"{'.'.join(map(str, e['loc']))}: {e['msg']}")
        session.record(events.CONFIG_REJECTED, key=keys.CONFIG_MODELS, update=updates, reason="; ".join(reasons),
                 source=source)
        return False
    if reasons:
        session.record(events.CONFIG_REJECTED, key=keys.CONFIG_MODELS, update=updates, reason="; ".join(reasons),
                 source=source, partial=True)
    return _put(session, keys.CONFIG_MODELS, current)


def recent_karma(store, current_id: str, sessions: int = 5, lines: int = 40) -> list[dict]:
    """A compact digest of the last few sessions: outcome and their last lines, bounded.

    The summary and the karma are marked untrusted; the id and outcome are the runtime's.
    """
    out = []
    for h in session_history.recent(store, sessions):
        if isinstance(h.get("id"), str) and h["id"] != current_id:
            out.append({"session": h["id"], "outcome": h.get("outcome"),
                        "summary": untrusted(h.get("summary"), f"memory:summary-{h['id']}"),
                        "karma": karma_digest(store, h["id"], lines=lines, chars=4000)})
    return out


DEFAULT_REFLECT_PROMPT = (
    "Review this session and answer with one JSON object: session_summary, note_to_future_self, "
    "next_orient_context.load_keys, optionally next_wake_config and kv_operations.\n\n"
    "Cost: {{sessionCost}}\nResults: {{results}}\nKarma:\n{{karma}}")
DEFAULT_DEEP_PROMPT = (
    "Deep reflection. Answer with one JSON object: reflection, note_to_future_self, optionally "
    "updated_wisdom, kv_operations, updated_defaults, next_deep_reflect.\n\nWisdom: {{wisdom}}\n"
    "History: {{sessionHistory}}\nRecent karma: {{recentKarma}}\nTool reviews: {{context.toolRecords}}\n"
    "Last replay check of a proposed change: {{context.replayGate}}")


def _text_or_none(store, key: str) -> str | None:
    """A key's text, or None when it is absent or not text (the latter recorded by the reader's caller)."""
    try:
        return store.get(key) or None
    except NotText:
        return None
