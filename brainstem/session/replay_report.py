"""A replay's report: what a session did, old beside new, and the lines a terminal shows.

:func:`behaviour` reads what a session did from its karma (plan, step outcomes
and results, store writes, cost, reflection), leaving out the clock, so the
same session and config give byte-identical reports; :func:`compare` sets the
recorded session beside its replay (:mod:`brainstem.session.replay`), with a
unified diff of the prompt text of each request that changed (:func:`prompt_diff`),
and :func:`render` prints that.
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from typing import Any

from brainstem.core import events, outcomes
from brainstem.core.json_numbers import finite_or
from brainstem.core.plan import PlanError, parse_plan
from brainstem.session.replay import Replayed, volatile_out

DIFF_CONTEXT = 3  # unchanged lines shown around each change
DIFF_LINES = 200  # of one request's diff; past that the rest is counted, not shown


def behaviour(entries: list[dict], outcome: str | None, cost: Any) -> dict:
    """What a session did, without the clock: plan, step outcomes, store writes, cost, reflection."""
    plan: Any = None
    orient_answer = None
    steps: dict[str | None, dict] = {}  # by step id (None: an entry that names none)
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
    requests = [{"purpose": c["purpose"], "step_id": c["step_id"], "diff": prompt_diff(c["before"], c["now"])}
                for c in replayed.changed]
    differences = [{"part": k, "before": parts[k]["before"], "now": parts[k]["now"]} for k in differs if k != "steps"]
    differences[1:1] = [{"part": "steps", "id": r["id"], "before": r["before"], "now": r["now"]}
                        for r in step_rows if not r["same"]]
    differences += [{"part": "request", **r} for r in requests]
    return {"session": rec.id, "same": not differs, "differs": differs, "answers": replayed.answers,
            **parts, "steps": step_rows, "karma": replayed.karma_id, "requests": requests,
            "differences": differences}


def prompt_lines(request: dict | None) -> list[str]:
    """A request's prompt as lines: the model, then each message after the soul under its role (an agent
    step's tool calls and answers named)."""
    if request is None:
        return []
    lines = [f"model: {request.get('model')}"]
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        lines.append(f"[{m.get('role')}]" + (f" answering {m['tool_call_id']}" if m.get("tool_call_id") else ""))
        lines += str(m.get("content") or "").splitlines()
        for c in m.get("tool_calls") or []:
            fn = (c.get("function") or {}) if isinstance(c, dict) else {}
            lines.append(f"(calls {fn.get('name')} {fn.get('arguments')})")
    return lines


def prompt_diff(before: dict | None, now: dict) -> str:
    """A unified diff of the prompt text, recorded against now. Lines are matched with clock readings
    left out (as requests are compared), so a line that differs only in a time is not a change."""
    a, b = prompt_lines(before), prompt_lines(now)
    out = ["--- recorded" if before is not None else "--- recorded (no call here)", "+++ now"]
    matcher = SequenceMatcher(None, [volatile_out(x) for x in a], [volatile_out(x) for x in b], autojunk=False)
    for group in matcher.get_grouped_opcodes(DIFF_CONTEXT):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [" " + x for x in b[b1:b2]]
            else:
                out += ["-" + x for x in a[a1:a2]] + ["+" + x for x in b[b1:b2]]
    if len(out) == 2:  # the same text: what differs is in the request's settings (its tools, its limits)
        out.append("(the prompt text is the same; the request's model, tools or tool calls differ)")
    if len(out) > DIFF_LINES:
        out = out[:DIFF_LINES] + [f"... {len(out) - DIFF_LINES} more lines"]
    return "\n".join(out)


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
    for r in report.get("requests") or []:
        lines.append("")
        lines.append(f"changed request: {r['purpose']}" + (f" (step {r['step_id']})" if r.get("step_id") else ""))
        lines += r["diff"].splitlines()
    if report.get("karma"):
        lines.append(f"live calls were made: their karma is kept as {report['karma']} (brainstem karma "
                     f"{report['karma']})")
    return lines
