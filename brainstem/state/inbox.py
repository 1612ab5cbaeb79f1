"""The operator's inbox: messages left for the agent between wakes.

A message comes from the operator (``brainstem tell``, the dashboard) or from
Telegram (the owner's chat). Each is one entry of the ``inbox`` log, numbered
from a counter, so two writers at once (the CLI and the Telegram poller) never
overwrite each other. What has been read is one number, ``stats:inbox_read``:
the highest id a session has shown to the agent and then ended. So a session is
shown the oldest unread messages first (at most :data:`PROMPT_MESSAGES`, and
:data:`PROMPT_CHARS` of text): only a run of messages from the oldest unread
one can be marked read, and a message the agent was never shown never is.

An urgent message also raises ``stats:inbox_urgent``, the highest urgent id;
the agent is due while that is above both the read mark and
``stats:inbox_shown``, the highest id a session has put before the model
(whether or not the model answered). So an urgent message wakes the agent
once: a session that shows it and then fails (the LLM endpoint down) leaves it
unread for the next session, which comes on the usual schedule and backoff,
not at every tick. The sleep check reads this with one get when nothing urgent
was ever left, three when something was, and never parses the log.

A schedule whose ``notify`` is ``inbox`` leaves its result here too, as the agent (``from: agent``): a
message for the operator, which the agent wrote and so has read; no session is shown it as a message.
The runtime's own word to the operator (the LLM credit ran out, say) is such a notice too (``from: runtime``).
These notices are kept in a log of their own, ``inbox:notices``, with its own :data:`KEEP`, numbered
from the same counter and listed with the messages: the agent's schedules may leave hundreds an hour,
and in one log with the operator's messages they would trim an unread one away before any session was
shown it. The operator's log holds only what the operator (or their Telegram chat) left.

The agent answers a message with a plan's ``reply`` step (:mod:`brainstem.session.reply`). A reply is
one entry of a second log, ``inbox:replies``, naming the message it answers; :func:`messages` gives each
message its ``replies``, oldest first. Replies have the messages' limits: :data:`MAX_TEXT_CHARS` each, at
most :data:`MAX_REPLIES` to one message, the newest :data:`KEEP` kept; a reply to a message trimmed away
is no longer shown.

Every key here is runtime-owned: the agent cannot forge a message from its
operator, nor mark one read, nor write or edit a reply except through the step.
"""

from __future__ import annotations

import json
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import now_iso
from brainstem.store.base import Store
from brainstem.store.fenced import unfenced

SENDERS = ("operator", "telegram", "agent", "runtime")  # agent: a schedule's result; runtime: its own notice
FOR_OPERATOR = ("agent", "runtime")  # notices for the operator, kept apart: no session is shown them as messages
MAX_TEXT_CHARS = 4000  # what one message may hold; longer text is cut and says so
KEEP = 500  # the newest messages kept of each log (the operator's, the agent's notices); older ones are trimmed
PROMPT_MESSAGES = 20  # the most messages one session is shown (the oldest unread first)
PROMPT_CHARS = 12_000  # and the most text they may hold together (one message is always shown)
NO_MESSAGES = "no messages"
MAX_REPLIES = 10  # replies one message may have


class InboxError(ValueError):
    """A message that cannot be left (empty text, unknown sender)."""


def post(store: Store, text: str, *, sender: str = "operator", urgent: bool = False,
         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Leave a message; returns it (``id``, ``from``, ``at``, ``text``, ``urgent``)."""
    if sender not in SENDERS:
        raise InboxError(f"unknown sender {sender!r} (one of {', '.join(SENDERS)})")
    text = kept_text(text, "the message")
    store = unfenced(store)  # anyone may leave a message: the inbox is not a session's to fence
    msg_id = store.incr(keys.INBOX_COUNTER)
    message = {"id": msg_id, "from": sender, "at": now_iso(), "text": text, "urgent": bool(urgent),
               **(extra or {})}
    log = keys.INBOX_NOTICES if sender in FOR_OPERATOR else keys.INBOX  # notices never trim the operator's
    store.append(log, json.dumps(message))
    if urgent and msg_id > _number(store, keys.INBOX_URGENT):
        store.put(keys.INBOX_URGENT, str(msg_id))
    if store.log_length(log) > KEEP + 50:
        store.trim_log(log, KEEP)
    return message


def kept_text(text: Any, what: str = "the reply") -> str:
    """``text`` as the inbox keeps it: stripped, and cut at :data:`MAX_TEXT_CHARS` saying so; an empty one
    is an :class:`InboxError`."""
    if not isinstance(text, str) or not text.strip():
        raise InboxError(f"{what} is empty")
    text = text.strip()
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f" [cut: {len(text) - MAX_TEXT_CHARS} more chars]"
    return text


def reply_target(store: Store, to: Any) -> dict[str, Any]:
    """The message a reply to ``to`` (its id, a number or its digits) answers, with its replies so far;
    :class:`InboxError` saying why there is none to answer."""
    if isinstance(to, str) and to.strip().isdigit():
        to = int(to.strip())
    if not isinstance(to, int) or isinstance(to, bool) or to < 1:
        # Never quoted: the runtime joined it from the agent's pieces, and the error is recorded and shown.
        raise InboxError(f"`to` must be the id of an inbox message (a number), not {_kind(to)}")
    found = next((m for m in messages(store) if m["id"] == to), None)
    if found is None:
        raise InboxError(f"there is no message {to} in the inbox (the orient prompt names each message's id)")
    if found.get("from") in FOR_OPERATOR:
        raise InboxError(f"message {to} is the agent's own or the runtime's (a schedule's result, a notice for the "
                         "operator): only the operator's messages take a reply")
    if len(found["replies"]) >= MAX_REPLIES:
        raise InboxError(f"message {to} has {MAX_REPLIES} replies already, the most one message may have")
    return found


def _kind(value: Any) -> str:
    """What ``value`` is, in a word or two, without any of it."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a number below 1"
    return {str: "text", float: "a fraction", list: "a list", dict: "an object"}.get(type(value), "nothing")


def reply(store: Store, message: dict[str, Any], text: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keep a reply to ``message`` (as :func:`reply_target` found it); returns it (``to``, ``at``, ``text``
    and ``extra``). A session's own store: a session that lost its lease replies nothing."""
    entry = {"to": message["id"], "at": now_iso(), "text": kept_text(text), **(extra or {})}
    store.append(keys.INBOX_REPLIES, json.dumps(entry))
    if store.log_length(keys.INBOX_REPLIES) > KEEP + 50:
        store.trim_log(keys.INBOX_REPLIES, KEEP)
    return entry


def _replies(store: Store, kept: set[int]) -> list[dict[str, Any]]:
    """The kept replies to the messages ``kept``, in the order they were made, each with the ``to`` it
    answers (entries that are not a reply left out, as messages are)."""
    out = []
    for raw in store.read_log(keys.INBOX_REPLIES):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        to = entry.get("to") if isinstance(entry, dict) else None
        if isinstance(to, int) and not isinstance(to, bool) and to in kept and isinstance(entry.get("text"), str):
            out.append(entry)
    return out


def read_mark(store: Store) -> int:
    """The highest message id that has been shown to the agent in a session that ended."""
    return _number(store, keys.INBOX_READ)


def messages(store: Store, limit: int | None = None) -> list[dict[str, Any]]:
    """Every kept message, oldest first, each with ``read`` and its ``replies`` (``at``, ``text``, and the
    session, step and Telegram outcome of each); with ``limit``, the newest ``limit`` the operator left and
    the newest ``limit`` of the agent's notices, so no number of notices hides the operator's own. An entry
    that is not a message (the log is runtime-owned, but a store can be edited by hand) is left out rather
    than failing the listing."""
    mark = read_mark(store)
    start = -limit if limit else 0
    out = []
    for raw in [*store.read_log(keys.INBOX, start), *store.read_log(keys.INBOX_NOTICES, start)]:
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(msg, dict) or not isinstance(msg.get("id"), int) or not isinstance(msg.get("text"), str):
            continue
        msg["read"] = msg["id"] <= mark or msg.get("from") in FOR_OPERATOR  # for the operator, not the agent
        out.append(msg)
    out.sort(key=lambda m: m["id"])
    by_message: dict[int, list[dict[str, Any]]] = {m["id"]: [] for m in out}
    for entry in _replies(store, set(by_message)) if out else ():
        by_message[entry["to"]].append({k: v for k, v in entry.items() if k != "to"})
    for msg in out:
        msg["replies"] = by_message[msg["id"]]
    return out


def unread(store: Store) -> list[dict[str, Any]]:
    return [m for m in messages(store) if not m["read"]]


def mark_read(store: Store, up_to: int) -> None:
    """Mark every message up to id ``up_to`` read (the mark never moves back)."""
    if up_to > read_mark(store):
        store.put(keys.INBOX_READ, str(up_to))


def urgent_pending(store: Store) -> bool:
    """Whether an urgent message waits that no session has put before the model yet: the agent is due now.
    For the sleep path: one get when no urgent message was ever left, three when one was."""
    return waiting_urgent(store) > 0


def waiting_urgent(store: Store) -> int:
    """The id of the newest urgent message no session has put before the model yet, or 0."""
    urgent = _number(store, keys.INBOX_URGENT)
    if urgent <= 0 or urgent <= read_mark(store) or urgent <= _number(store, keys.INBOX_SHOWN):
        return 0
    return urgent


def note_shown(store: Store, up_to: int) -> None:
    """A session is putting the messages up to id ``up_to`` before the model: an urgent one among them no
    longer makes the agent due by itself, answered or not (they stay unread until a session that showed
    them ends with the model having answered)."""
    if up_to > _number(store, keys.INBOX_SHOWN):
        store.put(keys.INBOX_SHOWN, str(up_to))


def for_session(store: Store, limit: int = PROMPT_MESSAGES,
                max_chars: int = PROMPT_CHARS) -> tuple[list[dict[str, Any]], int]:
    """(the unread messages one session is shown, oldest first; how many more unread wait after them)."""
    waiting = unread(store)
    shown: list[dict[str, Any]] = []
    used = 0
    for msg in waiting:
        if len(shown) >= limit or (shown and used + len(msg["text"]) > max_chars):
            break
        shown.append(msg)
        used += len(msg["text"])
    return shown, len(waiting) - len(shown)


def prompt_text(shown: list[dict[str, Any]], more: int = 0) -> str:
    """The messages as the orient prompt shows them: one line each, with who sent it, how and when; the
    text sanitised and quoted, so no message can pass for another or for the runtime's own words."""
    if not shown:
        return NO_MESSAGES
    from brainstem.core.sanitize import sanitize  # noqa: PLC0415 -- the sleep path: its patterns take ms to build

    lines = [f"{len(shown)} unread message{'' if len(shown) == 1 else 's'}, oldest first:"]
    for msg in shown:
        at = sanitize(str(msg.get("at") or "an unknown time"))[:40]
        urgent = ", URGENT" if msg.get("urgent") is True else ""
        text = json.dumps(sanitize(msg["text"]), ensure_ascii=False)
        replied = len(msg.get("replies") or ())
        answered = f" (you replied to it already{'' if replied == 1 else f', {replied} times'})" if replied else ""
        lines.append(f"- message {msg['id']} {provenance(msg)}, at {at}{urgent}: {text}{answered}")
    if more:
        lines.append(f"({more} more unread message{'' if more == 1 else 's'} wait; you are shown them next session)")
    return "\n".join(lines)


def provenance(msg: dict[str, Any]) -> str:
    """Who left a message, and how, in words: for the prompt."""
    if msg.get("from") == "telegram":
        return "from your operator on Telegram (a reply step's answer reaches them there)"
    via = VIAS.get(msg.get("via")) if isinstance(msg.get("via"), str) else None
    return "from your operator" + (f" ({via})" if via else "")


# How an operator's message was left (its ``via``), in the words the prompt shows.
VIAS = {"tell": "left with brainstem tell", "dashboard": "left on the dashboard"}


def summary(store: Store) -> dict[str, Any]:
    """For ``brainstem status`` and the dashboard: how many messages are unread, whether an urgent one makes
    the agent due now, and the agent's last reply (``to``, ``at``, ``text``, ``telegram_sent``), or None."""
    kept = messages(store)
    waiting = [m for m in kept if not m["read"]]
    replies = _replies(store, {m["id"] for m in kept}) if kept else []
    last = replies[-1] if replies else None
    return {"unread": len(waiting), "urgent_unread": sum(1 for m in waiting if m.get("urgent") is True),
            "urgent_due": urgent_pending(store),
            "last_reply": None if last is None else {k: last.get(k) for k in ("to", "at", "text", "telegram_sent")}}


def _number(store: Store, key: str) -> int:
    try:
        return int(store.get(key) or 0)
    except (TypeError, ValueError):
        return 0
