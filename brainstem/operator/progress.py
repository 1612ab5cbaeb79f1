"""Live progress of a wake, fed by the karma recorder's listeners.

On a terminal: each event with the current step (n of N) and spend against
the budget. Elsewhere (cron, systemd): the same as plain log lines, or one
JSON object per line with ``--log-format json`` for journald and log shippers.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from brainstem.core import events
from brainstem.core.timeline import format_entry


def listener(fmt: str, echo: Callable[[str], None], tty: bool) -> Callable[[dict], None]:
    if fmt == "json":
        return lambda entry: echo(json.dumps(entry, ensure_ascii=False, default=str))
    state = {"step": 0, "max_steps": None, "spent": 0.0, "budget": None}

    def on_entry(entry: dict) -> None:
        ev = entry.get("event")
        if ev == events.SESSION_START and isinstance(entry.get("budget"), dict):
            state["budget"] = entry["budget"].get("max_cost")
            state["max_steps"] = entry["budget"].get("max_steps")
        elif ev == events.BUDGET:  # the plan's budget, once clamped
            state["budget"] = entry.get("max_cost", state["budget"])
            state["max_steps"] = entry.get("max_steps", state["max_steps"])
        elif ev == events.STEP_START:
            state["step"] = entry.get("step_number", state["step"])
            state["max_steps"] = entry.get("max_steps", state["max_steps"])
        elif ev == events.LLM_CALL and isinstance(entry.get("cost"), (int, float)):
            state["spent"] += entry["cost"]
        line = format_entry(entry)
        if tty:
            budget = f"/${state['budget']:.2f}" if isinstance(state["budget"], (int, float)) else ""
            steps = f"{state['step']}/{state['max_steps']}" if state["max_steps"] is not None else f"{state['step']}"
            line = f"[step {steps} ${state['spent']:.4f}{budget}] {line[13:]}"
        echo(line)
    return on_entry
