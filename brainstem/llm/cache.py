"""Prompt caching: where a request carries the provider's cache markers, and what the answer says was cached.

A provider that caches prompts (Anthropic's models, through OpenRouter or
LiteLLM) keeps the prefix of a request up to a content part marked
``cache_control: {"type": "ephemeral"}`` (``"ttl": "1h"`` for an hour instead
of five minutes, refreshed by every hit). A later request that starts with the
same bytes reads it at a tenth of the input price; writing it costs a quarter
more than input (double for an hour). So a marker pays only when the prefix
is sent again within the cache's lifetime, often enough to earn back the
write: :func:`ttl_that_pays` decides, from the model's prices in
``config:models`` and when the caller expects to send the prefix again
(:class:`Reuse`). A model without cache prices is never marked, and a request
with no marker is sent exactly as before, its contents plain strings.

The usage a server reports counts cached and written tokens in
``prompt_tokens_details`` (``cached_tokens``, ``cache_write_tokens``: OpenRouter,
OpenAI) or at the top level (``cache_read_input_tokens``,
``cache_creation_input_tokens``: Anthropic's names, passed on by LiteLLM);
:func:`cache_tokens` reads either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from brainstem.core.json_numbers import count
from brainstem.state.config import CachePrices

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
MAX_MARKERS = 4  # Anthropic honours at most four breakpoints in a request


@dataclass(frozen=True)
class Reuse:
    """When the caller expects to send a prefix again: first in about ``after_s`` seconds, then ``times``
    times in all, each within a cache lifetime of the one before (every hit refreshes the entry)."""

    after_s: float
    times: int = 1


def ttl_that_pays(prices: CachePrices | None, reuse: Reuse | None) -> str | None:
    """The cache lifetime whose marker saves money on this prefix, None when none does.

    Marking costs ``write - input`` per token once (when the prefix is not cached yet); each reuse within
    the lifetime saves ``input - read`` per token. A lifetime pays when the expected reuse comes within it
    and ``times`` reuses save more than the write costs; of those that pay, the one that saves most."""
    if prices is None or reuse is None or reuse.times < 1:
        return None
    best, best_net = None, 0.0
    for ttl, write in prices.write.items():
        if ttl not in TTL_SECONDS or reuse.after_s > TTL_SECONDS[ttl]:
            continue
        net = reuse.times * (prices.input - prices.read) - (write - prices.input)
        if net > best_net:
            best, best_net = ttl, net
    return best


def marker(ttl: str) -> dict[str, str]:
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def as_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as a list of content parts (a string is one text part)."""
    if isinstance(content, list):
        return [dict(p) if isinstance(p, dict) else {"type": "text", "text": str(p)} for p in content]
    return [{"type": "text", "text": content if isinstance(content, str) else ""}]


PARTED_ROLES = ("user", "tool")  # the messages a marker may go on (an assistant's may be empty, or only calls)


def mark(messages: list[dict[str, Any]], at: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """``messages`` with a cache marker on each part named in ``at`` ((message, part) -> lifetime).

    With any marker, every user and tool message's text is sent as parts, marked or not: the same bytes,
    save the markers, in every request that repeats it, whichever of its messages carry a marker this time."""
    if not at:
        return list(messages)
    out = [{**m, "content": as_parts(m["content"])}
           if m.get("role") in PARTED_ROLES and isinstance(m.get("content"), str) and m["content"] else m
           for m in messages]
    for i in sorted({i for i, _ in at}):
        parts = as_parts(out[i].get("content"))
        for (mi, pi), ttl in at.items():
            if mi == i and 0 <= pi < len(parts):
                parts[pi]["cache_control"] = marker(ttl)
        out[i] = {**out[i], "content": parts}
    return out


def unmarked(value: Any) -> Any:
    """``value`` (a request, its messages) with every cache marker taken out: what the prefix is, byte for byte."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def plain_content(content: Any) -> Any:
    """A message's content with its cache markers out, and text parts alone joined back into the string
    they were cut from: the same content, marked or not."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return unmarked(content)


def marked_ttls(request: Any) -> set[str]:
    """The lifetimes of the cache markers anywhere in ``request`` (an unknown one counts as ``1h``, the dearest)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k == "cache_control":
                    ttl = v.get("ttl", "5m") if isinstance(v, dict) else "1h"
                    found.add(ttl if ttl in TTL_SECONDS else "1h")
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(request)
    return found


def dearest_write(prices: CachePrices | None, ttls: set[str]) -> float | None:
    """The price per Mtok of writing with the dearest of ``ttls``; None when the model has no such price."""
    if not ttls:
        return 0.0
    if prices is None or any(t not in prices.write for t in ttls):
        return None
    return max(prices.write[t] for t in ttls)


def cache_tokens(usage: Any) -> tuple[int, int]:
    """(tokens read from the cache, tokens written to it) as a server's ``usage`` reports them."""
    if not isinstance(usage, dict):
        return 0, 0
    if "cached_tokens" in usage or "cache_write_tokens" in usage:  # as the client parsed it
        return count(usage.get("cached_tokens")) or 0, count(usage.get("cache_write_tokens")) or 0
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    read = count(details.get("cached_tokens")) or count(usage.get("cache_read_input_tokens")) or 0
    written = (count(details.get("cache_write_tokens")) or count(details.get("cache_creation_tokens"))
               or count(usage.get("cache_creation_input_tokens")) or 0)
    return read, written


def prompt_split(prompt_tokens: int, read: int, written: int) -> tuple[int, int, int]:
    """(uncached, read, written) prompt tokens. OpenRouter and OpenAI count cached and written tokens inside
    ``prompt_tokens``; Anthropic's own usage counts them apart. A report whose cache counts exceed its
    prompt tokens is read the second way, so the prompt is never taken for smaller than reported."""
    if read + written <= prompt_tokens:
        return prompt_tokens - read - written, read, written
    return prompt_tokens, read, written


def prefix_key(model: str, tools: Any, messages: list[dict[str, Any]]) -> str:
    """What a cached prefix is: the model, the tools offered and the messages, markers taken out."""
    plain = [{**m, "content": plain_content(m.get("content"))} if isinstance(m, dict) else m for m in messages]
    return json.dumps([model, unmarked(tools), plain], sort_keys=True, ensure_ascii=False)
