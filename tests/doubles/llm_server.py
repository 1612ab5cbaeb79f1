"""An OpenAI-compatible (OpenRouter-shaped) chat server on loopback, for tests.

Stdlib only. It runs in a daemon thread of the test process, so a test can
point an in-process client *or* a ``brainstem`` subprocess at ``.base_url``
(``OPENROUTER_BASE_URL``)::

    with LLMDouble() as llm:
        llm.queue('{"steps": []}', {"status": 429, "headers": {"Retry-After": "1"}}, "hello")
        llm.responder = lambda req: "fallback answer"   # used when the queue is empty
        ...
        assert llm.requests[0]["model"] == "x"

A reply is either a ``str`` (the assistant content, finish_reason "stop") or a
dict with any of:

``content``        assistant content (str, list of content parts, or None)
``status``         HTTP status (default 200); non-200 sends
                   ``{"error": {"message": ..., "code": status}}`` unless ``body``
``message``        the error message for a non-200 reply (default names the status)
``body``           bytes/str sent verbatim (malformed bodies), or a dict/list sent as JSON
``headers``        extra response headers, e.g. ``{"Retry-After": "1"}``
``delay``          seconds to sleep before answering (interrupted by ``stop()``)
``finish_reason``  default "stop"
``usage``          replaces the computed usage object entirely
``cost``           put in ``usage.cost`` (omitted by default, or ``.default_cost``); with
                   ``.part_cost`` set, every content part that is not text (:func:`billed_parts`)
                   adds that much to it, as a host billing images, audio and files apart does
``reasoning_tokens`` put in ``usage.completion_tokens_details.reasoning_tokens``
``reasoning``      put in ``message.reasoning``
``model``          the model the answer claims (default: the requested one)
``tool_calls``     native tool calls: a list of ``{"name", "arguments", "id"?}`` (arguments
                   a dict, sent JSON-encoded, or a str sent as it is); finish_reason
                   becomes "tool_calls" and content defaults to None

With ``.cache_billing`` set (``{model: (input, output)}`` USD per million tokens), a request for
one of those models is billed as Anthropic bills prompt caching: the prefix up to each content
part marked ``cache_control`` is kept for five minutes (``"ttl": "1h"``: an hour; each hit
refreshes it) once it holds ``.cache_min_tokens`` (a number, or one by model); a later request that starts with a kept
prefix (looking back at most 20 blocks from a marker, tools and ``tool_choice`` included) reads
it at a tenth of the input price, and the tokens from there to its last marker are written at
1.25 times it (twice for an hour). The usage reports ``prompt_tokens`` (all of them),
``prompt_tokens_details.cached_tokens`` and ``cache_write_tokens``, and the ``cost``.
``.advance(seconds)`` moves the double's clock on, so a cache entry can expire in a test.

When the queue is empty ``.responder(request_json)`` is asked for a reply; if
there is none the server answers HTTP 500 saying the script ran out.

``GET {base}/key`` answers ``{"data": {"limit_remaining": .credit, "usage":
.key_usage, "limit": .key_limit}}`` (or an error with ``.key_status``), and
``GET {base}/credits`` answers ``{"data": {"total_credits": .total_credits,
"total_usage": .total_usage}}`` (or ``.credits_status``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from .loopback import LoopbackDouble, QuietServer, send

API_PREFIX = "/api/v1"


def _messages_text(request: Any) -> str:
    out: list[str] = []
    msgs = request.get("messages") if isinstance(request, dict) else None
    for m in msgs if isinstance(msgs, list) else []:
        c = m.get("content") if isinstance(m, dict) else m
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            for p in c:
                if isinstance(p, dict) and isinstance(p.get("text"), str):
                    out.append(p["text"])
                elif isinstance(p, str):
                    out.append(p)
    return "\n".join(out)


def billed_parts(request: Any) -> int:
    """The content parts a host bills apart from tokens: everything in a message's content (any role) that
    is not an object of type "text", and anything in a message's ``images`` (Ollama's way of sending them)."""
    n = 0
    msgs = request.get("messages") if isinstance(request, dict) else None
    for m in msgs if isinstance(msgs, list) else []:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        parts = c if isinstance(c, list) else [c] if isinstance(c, dict) else []
        n += sum(1 for p in parts if not (isinstance(p, dict) and p.get("type") == "text"))
        n += len(m["images"]) if isinstance(m.get("images"), list) else 0
    return n


def _content_len(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) if isinstance(p, dict) else len(str(p)) for p in content)
    return 0



CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = {"5m": 1.25, "1h": 2.0}
CACHE_TTL_S = {"5m": 300.0, "1h": 3600.0}
CACHE_LOOKBACK_BLOCKS = 20


def _blocks(request: dict) -> list[tuple[str, str | None, str | None]]:
    """(what the block is, its text as the prompt's token count sees it or None, the lifetime its marker asks
    or None) for each block of the prompt, in the provider's order: the tools (with tool_choice) first, then
    every content part of every message."""
    out: list[tuple[str, str | None, str | None]] = [
        (json.dumps([request.get("tools"), request.get("tool_choice")], sort_keys=True), None, None)]
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        parts = c if isinstance(c, list) else [c]
        head = json.dumps([m.get("role"), m.get("tool_call_id"), m.get("tool_calls")], sort_keys=True)
        for i, p in enumerate(parts):
            text = p.get("text") if isinstance(p, dict) else p
            text = text if isinstance(text, str) else None
            mark = p.get("cache_control") if isinstance(p, dict) else None
            ttl = (mark.get("ttl") or "5m") if isinstance(mark, dict) else None
            out.append(((head if i == 0 else "") + json.dumps(text), text, ttl))
    return out


class _Handler(BaseHTTPRequestHandler):
    server: QuietServer
    server_version = "LLMDouble/1.0"

    def log_message(self, format, *args):  # noqa: A002 - keep test output clean
        pass

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        send(self, status, body, headers)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), headers)

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    # ------------------------------------------------------------------ verbs

    def do_GET(self) -> None:  # noqa: N802
        d = self.server.double
        path = self._path()
        d._record_get(path, dict(self.headers.items()))
        if path == f"{API_PREFIX}/key":
            if d.key_status != 200:
                self._json(d.key_status,
                           {"error": {"message": f"double: key status {d.key_status}", "code": d.key_status}})
                return
            self._json(200, {"data": {"label": "llm-double", "limit": d.key_limit, "usage": d.key_usage,
                                      "limit_remaining": d.credit, "is_free_tier": False}})
        elif path == f"{API_PREFIX}/credits":
            if d.credits_status != 200:
                self._json(d.credits_status, {"error": {"message": f"double: credits status {d.credits_status}",
                                                        "code": d.credits_status}})
                return
            self._json(200, {"data": {"total_credits": d.total_credits, "total_usage": d.total_usage}})
        elif path == f"{API_PREFIX}/models":
            self._json(200, {"data": [{"id": "double/model"}]})
        else:
            self._json(404, {"error": {"message": f"double: no route GET {path}", "code": 404}})

    def do_POST(self) -> None:  # noqa: N802
        d = self.server.double
        path = self._path()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        raw = self.rfile.read(length) if length > 0 else b""
        if path != f"{API_PREFIX}/chat/completions":
            self._json(404, {"error": {"message": f"double: no route POST {path}", "code": 404}})
            return
        try:
            req = json.loads(raw.decode("utf-8")) if raw else None
        except (ValueError, UnicodeDecodeError):
            req = None
        d._record_post(req, dict(self.headers.items()))
        if not isinstance(req, dict):
            self._json(400, {"error": {"message": "double: request body is not a JSON object", "code": 400}})
            return
        try:
            reply = d._next_reply(req)
        except Exception as e:  # a responder that raises is a server error, loudly named
            self._json(500, {"error": {"message": f"double: responder raised {type(e).__name__}: {e}", "code": 500}})
            return
        if reply is None:
            self._json(500, {"error": {"message": "double: script ran out (queue empty and no responder)",
                                       "code": 500}})
            return
        self._answer(req, reply)

    def _answer(self, req: dict, reply: Any) -> None:
        d = self.server.double
        if isinstance(reply, str):
            reply = {"content": reply}
        if not isinstance(reply, dict):
            self._json(500, {"error": {"message": f"double: bad scripted reply {type(reply).__name__}", "code": 500}})
            return
        delay = float(reply.get("delay") or 0)
        if delay > 0 and d._stopping.wait(delay):
            return  # stopping: drop the connection
        status = int(reply.get("status", 200))
        headers = dict(reply.get("headers") or {})
        if "body" in reply:
            body = reply["body"]
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            if isinstance(body, str):
                body = body.encode("utf-8")
            self._send(status, body, headers)
            return
        if status != 200:
            msg = reply.get("message") or reply.get("content") or f"double: scripted HTTP {status}"
            self._json(status, {"error": {"message": msg, "code": status}}, headers)
            return
        calls = reply.get("tool_calls")
        content = reply.get("content", None if calls else "")
        if "usage" in reply:
            usage = reply["usage"]
        else:
            completion = _content_len(content) // 4 + 1
            usage = {
                "prompt_tokens": len(_messages_text(req)) // 4,
                "completion_tokens": completion,
                "total_tokens": len(_messages_text(req)) // 4 + completion,
            }
            if "reasoning_tokens" in reply:
                usage["completion_tokens_details"] = {"reasoning_tokens": reply["reasoning_tokens"]}
            cost = reply.get("cost", d.default_cost)
            prices = (d.cache_billing or {}).get(req.get("model"))
            if prices is not None:
                usage.update(d._bill_cached(req, usage["prompt_tokens"], completion, prices))
                cost = usage.pop("cost")
            if d.part_cost is not None:
                cost = (cost or 0.0) + billed_parts(req) * d.part_cost
            if cost is not None:
                usage["cost"] = cost
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": c.get("id") or f"call_{d._next_id()}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c.get("arguments"), str)
                              else json.dumps(c.get("arguments", {}))}} for c in calls]
        if "reasoning" in reply:
            message["reasoning"] = reply["reasoning"]
        body = {
            "id": f"gen-double-{d._next_id()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.get("model") or req.get("model") or "double/model",
            "provider": "LLMDouble",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": reply.get("finish_reason", "tool_calls" if calls else "stop")}],
            "usage": usage,
        }
        self._json(200, body, headers)


class LLMDouble(LoopbackDouble):
    """A scripted OpenAI-compatible server on 127.0.0.1 (see the module docstring)."""

    handler = _Handler

    def __init__(self, *replies: Any, responder: Callable[[dict], Any] | None = None) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._queue: list[Any] = list(replies)
        self.responder: Callable[[dict], Any] | None = responder
        self._requests: list[Any] = []
        self._request_headers: list[dict[str, str]] = []
        self._gets: list[tuple[str, dict[str, str]]] = []
        self._ids = 0
        # /key and /credits
        self.credit: float | None = 10.0
        self.key_usage: float = 2.5
        self.key_limit: float | None = 12.5
        self.key_status: int = 200
        self.total_credits: float = 25.0
        self.total_usage: float = 5.0
        self.credits_status: int = 200
        self.default_cost: float | None = None
        self.part_cost: float | None = None  # USD billed for each content part that is not text
        self.cache_billing: dict[str, tuple[float, float]] | None = None  # see the module docstring
        self.cache_min_tokens: int | dict[str, int] = 1024  # or by model: the shortest prefix kept
        self._cache: dict[str, float] = {}  # prefix key -> when it expires (the double's clock)
        self._cache_ttl: dict[str, str] = {}
        self._clock_offset = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API_PREFIX}"

    # ------------------------------------------------------------------ scripting

    def queue(self, *replies: Any) -> LLMDouble:
        with self._lock:
            self._queue.extend(replies)
        return self

    @property
    def pending(self) -> int:
        """Scripted replies not yet consumed."""
        with self._lock:
            return len(self._queue)

    def _next_reply(self, req: dict) -> Any:
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
            responder = self.responder
        return responder(req) if responder is not None else None

    def advance(self, seconds: float) -> None:
        """Move the double's clock on (cache entries expire by it)."""
        with self._lock:
            self._clock_offset += seconds

    def _bill_cached(self, req: dict, prompt_tokens: int, completion: int, prices: tuple[float, float]) -> dict:
        """The usage fields and cost of ``req`` billed as Anthropic bills prompt caching (module docstring)."""
        blocks = _blocks(req)
        with self._lock:
            now = time.monotonic() + self._clock_offset
            keys: list[str] = []
            tokens: list[int] = []
            key, chars, entries = "", 0, 0
            for ident, text, _ in blocks:
                key = hashlib.sha256(f"{key}\x00{ident}".encode()).hexdigest()
                if text is not None:  # counted as the prompt's tokens are: texts joined by newlines
                    chars, entries = chars + len(text), entries + 1
                keys.append(key)
                tokens.append((chars + max(0, entries - 1)) // 4)
            marks = [i for i, (_, _, ttl) in enumerate(blocks) if ttl is not None]
            read = 0
            for b in marks:  # the longest kept prefix within the look-back of a marker
                for i in range(b, max(-1, b - CACHE_LOOKBACK_BLOCKS - 1), -1):
                    k = keys[i]
                    if self._cache.get(k, -1.0) > now:
                        self._cache[k] = now + CACHE_TTL_S[self._cache_ttl[k]]  # a hit refreshes it
                        read = max(read, tokens[i])
                        break
            written, factor = 0, 0.0
            for b in marks:
                ttl = blocks[b][2] if blocks[b][2] in CACHE_TTL_S else "5m"
                least = self.cache_min_tokens
                least = least.get(req.get("model"), 1024) if isinstance(least, dict) else least
                if tokens[b] < least:
                    continue
                if self._cache.get(keys[b], -1.0) <= now:
                    self._cache[keys[b]], self._cache_ttl[keys[b]] = now + CACHE_TTL_S[ttl], ttl
                written = max(written, tokens[b] - read)
                factor = max(factor, CACHE_WRITE_FACTOR[ttl])
        read, written = min(read, prompt_tokens), max(0, min(written, prompt_tokens - read))
        uncached = prompt_tokens - read - written
        p_in, p_out = prices
        cost = (uncached * p_in + read * p_in * CACHE_READ_FACTOR + written * p_in * factor
                + completion * p_out) / 1e6
        return {"prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
                "cost": round(cost, 12)}

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    # ------------------------------------------------------------------ recording

    def _record_post(self, req: Any, headers: dict[str, str]) -> None:
        with self._lock:
            self._requests.append(req)
            self._request_headers.append(headers)

    def _record_get(self, path: str, headers: dict[str, str]) -> None:
        with self._lock:
            self._gets.append((path, headers))

    @property
    def requests(self) -> list[Any]:
        """Chat request bodies received so far (a snapshot; None for a body that was not JSON)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers of each chat request, parallel to ``.requests``."""
        with self._lock:
            return [dict(h) for h in self._request_headers]

    @property
    def get_requests(self) -> list[tuple[str, dict[str, str]]]:
        """(path, headers) of each GET received (``/api/v1/key``, ``/api/v1/credits``...)."""
        with self._lock:
            return list(self._gets)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at least ``n`` chat requests arrived (for subprocess tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._requests) >= n:
                    return True
            time.sleep(0.01)
        return False

    def reset(self) -> None:
        """Forget requests and scripted replies (settings such as ``.credit`` stay)."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._request_headers.clear()
            self._gets.clear()
