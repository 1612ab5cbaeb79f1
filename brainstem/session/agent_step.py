"""The ``agent`` step: the model calls tools, sees what they return, and calls again until it answers.

Read it top to bottom. The step's tools are looked up first: an unknown one,
or one whose input schema is broken, fails the step before any call. Each
turn asks the model with the tools offered (OpenAI function calling, through
the chokepoint like every call: priced, held, recorded as ``llm_call``
purpose ``agent``). An answer with no tool calls ends the step; its text is
the step's result. Otherwise every call is checked (a tool that was not
offered, arguments that are not JSON or do not fit the schema: the model is
told, the tool does not run) and run in the sandbox under its mode and
grants, several at once when the model asked for several; each result goes
back as a ``tool`` message, wrapped as untrusted text, and so does an error
that quotes the model's arguments (:func:`as_data`). After ``max_turns``
tool rounds, or once the session is down to its last tenth of cost or time,
one last call with ``tool_choice: "none"`` asks for the answer. Every turn
re-sends the conversation unchanged and adds to its end, so its prefix is
the same bytes each time, and is marked for the provider's prompt cache
while more turns may follow (where the model's cache prices make it pay).

In a dry run no tool runs: the model is told each result is a stand-in and
that what it concludes is hypothetical. A replay answers each turn from the
recording, so the same calls are made and checked again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from brainstem.core import events
from brainstem.core.mcp_config import is_mcp
from brainstem.core.plan import AgentStep
from brainstem.core.templates import capped
from brainstem.core.untrusted import Untrusted
from brainstem.llm.cache import Reuse
from brainstem.llm.chokepoint import LLMError
from brainstem.llm.messages import assistant_message, tool_message
from brainstem.tools.schema import SchemaError, check_arguments, function_spec
from brainstem.tools.tool import ToolError, load_tool

PURPOSE = "agent"
WRAP_UP_FRACTION = 0.10  # under this share of the session's cost or time left, the step asks for its answer
MAX_PARALLEL = 4  # tool calls of one answer run side by side, at most this many at a time

NOT_RUN = {
    "dry_run": ("This is a dry run: the tool was not run and nothing reached the world. Treat this as a "
                "stand-in result; anything you conclude from it is hypothetical."),
    "manual": "The tool was not run: it is in manual mode, so only the operator may run it.",
    "review_dropped": ("The tool was not run: it is supervised, and this session has queued as many runs "
                       "for the operator's review as it may."),
}


class AgentStepFailed(Exception):
    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final  # asking again cannot help, or tools already ran (a retry would repeat them)


@dataclass
class Offered:
    name: str
    schema: dict
    spec: dict  # the OpenAI function entry


def offer(session, names: list[str]) -> dict[str, Offered]:
    """The step's tools, ready to offer; :class:`AgentStepFailed` naming the first that cannot be. An
    ``mcp__SERVER__TOOL`` is the operator's MCP server's, offered with the schema the server lists."""
    out: dict[str, Offered] = {}
    store = session.deps.store
    mcp = session.mcp_catalog() if any(is_mcp(n) for n in names) else None
    for name in dict.fromkeys(names):
        if mcp is not None and is_mcp(name):
            tool = mcp.tools.get(name)
            if tool is None:
                raise AgentStepFailed(f"agent step: tool {name!r} cannot be offered: {mcp.why_not(name)}",
                                      final=True)
            spec = tool.spec()
            out[name] = Offered(name=name, schema=spec["function"]["parameters"], spec=spec)
            continue
        try:
            _, meta = load_tool(store, name)
            spec = function_spec(name, meta)
        except (ToolError, SchemaError) as exc:
            raise AgentStepFailed(f"agent step: tool {name!r} cannot be offered: {exc}", final=True) from None
        out[name] = Offered(name=name, schema=spec["function"]["parameters"], spec=spec)
    return out


def run_agent(session, step: AgentStep, sid: str, prompt: str) -> str:
    """Run one agent step; returns the model's final answer."""
    deps = session.deps
    tools = offer(session, step.tools)
    model = step.model or deps.defaults.orient.model
    max_tokens = step.max_tokens or deps.defaults.execution.think_max_tokens
    conversation: list[dict] = [{"role": "user", "content": prompt}]
    rounds, ran = 0, False

    def ask(choice: str):
        # Each turn sends the conversation so far again, byte for byte, and adds to its end: while more turns
        # may follow, the whole of it is worth caching for the next. The last one ("none") expects no other.
        reuse = Reuse(after_s=0.0, times=step.max_turns - rounds) if choice == "auto" else None
        try:
            return session.llm.call(purpose=PURPOSE, model=model, history=conversation, max_tokens=max_tokens,
                                    step_id=sid, tools=[t.spec for t in tools.values()], tool_choice=choice,
                                    reuse=reuse)
        except LLMError as exc:
            raise AgentStepFailed(str(exc), final=exc.final or ran) from None

    while True:
        wrap_up = _wrap_up_reason(deps.budget, rounds, step.max_turns)
        if wrap_up is not None:
            session.record(events.AGENT_WRAP_UP, step_id=sid, reason=wrap_up, rounds=rounds)
            return _answer(ask("none"), sid, ran)
        result = ask("auto")
        if not result.tool_calls:
            return _answer(result, sid, ran)
        rounds += 1
        calls = _unique_ids(result.tool_calls)
        conversation.append(assistant_message(result.content, calls))
        replies = _run_calls(session, tools, calls, sid)
        ran = ran or any(r is not None for _, r in replies)
        conversation.extend(tool_message(call["id"], text) for call, (text, _) in zip(calls, replies, strict=True))


def _wrap_up_reason(budget, rounds: int, max_turns: int) -> str | None:
    if rounds >= max_turns:
        return "max_turns"
    left, _ = budget.headroom()
    if left < WRAP_UP_FRACTION * budget.max_cost:
        return "cost"
    if budget.time_left() < WRAP_UP_FRACTION * budget.max_duration:
        return "time"
    return None


def _answer(result, sid: str, ran: bool) -> str:
    if not result.content.strip():
        raise AgentStepFailed(f"agent step {sid}: the model's answer was empty"
                              + (" (cut off by max_tokens)" if result.truncated else ""), final=ran)
    return result.content


def _unique_ids(calls: list[dict]) -> list[dict]:
    """Each call answerable by its id, even from an adapter that repeats ids."""
    seen: set[str] = set()
    out = []
    for i, call in enumerate(calls):
        call_id = call["id"] if call["id"] not in seen else f"{call['id']}_{i}"
        seen.add(call_id)
        out.append({**call, "id": call_id})
    return out


def _run_calls(session, tools: dict[str, Offered], calls: list[dict], sid: str) -> list[tuple[str, Any]]:
    """(the text the model is shown, the outcome or None when the tool did not run) for each call, in order."""
    if len(calls) <= 1:
        return [_run_call(session, tools, call, sid) for call in calls]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(calls)), thread_name_prefix="agent-tool") as pool:
        return list(pool.map(lambda call: _run_call(session, tools, call, sid), calls))


def _run_call(session, tools: dict[str, Offered], call: dict, sid: str) -> tuple[str, Any]:
    name = call["name"]
    offered = tools.get(name)
    cap = session.deps.defaults.execution.max_result_chars
    if offered is None:
        unoffered = f"tool {name!r} is not offered in this step (offered: {', '.join(tools)})"
        session.record(events.AGENT_CALL_REJECTED, step_id=sid, tool=name[:200], call_id=call["id"], error=unoffered)
        return "Error: that call was not run. What was wrong:\n" + as_data(unoffered, name, cap), None
    args, error = check_arguments(offered.schema, call["arguments"])
    if error is not None:
        session.record(events.AGENT_CALL_REJECTED, step_id=sid, tool=name, call_id=call["id"], error=error,
                       arguments=call["arguments"][:500])
        return ("Error: the tool was not run; call it again with corrected arguments. What was wrong:\n"
                + as_data(error, name, cap)), None
    outcome = session.run_tool(name, args, step_id=sid)
    if outcome.not_run is not None:
        return NOT_RUN.get(outcome.not_run, f"The tool was not run ({outcome.not_run})."), None
    if not outcome.ok:
        return "The tool failed. " + as_data(outcome.error or "failed", name, cap), outcome
    return as_data(outcome.value, name, cap), outcome


def as_data(value: Any, tool: str, cap: int) -> str:
    """What the model is shown of a call to ``tool`` that is not the runtime's own words: the tool's
    result or error, and an error that quotes the model's own arguments back (a name, a value that did
    not fit). Capped, sanitised and wrapped as untrusted text, all of it by this one function."""
    return Untrusted(capped(value, cap), f"tool:{tool}").text()
