"""``brainstem tool``: list the agent's tools, run one in the sandbox as a session would, and approve
the exact bytes of the agent's code (pending, diff, approve)."""

from __future__ import annotations

import json
from contextlib import closing

import click

from brainstem.core import keys
from brainstem.core.errors import BadArgument, BrainstemError, NotFound
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import echo_lines, json_lines, print_json, short_time, table


@click.group()
def tool() -> None:
    """Run and inspect the agent's tools (Python stored in tool:NAME:code).

    \b
    Examples:
      brainstem tool ls
      brainstem tool run kv_read --input '{"key": "wisdom"}'
      brainstem tool pending                      # code the agent wrote that you have not approved
      brainstem tool diff web_fetch && brainstem tool approve web_fetch
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
    from brainstem.core.mcp_config import is_mcp
    from brainstem.core.timeline import format_entry
    from brainstem.sandbox import pool
    from brainstem.state.guarded import AgentKV
    from brainstem.state.schedules import Limits
    from brainstem.store.karma import Redactor
    from brainstem.tools import mcp_tools
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
    with closing(policy):  # an MCP tool's server ends with the command
        if is_mcp(name):
            found = mcp_tools.catalog(policy, record, timeout=c.settings.max_session_seconds)
            if name not in found.tools:
                raise NotFound(f"{name}: {found.why_not(name)}")
        elif ":" in name or c.store.get(keys.tool_code(name)) is None:
            # Named nothing: exit 2 before the sandbox starts, not the 1 of a tool that ran and failed.
            raise NotFound(f"no tool named {name!r} in {c.store.display_url}; `brainstem tool ls` lists them")
        agent_kv = AgentKV(c.store, record, limits=Limits.from_settings(c.settings))
        with pool.use(0):  # one call: no worker to keep ready for a next
            out = run_tool(name, args, store=c.store, agent_kv=agent_kv, record=record, policy=policy)
    if not out.ok:
        raise BrainstemError(f"tool {name} failed: {redact(out.error or 'unknown error')}")
    print_json(redact(out.value), indent=2)


# --- approval -------------------------------------------------------------

NAME_RULE = "a tool's name (notify), or provider:NAME for the agent's LLM adapter and balance checkers (provider:llm)"


def _current_code(c: Ctx, name: str) -> str:
    """The bytes stored as ``name``'s code now; exit 2 for a name that is not one or holds no code."""
    key = keys.code_key(name) if name else ""
    if keys.code_name(key) != name:
        raise BadArgument(f"{name!r} names no code: give {NAME_RULE}")
    code = c.store.get(key)
    if code is None:
        raise NotFound(f"no code at {key} in {c.store.display_url}; `brainstem tool pending` lists the agent's "
                       f"unapproved code, `brainstem tool ls` the tools")
    return code


@tool.command("approve")
@click.argument("name")
@click.option("--sha256", "expect", metavar="PREFIX",
              help="Approve only if the current bytes' sha256 starts with PREFIX (as `tool diff` showed it), so "
                   "what you approve is what you read even if the agent rewrites it meanwhile.")
@pass_ctx
def tool_approve(c: Ctx, name: str, expect: str | None) -> None:
    """Approve the current bytes of NAME's code: from now on they run at their configured mode.

    NAME is a tool's name (its code is tool:NAME:code), or provider:NAME for
    provider:NAME:code. With new=MODE in BRAINSTEM_TOOL_MODES, code the agent
    wrote runs no higher than MODE until you approve its exact bytes under its
    name; any later change to them (by the agent, in place or by copy) is
    pending again.

    \b
    Examples:
      brainstem tool diff notify                  # read what changed, note the hash
      brainstem tool approve notify --sha256 3f2a9c
      brainstem tool approve provider:llm
    """
    from brainstem.state import approval

    if expect is not None and len(expect) < 6:
        raise BadArgument(f"--sha256 takes at least the first 6 hex digits of the hash, got {expect!r}")
    code = _current_code(c, name)
    key, sha = keys.code_key(name), approval.digest(code)
    if expect is not None and not sha.startswith(expect.lower()):
        raise BadArgument(f"{key} is now sha256 {sha[:12]}, not {expect!r}: read `brainstem tool diff {name}` "
                          f"again (nothing approved)")
    before = approval.record(c.store, name)
    what = f"{key} ({len(code.encode())} bytes, sha256 {sha[:12]})"
    if before is not None and before["by"] != "shipped" and before["sha256"] == sha:
        click.echo(f"{what} is already approved")
        return
    approval.approve(c.store, name, code, by="operator:tool approve")
    click.echo(f"approved {what}")


@tool.command("pending")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per piece of code.")
@pass_ctx
def tool_pending(c: Ctx, as_json: bool) -> None:
    """Code in the store whose exact bytes you have not approved under its name.

    Each: its name, since when it holds these bytes (as far as the store's
    history says), its size, and the start of its sha256. With new=MODE in
    BRAINSTEM_TOOL_MODES it runs no higher than MODE until approved.

    \b
    Examples:
      brainstem tool pending
      brainstem tool pending --json | jq -r .name
    """
    from brainstem.state import approval

    rows = approval.pending(c.store)
    if as_json:
        json_lines(rows)
        return
    if not rows:
        click.echo("no pending code: every tool and provider runs the bytes you approved")
        return
    echo_lines(table([[r["name"], short_time(r["since"]) if r["since"] else "unknown",
                       str(r["bytes"]), r["sha256"][:12]] for r in rows],
                     right=(2,), header=["NAME", "SINCE", "BYTES", "SHA256"]))
    click.echo("`brainstem tool diff NAME` shows each against what you approved; `brainstem tool approve NAME` "
               "approves it")


@tool.command("diff")
@click.argument("name")
@pass_ctx
def tool_diff(c: Ctx, name: str) -> None:
    """NAME's code now against the bytes you approved under NAME, as a unified diff.

    Characters a terminal would not show (escapes, zero-width and bidi
    controls, carriage returns) are spelled out as \\u{XXXX}.

    \b
    Examples:
      brainstem tool diff notify
      brainstem tool diff provider:llm
    """
    from brainstem.state import approval

    code = _current_code(c, name)
    text = approval.diff(c.store, name, code)
    if not text:
        click.echo(f"{keys.code_key(name)}: approved, no difference (sha256 {approval.digest(code)[:12]})")
        return
    click.echo(text, nl=False)
