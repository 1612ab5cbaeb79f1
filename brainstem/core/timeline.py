"""Karma entries as lines a person reads: ``brainstem karma`` and live progress."""

from __future__ import annotations

import json
from typing import Any

from brainstem.core import events

# The fields worth a glance for each event; everything else stays in --json.
_SUMMARY_FIELDS: dict[str, tuple[str, ...]] = {
    events.SESSION_START: ("session_id", "effort", "crashed_session", "dry_run"),
    events.SESSION_END: ("outcome", "kind", "cost", "steps", "duration_ms", "next_wake_after", "dry_run"),
    events.TOOL_WOULD_DO: ("tool", "reason", "input"),
    events.REFLEX_FIRED: ("reflex", "do"),
    events.REFLEX_SUPPRESSED: ("reflex", "reason", "last_fired"),
    events.REFLEX_FAILED: ("reflex", "tool", "error"),
    events.REPLAY_GATE: ("keys", "refused"),
    events.LLM_CALL: ("purpose", "model", "tier", "input_tokens", "output_tokens", "cost", "duration_ms", "truncated"),
    events.LLM_FAILED: ("purpose", "step_id", "model", "fault", "status", "error"),  # its request is replay's
    events.TOOL_START: ("tool", "attempt"),
    events.TOOL_COMPLETE: ("tool", "ok", "duration_ms", "error"),
    events.STEP_START: ("step_id", "type"),
    events.STEP_SKIPPED: ("step_id", "reason"),
    events.STEP_FAILED: ("step_id", "error"),
    events.BUDGET_EXCEEDED: ("limit", "spent", "budget"),
    events.KV_WRITE: ("op", "key", "source"),
    events.KV_WRITE_REFUSED: ("op", "key", "reason"),
    events.FATAL_ERROR: ("error",),
    events.SECRET_REFUSED: ("tool", "secrets", "host", "port", "path"),
    events.SECRET_NOT_GRANTED: ("tool", "secret_name", "reason"),
    events.COST_ANOMALY: ("model", "reported", "worst_case"),
    events.SPEND_OVERRUN: ("purpose", "model", "cost", "worst_case"),
    events.SPEND_SETTLED: ("purpose", "model", "cost", "reason"),
    events.QUOTA_EXCEEDED: ("tool", "key", "bytes", "quota"),
    events.TELEGRAM_SENT: ("tool", "chat_id", "message_id", "chars", "error"),
    events.INBOX_REPLY: ("step_id", "to", "from", "telegram_sent", "telegram_error", "text"),
    events.SCHEDULE_RUN: ("id", "scheduled", "outcome", "missed", "cost", "reason", "notify_error"),
}


def _fetch_line(e: dict) -> str:
    """``GET http://host:port/path -> 200 1234 B 12 ms [SECRET]`` (or the error)."""
    where = f"{e.get('scheme') or '?'}://{e.get('host') or '?'}:{e.get('port') or '?'}{e.get('path') or ''}"
    result = f"-> {e['status']} {e.get('bytes', 0)} B" if e.get("status") is not None else ""
    if e.get("error"):
        result = f"{result} error={_short(e['error'], 100)}".strip()
    extra = [f"{e['duration_ms']} ms"] if isinstance(e.get("duration_ms"), int) else []
    if e.get("cost") is not None:
        extra.append(f"cost={e['cost']}")
    if e.get("secrets"):
        extra.append("secrets=" + ",".join(e["secrets"]))
    if e.get("redirects"):
        extra.append(f"via {len(e['redirects'])} redirect(s)")
    return f"tool={e.get('tool')} {e.get('method')} {where} {result} {' '.join(extra)}".rstrip()


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def format_entry(entry: dict) -> str:
    t = str(entry.get("t", ""))[11:23] or "?"
    event = str(entry.get("event", "?"))
    names = _SUMMARY_FIELDS.get(event)
    if names is None:
        names = tuple(k for k in entry if k not in ("t", "elapsed_ms", "event"))[:5]
    parts = [f"{k}={_short(entry[k])}" for k in names if k in entry and entry[k] is not None]
    if event == events.FETCH:
        parts = [_fetch_line(entry)]
    elif event == events.LLM_CALL and isinstance(entry.get("tool_calls"), list) and entry["tool_calls"]:
        # an agent step's turn: which tools the model called, with what
        calls = [f"{c.get('name')}({_short(c.get('arguments') or '', 60)})" for c in entry["tool_calls"]
                 if isinstance(c, dict)]
        parts.append("calls=" + "; ".join(calls))
    elapsed = entry.get("elapsed_ms")
    el = f"+{elapsed / 1000:7.2f}s" if isinstance(elapsed, (int, float)) else " " * 9
    return f"{t} {el}  {event:<22} {' '.join(parts)}".rstrip()
