"""The messages of a chat request, and native tool calls in the OpenAI format.

A tool call travels three ways: in a provider's answer (``message.tool_calls``,
each ``{"id", "type": "function", "function": {"name", "arguments"}}``), in an
adapter's or a cassette's answer (the same, or flattened to ``{"id", "name",
"arguments"}``), and back in the next request as the assistant's message.
Inside the runtime a call is always the flat form, ``{"id", "name",
"arguments"}`` with ``arguments`` a string (the model's JSON, unparsed: a
model that writes broken JSON gets told so, it does not break the parse).

Everything a request holds is priced as prompt: the messages' text, the
calls' arguments and the tool schemas offered, so :func:`request_chars` is the
one measure of a request's size.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

MAX_TOOL_CALLS = 16  # per answer; more is a runaway model, and the rest are dropped (and said so)
MAX_ARGUMENT_CHARS = 100_000  # one call's arguments; beyond it they are not JSON the tool will get


def parse_tool_calls(raw: Any) -> list[dict[str, str]]:
    """The flat calls in ``raw`` (a provider's ``tool_calls``); entries that are not calls are dropped.

    A call without an id gets one (``call_N``), so the answer can name it; arguments given as an
    object (some adapters parse them) are encoded back to JSON text.
    """
    if not isinstance(raw, list):
        return []
    out: list[dict[str, str]] = []
    for i, entry in enumerate(raw[:MAX_TOOL_CALLS]):
        if not isinstance(entry, dict):
            continue
        fn = entry.get("function") if isinstance(entry.get("function"), dict) else entry
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        args = fn.get("arguments")
        if args is None:
            args = "{}"
        elif not isinstance(args, str):
            try:
                args = json.dumps(args)
            except (TypeError, ValueError):
                args = str(args)
        call_id = entry.get("id")
        out.append({"id": call_id if isinstance(call_id, str) and call_id else f"call_{i}",
                    "name": name[:200], "arguments": args[:MAX_ARGUMENT_CHARS]})
    return out


def assistant_message(content: str, calls: list[dict[str, str]]) -> dict[str, Any]:
    """The assistant's turn as the next request repeats it: its text and the calls it made."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return message


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def message_chars(message: dict[str, Any]) -> int:
    """What one message adds to a prompt: its text, and the arguments of any calls in it."""
    n = content_chars(message.get("content"))
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            n += len(str(fn.get("name") or "")) + len(str(fn.get("arguments") or ""))
    return n


def content_chars(content: Any) -> int:
    """A content's characters as prompt: a text part's text (a cache marker on it is not prompt), any other
    part as its JSON."""
    if isinstance(content, str):
        return len(content)
    if content is None:
        return 0
    if isinstance(content, list):
        return sum(len(p["text"]) if _is_text(p) else len(json.dumps(p)) for p in content)
    return len(json.dumps(content))


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def text_of(content: Any) -> str:
    """A message's text: the string, or its text parts joined (a message marked for caching is in parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if _is_text(p))
    return ""


def request_chars(request: dict[str, Any]) -> int:
    """Every character the provider reads as prompt: the messages, and the tools offered."""
    n = sum(message_chars(m) for m in request.get("messages") or ())
    if request.get("tools"):
        n += len(json.dumps(request["tools"]))
    return n


# What a message may hold besides its content, all of it text the host reads as prompt. A key outside this
# list may be a way to send what a host bills apart from tokens (Ollama's "images", an "audio" turn).
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal",
                          "reasoning", "reasoning_details", "prefix"})


def non_text_parts(request: Any) -> Counter[str]:
    """The content parts of a request's messages that are not text, by type: what a host bills apart from
    tokens (images, audio, files). A part is text only when it is an object whose ``type`` is ``"text"``;
    anything else in a message's content (another type, no type, not an object) counts, whatever the role."""
    found: Counter[str] = Counter()
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else [content] if isinstance(content, dict) else []
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                found[kind if isinstance(kind, str) else "untyped"] += 1
    return found


def unknown_message_keys(request: Any) -> list[str]:
    """Keys of a request's messages outside :data:`MESSAGE_KEYS` (a message that is not an object: ``"?"``)."""
    messages = request.get("messages") if isinstance(request, dict) else None
    found: set[str] = set()
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict):
            found.update(str(k) for k in message if k not in MESSAGE_KEYS)
        else:
            found.add("?")
    return sorted(found)


def last_text(request: dict[str, Any]) -> str:
    """The last message's text (what a cassette's ``expect`` is checked against)."""
    messages = request.get("messages") or []
    return text_of(messages[-1].get("content")) if messages else ""
