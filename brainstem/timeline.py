"""Karma entries as lines a person reads: ``brainstem karma`` and live progress."""

from __future__ import annotations

import json
from typing import Any

from . import events

# The fields worth a glance for each event; everything else stays in --json.
_SUMMARY_FIELDS: dict[str, tuple[str, ...]] = {
    events.SESSION_START: ("session_id", "effort", "crashed_session"),
    events.SESSION_END: ("outcome", "cost", "steps", "duration_ms", "next_wake_after"),
    events.LLM_CALL: ("purpose", "model", "tier", "input_tokens", "output_tokens", "cost", "duration_ms", "truncated"),
    events.TOOL_START: ("tool", "attempt"),
    events.TOOL_COMPLETE: ("tool", "ok", "duration_ms", "error"),
    events.STEP_START: ("step_id", "type"),
    events.STEP_SKIPPED: ("step_id", "reason"),
    events.STEP_FAILED: ("step_id", "error"),
    events.BUDGET_EXCEEDED: ("limit", "spent", "budget"),
    events.KV_WRITE: ("op", "key", "source"),
    events.KV_WRITE_REFUSED: ("op", "key", "reason"),
    events.FATAL_ERROR: ("error",),
}


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
    elapsed = entry.get("elapsed_ms")
    el = f"+{elapsed / 1000:7.2f}s" if isinstance(elapsed, (int, float)) else " " * 9
    return f"{t} {el}  {event:<22} {' '.join(parts)}".rstrip()
