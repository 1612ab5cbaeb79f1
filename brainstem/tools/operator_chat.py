"""``ctx.send_telegram(text)``: code asks, the runtime sends to the operator's chat.

The bot token could read the operator's messages before the poller does, or
redirect them for good (``getUpdates``, ``setWebhook``, however the method is
spelled), so no code ever holds it, not even as a placeholder. What code is
given instead is the one act it needs: a text to the operator's chat
(``BRAINSTEM_TELEGRAM_CHAT_ID``), sent from this process with the token. The
text has already passed the scrubber with the rest of the request (see
:func:`brainstem.sandbox.ctx.answer`); the send is a ``telegram_sent`` karma
entry and counts against the write quotas as that entry. A dry run or a manual
tool never runs the code that would ask, and a replay answers from the
recording: it never reaches Telegram.

What code is told of a failure is fixed text by kind, never the HTTP stack's
or Telegram's words (those, redacted, are in the karma entry).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from brainstem.core import events
from brainstem.tools.bot_api import PollError, send_message
from brainstem.tools.policy import ToolPolicy

MAX_TEXT_CHARS = 4096  # Telegram's limit for one message
RECORD_MIN_BYTES = 200  # what the karma entry costs besides the text, counted against the write quotas
NOT_CONFIGURED = "telegram: not configured: set BRAINSTEM_TELEGRAM_BOT_TOKEN and BRAINSTEM_TELEGRAM_CHAT_ID"


class NotSent(Exception):
    """The text was not sent; the message is what the code is told (one line, fixed by kind)."""


def send(policy: ToolPolicy, text: str, timeout: float, *, tool: str, record: Callable[..., Any],
         charge: Callable[[str, int], None], reply_to: int | None = None) -> dict:
    """Send ``text`` for ``tool`` (``reply_to``: as the answer to that Telegram message):
    ``{"message_id": ...}``; :class:`NotSent` (or ``charge``'s stop) if not."""
    if not text.strip():
        raise NotSent("telegram: the text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise NotSent(f"telegram: the text is longer than {MAX_TEXT_CHARS} characters (Telegram's limit)")
    config = policy.telegram
    # A replay's send is answered as the original one was, whether Telegram is set up now or not.
    if config is None and (policy.fetch_replay is None or not policy.fetch_replay.sent(tool)):
        raise NotSent(NOT_CONFIGURED)
    size = len(text.encode("utf-8", "surrogatepass"))
    charge("telegram", RECORD_MIN_BYTES + size)  # no message goes out once the quota is spent
    fields = {"tool": tool, "chat_id": config.chat_id if config else None, "chars": len(text), "bytes": size,
              "text": text[:MAX_TEXT_CHARS]}
    t0 = time.monotonic()
    if policy.fetch_replay is not None:  # a replay: what the original session was answered, never Telegram
        message_id = policy.fetch_replay.telegram(tool)
        record(events.TELEGRAM_SENT, **fields, message_id=message_id, replayed=True, duration_ms=0)
        return {"message_id": message_id}
    try:
        message_id = send_message(config, text, timeout, reply_to=reply_to)
    except PollError as exc:  # the code is told `error`; `detail` (redacted) is for the operator
        told = _told(exc)
        record(events.TELEGRAM_SENT, **fields, error=told, detail=str(exc),
               duration_ms=int((time.monotonic() - t0) * 1000))
        raise NotSent(told) from None
    record(events.TELEGRAM_SENT, **fields, message_id=message_id, duration_ms=int((time.monotonic() - t0) * 1000))
    return {"message_id": message_id}


def _told(exc: PollError) -> str:
    """What the code is told of a failed send: by kind, in the runtime's words only."""
    status = exc.status
    if status is None:
        return "telegram: not sent: no answer from the Bot API (network error or timeout)"
    if status in (401, 404):
        return "telegram: not sent: Telegram refused the bot token; the operator should check it"
    if status == 429:
        return "telegram: not sent: Telegram asked to slow down (HTTP 429)"
    if status == 200:
        return "telegram: not sent: Telegram's answer was not the Bot API's ok"
    return f"telegram: not sent: Telegram answered HTTP {status}"
