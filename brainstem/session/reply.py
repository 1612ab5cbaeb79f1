"""The ``reply`` step: the agent's answer to an inbox message, kept with the message and, for a message
that came from Telegram, sent to the operator's chat.

No model is asked: the plan holds the text (``{{variables}}`` filled in, as in a tool's input). The
message must be one the operator left (not the agent's own) and the text must say something; otherwise
the step fails with the reason (which quotes ``to`` only as a message id). The runtime joined ``to`` and
the text from the plan's variables, so both are screened before anything records, keeps or sends them,
as a tool's input is: any run of a secret in them (a guess spelled in pieces, one per think step) is a
``secret_refused`` stop that holds the agent, and nothing of them is kept. Redacting them instead would
mark where a guess matched, and keep pieces shorter than a whole value.

Telegram is sent to by the runtime, as ``ctx.send_telegram`` is (a ``telegram_sent`` entry;
code never holds the token); a failed send is recorded on the reply and in karma, and the reply is kept
all the same. A dry run and a replay keep and send nothing: their ``inbox_reply`` entry says what would
have been replied (``performed: false``; a replay's send is answered from the recording, as a tool's
is), and the step's result is the same as a live one's, so a replay of an unchanged agent behaves the
same.
"""

from __future__ import annotations

from typing import Any

from brainstem.core import events
from brainstem.core.templates import to_text
from brainstem.session.build import Session
from brainstem.state import inbox, refusals
from brainstem.tools.bot_api import SEND_TIMEOUT
from brainstem.tools.operator_chat import NotSent, send
from brainstem.tools.services import refuse_assembled


class ReplyRefused(Exception):
    """The step cannot reply (no such message, the agent's own, an empty text); the message says why."""


def run_reply(session: Session, sid: str, to: Any, text: Any) -> dict[str, Any]:
    """Reply to message ``to`` with ``text`` (both as the plan's variables left them): the step's result,
    ``{"replied_to": ID, "text": TEXT}``; :class:`ReplyRefused` when it cannot."""
    deps = session.deps
    if refuse_assembled([to, text], deps.store, deps.karma.record, session.tool_policy, tool="reply", step_id=sid,
                        source="reply", what="a reply step's `to` or text", done="not kept or sent"):
        raise ReplyRefused(f"reply: stopped: secret text in its `to` or text (secret_refused); {refusals.HELD_MESSAGE}")
    try:
        message = inbox.reply_target(deps.store, to)
        text = inbox.kept_text(deps.karma.redact.text(to_text(text) if text is not None else ""))
    except inbox.InboxError as exc:
        raise ReplyRefused(f"reply: {exc}") from None
    by_telegram = message.get("from") == "telegram"
    fields: dict[str, Any] = {"step_id": sid, "to": message["id"], "from": message.get("from"), "chars": len(text),
                              "to_telegram": by_telegram, "text": text}
    result = {"replied_to": message["id"], "text": text}
    if deps.mode == "dry_run":  # what it would reply; nothing kept, nothing sent
        deps.karma.record(events.INBOX_REPLY, **fields, performed=False, mode=deps.mode, telegram_sent=None)
        return result
    # A replay's send is answered from the recording (never Telegram), so its karma reads as the original's.
    sent = _to_telegram(session, message, text) if by_telegram else {}
    live = deps.mode == "live"
    if live:
        inbox.reply(deps.store, message, text, extra={"session_id": deps.id, "step_id": sid, **sent})
    deps.karma.record(events.INBOX_REPLY, **fields, performed=live, **({} if live else {"mode": deps.mode}),
                      **(sent or {"telegram_sent": None}))
    return result


def _to_telegram(session: Session, message: dict[str, Any], text: str) -> dict[str, Any]:
    """Send the reply to the operator's chat, as the answer to their message there: what the reply keeps of
    it (``telegram_sent``, and the message id or why it was not sent)."""
    deps = session.deps
    answers = message.get("telegram_message_id")
    timeout = max(0.1, min(SEND_TIMEOUT, deps.budget.time_left()))
    try:
        out = send(session.tool_policy, text, timeout, tool="reply", record=deps.karma.record,
                   charge=lambda _kind, _size: None,  # the runtime's own send: no tool's quota
                   reply_to=answers if isinstance(answers, int) and not isinstance(answers, bool) else None)
    except NotSent as exc:
        return {"telegram_sent": False, "telegram_error": str(exc)}
    return {"telegram_sent": True, "telegram_message_id": out.get("message_id")}
