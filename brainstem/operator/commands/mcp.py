"""``brainstem mcp``: the operator's view served over MCP (stdio), for an assistant the operator uses."""

from __future__ import annotations

import click

from brainstem.operator.commands.context import Ctx, pass_ctx


@click.command("mcp")
@click.option("--allow-settle", is_flag=True,
              help="Also offer settle_review, so the assistant may confirm or correct a supervised tool's run "
                   "for you. Without it, review items can be read, never settled.")
@pass_ctx
def mcp_command(c: Ctx, allow_settle: bool) -> None:
    """Serve the agent's status, sessions, karma, inbox and review over MCP on stdio.

    Start it from an MCP client (an assistant, an IDE) as a stdio server, so
    it can supervise the agent with you: tools status, sessions, karma (one
    session's flight recorder), inbox_messages, tell (leave the agent a
    message, as `brainstem tell` does) and pending_review. Every answer is
    redacted as the dashboard is. Settling a review item needs
    --allow-settle when the server starts.

    \b
    In a client's mcpServers configuration:
      {"mcpServers": {"brainstem": {"command": "brainstem", "args": ["mcp"],
                                    "env": {"BRAINSTEM_KV": "sqlite:////home/me/agent.db"}}}}
    """
    from brainstem.operator.mcp_view import build

    build(c.settings, c.store, allow_settle=allow_settle).run("stdio")
