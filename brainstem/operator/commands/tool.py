"""``brainstem tool``: list the agent's tools, and run one in the sandbox as a session would."""

from __future__ import annotations

import json

import click

from brainstem.core import keys
from brainstem.core.errors import BadArgument, BrainstemError, NotFound
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import echo_lines, json_lines, print_json, table


@click.group()
def tool() -> None:
    """Run and inspect the agent's tools (Python stored in tool:NAME:code).

    \b
    Examples:
      brainstem tool ls
      brainstem tool run kv_read --input '{"key": "wisdom"}'
      brainstem history tool:web_fetch:code      # how the agent changed a tool
    """


@tool.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per tool.")
@pass_ctx
def tool_ls(c: Ctx, as_json: bool) -> None:
    """Every tool in the store: description, mode, KV access, secrets it asks for, timeout.

    A tool whose meta is invalid (or whose code is missing) is listed as
    INVALID with the reason: a session's step that calls it fails the same way.

    \b
    Examples:
      brainstem tool ls
      brainstem tool ls --json | jq -r 'select(.error) | .name'
    """
    from brainstem.tools.tool import list_tools

    tools = list_tools(c.store)
    if as_json:
        json_lines(tools)
        return
    if not tools:
        click.echo("no tools in the store (brainstem seed writes the shipped ones)")
        return
    rows = []
    for t in tools:
        if t["error"]:
            rows.append([t["name"], "INVALID", "", "", "", t["error"]])
            continue
        asked = list(t["secrets"]) + [f"secret:{n}" for n in t["kv_secrets"]]
        rows.append([t["name"], t["mode"], t["kv_access"], f"{t['timeout_ms'] / 1000:g}s", ",".join(asked) or "-",
                     " ".join((t["description"] or "").split())[:70]])
    echo_lines(table(rows, right=(3,), header=["NAME", "MODE", "KV", "TIMEOUT", "SECRETS", "DESCRIPTION"]))


def _json_type(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


@tool.command("run")
@click.argument("name")
@click.option("--input", "input_json", default="{}", show_default=True, help="The tool's args, as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Print the karma events of the run to stderr.")
@pass_ctx
def tool_run(c: Ctx, name: str, input_json: str, verbose: bool) -> None:
    """Run one tool in the sandbox, exactly as a session would, and print its result as JSON.

    Secrets, KV access and fetch follow the tool's meta and your settings
    (BRAINSTEM_TOOL_SECRETS, BRAINSTEM_FETCH_ALLOW). Requests it sends to
    the LLM endpoint are metered under BRAINSTEM_MAX_SESSION_COST and count
    towards today's spend. This is not a session: nothing is added to session
    history and the schedule is untouched.

    \b
    Examples:
      brainstem tool run web_fetch --input '{"url": "https://example.org"}'
      brainstem tool run kv_read --input '{"key": "wisdom"}' -v
    """
    from brainstem.core.clock import now_iso
    from brainstem.core.timeline import format_entry
    from brainstem.sandbox import pool
    from brainstem.state.guarded import AgentKV
    from brainstem.store.karma import Redactor
    from brainstem.tools.policy import standalone_tool_policy
    from brainstem.tools.services import run_tool

    example = '--input \'{"url": "https://example.org"}\''
    try:
        args = json.loads(input_json)
    except ValueError as exc:
        raise BadArgument(f"--input is not valid JSON ({exc}); it must be a JSON object, e.g. {example}") from None
    if not isinstance(args, dict):
        raise BadArgument(f"--input must be a JSON object, e.g. {example}; got a JSON {_json_type(args)}")
    redact = Redactor(c.settings.known_secrets())

    def record(event: str, **fields) -> dict:
        entry = redact({"t": now_iso(ms=True), "event": event, **fields})
        if verbose:
            click.echo(format_entry(entry), err=True)
        return entry

    policy = standalone_tool_policy(c.store, c.settings, record,
                                    on_secrets=lambda secrets: [redact.add(k, v) for k, v in secrets.items()])
    if ":" in name or c.store.get(keys.tool_code(name)) is None:
        # Named nothing: exit 2 before the sandbox starts, not the 1 of a tool that ran and failed.
        raise NotFound(f"no tool named {name!r} in {c.store.display_url}; `brainstem tool ls` lists them")
    pool.configure(0)  # one call: no worker to keep ready for a next
    out = run_tool(name, args, store=c.store, agent_kv=AgentKV(c.store, record), record=record, policy=policy)
    if not out.ok:
        raise BrainstemError(f"tool {name} failed: {redact(out.error or 'unknown error')}")
    print_json(redact(out.value), indent=2)
