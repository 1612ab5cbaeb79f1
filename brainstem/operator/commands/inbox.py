"""``brainstem tell`` and ``brainstem inbox``: the operator's messages to the agent (:mod:`brainstem.state.inbox`)."""

from __future__ import annotations

import sys

import click

from brainstem.core.errors import BadArgument, ConfigError, one_line
from brainstem.operator.commands.context import Ctx, pass_ctx
from brainstem.operator.output import as_text, echo_lines, json_lines, print_json, short_time, table

AGENT_HELP = "The agent to talk with (its keys live under NAME:). Default: the store's agent (BRAINSTEM_KV_PREFIX)."
PREVIEW = 200  # characters of a message's text in the listing (--json has it whole)


def _agent_store(c: Ctx, agent: str | None, need_soul: bool):
    """The store of the agent ``--agent`` names, else the one the settings select; with ``need_soul``, one
    with no soul there is a one-line error (a message for an agent that does not exist would be lost)."""
    store = c.store
    if agent is not None:
        from brainstem.core.names import agent_prefix
        from brainstem.store import open_store

        prefix = agent_prefix(agent, "--agent")
        if prefix:
            # Looked up first: opening the store as an agent registers its name, and a mistyped name must
            # not become an agent.
            with open_store(c.settings.kv, prefix="") as everyone:
                if prefix[:-1] not in everyone.registered_agents():
                    raise ConfigError(f"unknown agent {prefix[:-1]!r} in {everyone.display_url} (brainstem agents "
                                      f"list names them)")
        store = open_store(c.settings.kv, prefix=prefix, register=False)
    if need_soul:
        from brainstem.core import keys

        if not (store.get(keys.SOUL) or "").strip():
            who = f"agent {agent.rstrip(':')}" if agent else "the agent"
            raise ConfigError(f"{who} has no soul in {store.display_url}: no agent lives there to read it; seed "
                              f"it first (brainstem seed --soul FILE)")
    return store


def reply_line(reply: dict) -> str:
    """One reply of the agent's, as the listing shows it under its message: when, whether it reached
    Telegram, and its text."""
    sent = {True: ", sent to Telegram", False: ", NOT sent to Telegram"}.get(reply.get("telegram_sent"), "")
    why = f" ({one_line(reply.get('telegram_error'), 120)})" if reply.get("telegram_error") else ""
    return f"-> agent's reply, {short_time(reply.get('at'))}{sent}{why}: {one_line(reply.get('text'), PREVIEW)}"


@click.command()
@click.argument("text", nargs=-1)
@click.option("--urgent", is_flag=True,
              help="Make the agent due now: the next `brainstem wake` runs a session even while it sleeps, and a "
                   "running `brainstem run` wakes it within seconds.")
@click.option("--agent", metavar="NAME", help=AGENT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the message left, as one JSON object.")
@pass_ctx
def tell(c: Ctx, text: tuple[str, ...], urgent: bool, agent: str | None, as_json: bool) -> None:
    """Leave the agent a message: it sees it in its next session.

    The words of TEXT are joined with spaces; `-` reads the message from
    standard input. The next session's orient prompt shows every unread
    message, who left it and when; the agent acts on it in its plan (and may
    answer it with a reply step: `brainstem inbox` shows the reply, and one to
    a message from Telegram is sent there). Once
    that session ends, having shown it to the model, it is marked read.
    Without --urgent the agent keeps its schedule.

    \b
    Examples:
      brainstem tell "Check the wallet before spending more on research."
      brainstem tell --urgent "Stop all purchases now."
      echo "long message" | brainstem tell -
      brainstem inbox                  # what you left, and whether it was read
    """
    from brainstem.state import inbox

    body = " ".join(text)
    if body == "-":
        body = sys.stdin.read()
    if not body.strip():
        raise BadArgument('the message is empty: brainstem tell "TEXT" (or - to read it from standard input)')
    store = _agent_store(c, agent, need_soul=True)
    try:
        msg = inbox.post(store, body, sender="operator", urgent=urgent, extra={"via": "tell"})
    except inbox.InboxError as exc:
        raise BadArgument(str(exc)) from None
    if as_json:
        print_json(msg)
        return
    if urgent:
        when = ("the agent is due now: the next `brainstem wake` runs a session (under `brainstem run`, within "
                "seconds)")
    else:
        when = "the agent sees it in its next session"
    click.echo(f"message {msg['id']} left{' (urgent)' if urgent else ''}; {when}")


@click.command("inbox")
@click.option("--unread", "only_unread", is_flag=True, help="Only the messages the agent has not read yet.")
@click.option("-n", "limit", type=click.IntRange(min=1), default=20, show_default=True, metavar="N",
              help="The newest N messages (and the newest N of the agent's schedule notices among them).")
@click.option("--agent", metavar="NAME", help=AGENT_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per message: id, from, at, text, read, urgent, replies.")
@pass_ctx
def inbox_command(c: Ctx, only_unread: bool, limit: int, agent: str | None, as_json: bool) -> None:
    """The messages left for the agent, oldest first, and whether it has read each.

    A message comes from the operator (`brainstem tell`, the dashboard) or
    from Telegram. It is read once a session that showed it to the model has
    ended; a message that arrives during a session waits for the next one.
    An urgent unread message makes the agent due now. The agent's replies
    (a plan's reply step) are shown under the message they answer.

    \b
    Examples:
      brainstem inbox
      brainstem inbox --unread
      brainstem inbox --json | jq -r 'select(.read | not) | .text'
      brainstem inbox --json | jq -r '.replies[].text'    # what the agent answered
    """
    from brainstem.state import inbox

    store = _agent_store(c, agent, need_soul=False)
    found = inbox.unread(store)[-limit:] if only_unread else inbox.messages(store, limit=limit)
    if as_json:
        json_lines(found)
        return
    if not found:
        click.echo("no unread messages" if only_unread else "no messages (leave one with: brainstem tell TEXT)")
        return
    rows = [[as_text(m["id"]), short_time(m.get("at")), as_text(m.get("from")),
             "read" if m.get("read") else "UNREAD", "urgent" if m.get("urgent") is True else "",
             one_line(m.get("text"), PREVIEW)] for m in found]
    lines = table(rows, right=(0,), header=["ID", "AT", "FROM", "STATE", "", "TEXT"])
    click.echo(lines[0])
    under = " " * lines[0].index("TEXT")  # a reply reads under the text it answers
    for line, msg in zip(lines[1:], found, strict=True):
        click.echo(line)
        echo_lines(under + reply_line(r) for r in msg.get("replies") or ())
    summary = inbox.summary(store)
    if summary["unread"]:
        line = f"{summary['unread']} unread: the agent sees them in its next session"
        if summary["urgent_due"]:
            line += "; an urgent one makes it due now"
        click.echo(line)
