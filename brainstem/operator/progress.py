"""Live progress of a wake, fed by the karma recorder's listeners.

On a terminal: each event with the current step against the plan's number
of steps (n/N) and spend against the budget. Elsewhere (cron, systemd): the same as plain log lines, or one
JSON object per line with ``--log-format json`` for journald and log shippers.
"""

from __future__ import annotations

from collections.abc import Callable

from brainstem.core import events
from brainstem.core.timeline import format_entry
from brainstem.operator.output import json_text


def listener(fmt: str, echo: Callable[[str], None], tty: bool) -> Callable[[dict], None]:
    if fmt == "json":
        return lambda entry: echo(json_text(entry, default=str))
    # N is the plan's number of steps (its ``plan`` event), not the step budget: "3/6" read as half done
    # when the plan had three steps and all three were done.
    state = {"step": 0, "planned": None, "spent": 0.0, "budget": None}

    def on_entry(entry: dict) -> None:
        ev = entry.get("event")
        if ev == events.SESSION_START and isinstance(entry.get("budget"), dict):
            state["budget"] = entry["budget"].get("max_cost")
        elif ev == events.BUDGET:  # the plan's budget, once clamped
            state["budget"] = entry.get("max_cost", state["budget"])
        elif ev == events.PLAN and isinstance(entry.get("steps"), int):
            state["planned"] = entry["steps"]
        elif ev == events.STEP_START:
            state["step"] = entry.get("step_number", state["step"])
        elif ev == events.LLM_CALL and isinstance(entry.get("cost"), (int, float)):
            state["spent"] += entry["cost"]
        line = format_entry(entry)
        if tty:
            line = f"[{_steps(state['step'], state['planned'])} ${state['spent']:.4f}{_budget(state['budget'])}] " \
                   f"{line[13:]}"
        echo(line)
    return on_entry


def _steps(step: int, planned: int | None) -> str:
    """``step 3/4``; before the plan, ``step 0``; past it (a conditional's or subplan's steps),
    ``step 5, 4 planned``."""
    if planned is None:
        return f"step {step}"
    return f"step {step}/{planned}" if step <= planned else f"step {step}, {planned} planned"


def _budget(budget) -> str:
    return f"/${budget:.2f}" if isinstance(budget, (int, float)) else ""
