"""The MCP servers' tools as a tool source beside the store's: what is offered of them, and one call.

A tool of the operator's MCP server ``SERVER`` is offered as ``mcp__SERVER__TOOL``, with the input schema
the server lists (checked as a tool meta's ``input`` is: :func:`brainstem.tools.schema.input_schema`).
What a session lists is recorded once per server, as an ``mcp_tools`` entry (the tools with their
descriptions and schemas, or the error), so a replay offers exactly what the session was offered. Names
that a model's function calling could not carry (more than 64 characters, or other than letters, digits,
``_`` and ``-``) and tools whose schema is broken are not offered; the entry says which and why.

:func:`call` is the one place an MCP tool runs; :func:`brainstem.tools.services.run_tool` decides first
whether it may (modes, a dry run, the review inbox) and records it like any tool run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from brainstem.core import events
from brainstem.core.errors import ConfigError
from brainstem.core.mcp_config import split, tool_name
from brainstem.core.sanitize import sanitize
from brainstem.core.untrusted import Untrusted
from brainstem.tools.schema import SchemaError, input_schema
from brainstem.tools.tool import ToolMeta

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")  # what OpenAI-style function calling carries
MAX_DESCRIPTION = 1024
MAX_SCHEMA_CHARS = 16_000  # a tool's input schema, encoded: it goes into every request that offers the tool


@dataclass
class MCPTool:
    name: str  # mcp__SERVER__TOOL
    server: str
    description: str
    schema: dict

    def spec(self) -> dict:
        """The tool in the OpenAI function-calling format."""
        # The description is the server's text, not the operator's: said so where the model reads it.
        said = f"[MCP server {self.server}'s description, untrusted] {self.description}"
        return {"type": "function", "function": {"name": self.name, "description": said,
                                                 "parameters": self.schema}}


@dataclass
class Catalog:
    tools: dict[str, MCPTool] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # a server, or a tool's name -> why it is not offered
    listed: set[str] = field(default_factory=set)  # the servers asked

    def why_not(self, name: str) -> str:
        """Why ``name`` is not offered, in one line."""
        for key in (name, "*"):  # "*": the operator's file itself is bad
            if key in self.problems:
                return self.problems[key]
        parts = split(name)
        if parts is None:
            return "not an MCP tool's name (mcp__SERVER__TOOL)"
        server, tool = parts
        if server in self.problems:
            return self.problems[server]
        if not any(t.server == server for t in self.tools.values()) and server not in self.listed:
            return f"no MCP server {server!r} in BRAINSTEM_MCP_CONFIG"
        return f"MCP server {server!r} offers no tool {tool!r}"


def catalog(policy: Any, record: Callable[..., Any], timeout: float) -> Catalog:
    """The MCP tools offered to this session, the servers asked on first use (``mcp_tools``, once each)."""
    try:
        source = policy.mcp()
    except ConfigError as exc:
        if policy.mcp_noted("config"):
            record(events.MCP_CONFIG_INVALID, error=str(exc))
        return Catalog(problems={"*": str(exc)})
    out = Catalog()
    if source is None:
        return out
    for server, listing in source.list_all(max(0.0, timeout)).items():
        _take(out, policy, record, server, listing)
    return out


def _take(out: Catalog, policy: Any, record: Callable[..., Any], server: str, listing: Any) -> None:
    """``server``'s ``listing`` into ``out``: the tools offered, and why the others are not (recorded
    ``mcp_tools`` the first time a session sees it)."""
    out.listed.add(server)
    offered, skipped = [], {}
    if listing.error is not None:
        out.problems[server] = f"MCP server {server!r} is unavailable: {listing.error}"
    for t in listing.tools:
        name = tool_name(server, str(t.get("name")))
        why = _not_offered(name, t)
        if why is not None:
            skipped[name] = why
            out.problems[name] = why
            continue
        out.tools[name] = MCPTool(name=name, server=server, schema=t["input"],
                                  description=sanitize(str(t.get("description") or ""))[:MAX_DESCRIPTION])
        offered.append(name)
    if policy.mcp_noted(server):
        record(events.MCP_TOOLS, server=server, tools=listing.tools, offered=offered, skipped=skipped or None,
               error=listing.error)


def _not_offered(name: str, listed: dict) -> str | None:
    if not FUNCTION_NAME.match(name):
        return f"{name[:80]!r} is not offered: a function name must be at most 64 letters, digits, '_' or '-'"
    schema = listed.get("input")
    size = len(json.dumps(schema, ensure_ascii=False, default=str))
    if size > MAX_SCHEMA_CHARS:
        return f"{name} is not offered: its input schema is {size} characters, over {MAX_SCHEMA_CHARS}"
    try:
        input_schema(ToolMeta(input=schema if isinstance(schema, dict) else {}))
    except SchemaError as exc:
        return f"{name} is not offered: its {exc}"
    return None


def prompt_entries(found: Catalog) -> dict[str, Any]:
    """The offered tools as the orient prompt lists tools (name -> description and input), each entry
    marked as the server's text: untrusted, like a tool's result."""
    return {name: Untrusted({"description": t.description, "input": t.schema}, f"mcp:{t.server}")
            for name, t in found.tools.items()}


@dataclass
class Called:
    ok: bool
    value: Any = None
    error: str | None = None
    retryable: bool = True


def call(policy: Any, record: Callable[..., Any], name: str, args: Any, timeout: float) -> Called:
    """Call the MCP tool ``name`` (``mcp__SERVER__TOOL``) with ``args``, for at most ``timeout`` seconds
    (its server's listing included, the first time it is asked). Only a tool its server offers this
    session is called: whatever step, reflex or schedule names it, a tool the server did not list, or
    lists under a name or schema that is not offered, is refused without a word to the server."""
    parts = split(name)
    if parts is None:
        return Called(False, error=f"{name[:80]!r} is not an MCP tool's name (mcp__SERVER__TOOL)", retryable=False)
    if not isinstance(args, dict):
        return Called(False, error="an MCP tool's input must be a JSON object", retryable=False)
    try:
        source = policy.mcp()
    except ConfigError as exc:
        return Called(False, error=str(exc), retryable=False)
    if source is None:
        return Called(False, error="no MCP servers: BRAINSTEM_MCP_CONFIG is not set", retryable=False)
    server, tool = parts
    started = time.monotonic()
    timeout = min(timeout, source.timeout_of(server))
    found = Catalog()
    _take(found, policy, record, server, source.list_tools(server, max(0.05, timeout)))
    if name not in found.tools:
        return Called(False, error=f"{name[:120]} is not offered: {found.why_not(name)}", retryable=False)
    left = timeout - (time.monotonic() - started)
    out = source.call_tool(server, tool, args, max(0.05, left))
    return Called(out.ok, value=out.value, error=out.error)
