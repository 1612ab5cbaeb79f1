"""A Telegram Bot API on loopback, for tests: ``getUpdates`` (long polling) and ``sendMessage``.

Stdlib only, in a daemon thread of the test process, so an in-process poller or a ``brainstem run``
subprocess can be pointed at ``.base_url`` (``BRAINSTEM_TELEGRAM_API_URL``)::

    with TelegramDouble(token="123:abc") as tg:
        tg.text(42, "hello")                 # an update from chat 42
        tg.fail({"status": 500})             # the next getUpdates answers 500
        ...
        assert tg.sent == [{"chat_id": 42, "text": "hi"}]   # with "reply_to" when it answers a message
        tg.fail_sends({"status": 502})       # the next sendMessage answers 502

``getUpdates`` (GET with a query, or POST with a JSON or form body) honours ``offset`` as Telegram
does: updates below it are confirmed and forgotten, the rest (up to ``limit``) are handed over; with
none pending it holds the request up to ``timeout`` seconds (at most ``.max_hold``), answering as
soon as one arrives. A scripted failure (:meth:`fail`) is a dict of ``status`` (default 200),
``retry_after`` (a 429's ``parameters.retry_after``), ``description``, ``body`` (bytes, str or JSON
sent verbatim: malformed answers) and ``headers``; each answers one getUpdates. A request with another
token is answered 401, as Telegram answers it. Every request is kept (``.requests``), with its ``raw``
text (path, headers and body) to search for what it should not carry.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

from .loopback import LoopbackDouble, QuietServer, send


class _Handler(BaseHTTPRequestHandler):
    server: QuietServer
    server_version = "TelegramDouble/1.0"

    def log_message(self, format, *args):  # noqa: A002 - keep test output clean
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        send(self, status, body.encode("utf-8") if isinstance(body, str) else body, headers)

    def _params(self, raw: bytes) -> dict[str, Any]:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        params: dict[str, Any] = dict(query)
        if raw:
            ctype = self.headers.get("Content-Type") or ""
            if "json" in ctype:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                if isinstance(body, dict):
                    params.update(body)
            else:
                params.update(dict(urllib.parse.parse_qsl(raw.decode("utf-8", "replace"))))
        return params

    def _route(self) -> None:
        d: TelegramDouble = self.server.double
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        params = self._params(raw)
        parts = path.strip("/").split("/")
        seen = self.path + "\n" + str(self.headers) + raw.decode("latin-1")
        if len(parts) != 2 or not parts[0].startswith("bot"):
            d._record(self.command, "", "", params, seen)
            self._send(404, {"ok": False, "error_code": 404, "description": "Not Found"})
            return
        token, method = parts[0][3:], parts[1]
        d._record(self.command, method, token, params, seen)
        if token != d.token:
            self._send(401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
            return
        if method.lower() == "getupdates":
            self._get_updates(d, params)
        elif method.lower() == "sendmessage":
            chat, text = params.get("chat_id"), params.get("text")
            if chat in (None, "") or not text:
                self._send(400, {"ok": False, "error_code": 400, "description": "Bad Request: chat_id and text"})
                return
            with d._lock:
                failure = d._send_failures.pop(0) if d._send_failures else None
            if failure is not None:
                self._fail(failure)
                return
            sent = {"chat_id": chat, "text": text}
            answers = params.get("reply_parameters")
            if isinstance(answers, dict):  # shown in the chat as the answer to that message
                sent["reply_to"] = answers.get("message_id")
            with d._lock:
                d._sent.append(sent)
                message_id = len(d._sent) + 1000
            self._send(200, {"ok": True, "result": {"message_id": message_id, "chat": {"id": chat}, "text": text}})
        else:
            self._send(404, {"ok": False, "error_code": 404, "description": "Not Found: method not found"})

    do_GET = _route  # noqa: N815
    do_POST = _route  # noqa: N815

    def _get_updates(self, d: TelegramDouble, params: dict[str, Any]) -> None:
        with d._lock:
            failure = d._failures.pop(0) if d._failures else None
        if failure is not None:
            self._fail(failure)
            return
        try:
            offset = int(params.get("offset")) if params.get("offset") not in (None, "") else None
            timeout = float(params.get("timeout") or 0)
            limit = int(params.get("limit") or 100)
        except (TypeError, ValueError):
            self._send(400, {"ok": False, "error_code": 400, "description": "Bad Request: bad parameters"})
            return
        allowed = params.get("allowed_updates")
        if isinstance(allowed, str):
            try:
                allowed = json.loads(allowed)
            except ValueError:
                allowed = None
        deadline = time.monotonic() + min(timeout, d.max_hold)
        with d._changed:
            if offset is not None:
                d._confirmed = max(d._confirmed, offset)
                d._pending = [u for u in d._pending if u["update_id"] >= offset]
            d._polls.append({"offset": offset, "timeout": timeout, "allowed_updates": allowed})
            d._changed.notify_all()
            while not d._pending and not d._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                d._changed.wait(min(left, 0.05))
            updates = [u for u in d._pending if not isinstance(allowed, list) or
                       any(k in allowed for k in u if k != "update_id")][:limit]
        if d._stopping.is_set():
            return
        self._send(200, {"ok": True, "result": updates})

    def _fail(self, f: dict[str, Any]) -> None:
        status = int(f.get("status", 200))
        if "body" in f:
            self._send(status, f["body"], f.get("headers"))
            return
        body: dict[str, Any] = {"ok": False, "error_code": status,
                                "description": f.get("description") or f"double: scripted {status}"}
        if "retry_after" in f:
            body["parameters"] = {"retry_after": f["retry_after"]}
        self._send(status, body, f.get("headers"))


class TelegramDouble(LoopbackDouble):
    """A scripted Bot API on 127.0.0.1 (see the module docstring)."""

    handler = _Handler

    def __init__(self, token: str = "123456:TEST-telegram-token-never-leak", host: str = "127.0.0.1",
                 max_hold: float = 1.0) -> None:
        super().__init__()
        self.token = token
        self.host = host
        self.max_hold = max_hold  # the longest a getUpdates is held with nothing to hand over
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pending: list[dict[str, Any]] = []
        self._next_id = 700_000
        self._confirmed = 0
        self._failures: list[dict[str, Any]] = []
        self._requests: list[dict[str, Any]] = []
        self._polls: list[dict[str, Any]] = []
        self._sent: list[dict[str, Any]] = []
        self._send_failures: list[dict[str, Any]] = []

    def start(self):
        if self._server is not None:
            return self
        self._stopping.clear()
        server = QuietServer((self.host, 0), self.handler)
        server.double = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                                        name="TelegramDouble", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        super().stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- scripting ---

    def update(self, **fields: Any) -> int:
        """Queue an update with these fields (``message=...``, ``edited_message=...``); its update_id."""
        with self._changed:
            self._next_id += 1
            self._pending.append({"update_id": self._next_id, **fields})
            self._changed.notify_all()
            return self._next_id

    def text(self, chat_id: int, text: str, **message: Any) -> int:
        """Queue a text message from ``chat_id``; its update_id."""
        return self.update(message={"message_id": self._next_id % 10_000 + 1, "date": int(time.time()),
                                    "chat": {"id": chat_id, "type": "private"}, "from": {"id": chat_id},
                                    "text": text, **message})

    def fail(self, *failures: dict[str, Any]) -> None:
        """The next getUpdates answer these, one each, before any update is handed over."""
        with self._lock:
            self._failures.extend(failures)

    def fail_sends(self, *failures: dict[str, Any]) -> None:
        """The next sendMessage answer these (as :meth:`fail` scripts them), one each."""
        with self._lock:
            self._send_failures.extend(failures)

    # --- what happened ---

    def _record(self, verb: str, method: str, token: str, params: dict[str, Any], raw: str) -> None:
        with self._lock:
            self._requests.append({"verb": verb, "method": method, "token_ok": token == self.token,
                                   "params": params, "raw": raw, "t": time.monotonic()})

    @property
    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._requests)

    @property
    def polls(self) -> list[dict[str, Any]]:
        """Each getUpdates that was answered normally: its offset, timeout and allowed_updates."""
        with self._lock:
            return list(self._polls)

    @property
    def sent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._sent)

    @property
    def confirmed(self) -> int:
        """The highest offset a getUpdates has confirmed up to (updates below it are gone)."""
        with self._lock:
            return self._confirmed

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)
