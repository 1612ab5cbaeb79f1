"""The operator's view of the agent as an MCP server (``brainstem mcp``), for an assistant the operator uses.

Every tool answers from the same functions the CLI's ``--json`` output comes from (status, the session
history, karma, the inbox, the review inbox), and every answer passes one redactor: the secrets this
process knows and the ``secret:*`` values the operator stored (the dashboard's rule), so an assistant is
shown no more than the dashboard shows. Settling a review item is offered only when the server was started
with ``--allow-settle``: without it, the tool does not exist to be called.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from brainstem.core.errors import BrainstemError, NotFound
from brainstem.store.base import Store
from brainstem.store.karma import Redactor

MAX_KARMA_ENTRIES = 500  # one session's entries in one answer; the newest kept
INSTRUCTIONS = ("The operator's view of a Brainstem agent: where it stands (status), what it did (sessions, "
                "karma), the operator's messages to it (inbox, tell) and the tool runs waiting for review. "
                "Secrets are redacted. Telling the agent something is acting for the operator.")


def redactor(settings: Any, store: Store) -> Redactor:
    """What every answer is redacted with: the settings' secrets and the operator's stored ones."""
    from brainstem.state import secret_marks

    return Redactor({**settings.known_secrets(), **secret_marks.operator_secrets(store)})


def _told(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A tool whose expected failures (a bad argument, an unknown session) answer as one line for the
    assistant, never a traceback in the server's log."""
    from mcp.server.mcpserver.exceptions import ToolError  # noqa: PLC0415 -- the SDK, only for this command

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (BrainstemError, ValueError) as exc:
            raise ToolError(str(exc)) from None
    return tool


def build(settings: Any, store: Store, *, allow_settle: bool = False) -> Any:
    """The MCP server (the SDK's ``MCPServer``) over ``store``; ``run("stdio")`` serves it."""
    from mcp.server.mcpserver import MCPServer  # noqa: PLC0415 -- the SDK, only for this command

    from brainstem.operator.status import status as status_of
    from brainstem.state import history as session_history
    from brainstem.state import inbox, review
    from brainstem.store import karma as karma_mod

    app = MCPServer("brainstem", instructions=INSTRUCTIONS, log_level="WARNING")

    def tool(description: str) -> Callable[[Callable[..., Any]], Any]:
        return lambda fn: app.tool(description=description)(_told(fn))

    def shown(value: Any) -> Any:
        return redactor(settings, store)(value)  # read again each call: a secret stored since is hidden too

    @tool("Where the agent stands: last session and outcome, spend today against the ceilings, "
                          "balances and runway, next wake, deep reflection, unread messages (brainstem status).")
    def status() -> dict:
        return shown(status_of(store, settings))

    @tool("The agent's sessions, newest last: id, kind, outcome, cost, steps, summary "
                          "(brainstem sessions). limit: how many of the newest.")
    def sessions(limit: int = 20) -> list:
        return shown(session_history.read(store)[-max(1, min(int(limit), 500)):])

    @tool("One session's flight recorder (brainstem karma --json): every LLM call, tool run "
                          "and store write. session: its id (12-a1b2c3) or number; empty: the latest.")
    def karma(session: str = "") -> dict:
        sid = session_history.resolve_session(store, session.strip()) if session.strip() else \
            karma_mod.latest_session_id(store)
        if sid is None:
            raise NotFound(f"no session {session!r}; the sessions tool lists them" if session else
                           "no session has run yet")
        entries = karma_mod.read(store, sid)
        return shown({"session": sid, "entries": entries[-MAX_KARMA_ENTRIES:],
                      "left_out": max(0, len(entries) - MAX_KARMA_ENTRIES)})

    @tool("The operator's messages to the agent and whether it has read each, with its "
                          "replies (brainstem inbox). unread: only those not read yet.")
    def inbox_messages(unread: bool = False, limit: int = 20) -> list:
        n = max(1, min(int(limit), 500))
        return shown(inbox.unread(store)[-n:] if unread else inbox.messages(store, limit=n))

    @tool("Leave the agent a message from the operator; its next session reads it "
                          "(brainstem tell). urgent: make the agent due now.")
    def tell(text: str, urgent: bool = False) -> dict:
        if not text.strip():
            raise ValueError("the message is empty")
        msg = inbox.post(store, text, sender="operator", urgent=urgent, extra={"via": "mcp"})
        return shown(msg)

    @tool("Runs of supervised tools waiting for the operator's verdict (brainstem review).")
    def pending_review() -> list:
        return shown(review.items(store))

    if allow_settle:
        @tool("Settle a review item for the operator: confirm (the run was right) or correction "
                              "(what it should have done) (brainstem review ID --confirm / --correct TEXT).")
        def settle_review(item_id: str, confirm: bool = False, correction: str | None = None) -> dict:
            if confirm == (correction is not None):
                raise ValueError("give confirm=true or a correction, one of them")
            return shown(review.settle(store, item_id, confirm=confirm, correction=correction))

    return app
