"""The Telegram Bot API on the wire: ``getUpdates`` (the poller's) and ``sendMessage`` (the runtime's
sending for ``ctx.send_telegram``), read with bounded waits and sizes, on connections a stopping daemon
can cut at once.

The bot token is in every request's URL, so nothing here quotes a URL, and a server's own words
(``description``) pass the redactor before they are kept. Every failure is one :class:`PollError`
whose message is safe to record. The token lives in this process only: agent code asks the runtime to
send (see :mod:`brainstem.tools.services`), it never holds the token.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpcore
import httpx

from brainstem.core.wire import tls_context
from brainstem.store.karma import Redactor

POLL_TIMEOUT = 25  # seconds Telegram holds a getUpdates open when there is nothing to hand over
MAX_UPDATES = 100  # the Bot API's own limit per getUpdates
SEND_TIMEOUT = 10.0  # seconds a sendMessage may take, all of it
MAX_BODY_BYTES = 4 * 1024 * 1024  # a hundred updates fit in far less; a larger answer is not the Bot API's
RETRY_AFTER_MAX = 600.0  # a 429's retry_after beyond this is not believed
MAX_ERROR_CHARS = 300
ANSWER_MARGIN = 30.0  # seconds past the long poll's own by which the whole answer must have arrived


@dataclass(frozen=True)
class ClientConfig:
    """Where and as whom to poll: the Bot API base URL, the bot token, the operator's chat, and every
    secret value the process knows (the redactor's, for anything recorded or logged)."""

    api_url: str
    token: str = field(repr=False)
    chat_id: str
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: Any) -> ClientConfig | None:
        """The poller's configuration, or None when the bot token or the operator's chat is not set."""
        if not settings.telegram_polling:
            return None
        return cls(api_url=settings.telegram_api_url.rstrip("/"),
                   token=settings.telegram_bot_token.get_secret_value(), chat_id=str(int(settings.telegram_chat_id)),
                   secrets={**settings.known_secrets(),
                            "BRAINSTEM_TELEGRAM_BOT_TOKEN": settings.telegram_bot_token.get_secret_value()})

    def method_url(self, method: str) -> str:
        return f"{self.api_url}/bot{self.token}/{method}"

    @functools.cached_property
    def redactor(self) -> Redactor:
        """Every secret the process knows, the bot token among them, for whatever is recorded or logged."""
        return Redactor({**self.secrets, "BRAINSTEM_TELEGRAM_BOT_TOKEN": self.token})


class PollError(Exception):
    """One Bot API request that did not do what was asked (a getUpdates that handed nothing over, a message
    not sent); the message is safe to record (no token, no URL). ``status`` is Telegram's HTTP status, or
    None when no answer came."""

    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


def get_updates(config: ClientConfig, offset: int | None, timeout: float,
                 client: httpx.Client | None) -> list[tuple[int, dict]]:
    """The updates Telegram hands over, as (update_id, update) by id; :class:`PollError` otherwise."""
    body: dict[str, Any] = {"timeout": max(0, int(timeout)), "allowed_updates": ["message"], "limit": MAX_UPDATES}
    if offset is not None:
        body["offset"] = offset
    result = _call(config, "getUpdates", body, _timeouts(timeout), timeout + ANSWER_MARGIN, client)
    if not isinstance(result, list):
        raise PollError("Telegram's answer is not the Bot API's: its result is not a list")
    updates = {}
    for item in result[: MAX_UPDATES * 10]:
        uid = item.get("update_id") if isinstance(item, dict) else None
        if isinstance(uid, int) and not isinstance(uid, bool) and 0 <= uid < 2 ** 53:
            updates[uid] = item
    return sorted(updates.items(), key=lambda pair: pair[0])


def send_message(config: ClientConfig, text: str, timeout: float = SEND_TIMEOUT,
                 client: httpx.Client | None = None, reply_to: int | None = None) -> int | None:
    """Send ``text`` to the operator's chat (``config.chat_id``): Telegram's message id; :class:`PollError`
    when it was not sent. The chat is the configuration's, never the caller's. ``reply_to`` (a message id in
    that chat) shows it as the answer to that message, and it is sent all the same if that one is gone."""
    timeout = max(0.1, min(timeout, SEND_TIMEOUT))
    waits = httpx.Timeout(connect=timeout, read=timeout, write=timeout, pool=timeout)
    body: dict[str, Any] = {"chat_id": config.chat_id, "text": text}
    if reply_to is not None:
        body["reply_parameters"] = {"message_id": reply_to, "allow_sending_without_reply": True}
    result = _call(config, "sendMessage", body, waits, timeout, client)
    message_id = result.get("message_id") if isinstance(result, dict) else None
    return message_id if isinstance(message_id, int) and not isinstance(message_id, bool) else None


def _call(config: ClientConfig, method: str, body: dict[str, Any], waits: httpx.Timeout, within: float,
          client: httpx.Client | None) -> Any:
    """One Bot API call: its ``result`` when Telegram answered ``ok``; :class:`PollError` otherwise. Every
    byte of the exchange, headers included, arrives ``within`` seconds or none is waited for."""
    own = client is None
    if own:
        client = make_client()  # the request's own ``waits`` apply, whatever the client's
    deadline = time.monotonic() + within
    _deadline.at = deadline  # see _Stream
    try:
        with client.stream("POST", config.method_url(method), json=body, timeout=waits) as response:
            status = response.status_code
            header_retry = response.headers.get("retry-after")
            raw = bytearray()
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > MAX_BODY_BYTES:
                    raise PollError(f"Telegram's answer was larger than {MAX_BODY_BYTES} bytes (HTTP {status})",
                                    status=status)
                if time.monotonic() > deadline:
                    raise PollError("Telegram's answer took too long to arrive", status=status)
    except PollError:
        raise
    except httpx.TimeoutException:
        raise PollError("the request to Telegram timed out") from None
    except httpx.ConnectError:
        raise PollError("could not connect to Telegram") from None
    except httpx.HTTPError as exc:
        raise PollError(f"the request to Telegram failed ({type(exc).__name__})") from None
    except OSError as exc:
        raise PollError(f"the request to Telegram failed ({type(exc).__name__})") from None
    finally:
        _deadline.at = None
        if own:
            client.close()
    answer = _parse(bytes(raw))
    if status != 200 or not isinstance(answer, dict) or answer.get("ok") is not True:
        raise _refusal(status, answer, header_retry, config.redactor)
    return answer.get("result")


_NOT_JSON = object()


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        return _NOT_JSON


def _refusal(status: int, answer: Any, header_retry: str | None, redact: Redactor) -> PollError:
    """A PollError saying why Telegram handed nothing over, with its retry_after when it gave one."""
    description = answer.get("description") if isinstance(answer, dict) else None
    said = ""
    if isinstance(description, str) and description.strip():
        said = ": " + " ".join(redact.text(description[:MAX_ERROR_CHARS]).split())[:200]
    retry = None
    params = answer.get("parameters") if isinstance(answer, dict) else None
    for candidate in ((params or {}).get("retry_after") if isinstance(params, dict) else None, header_retry):
        try:
            value = float(candidate)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            retry = min(value, RETRY_AFTER_MAX)
            break
    if status == 429:
        return PollError(f"Telegram asked to slow down (HTTP 429){said}", retry_after=retry, status=status)
    if status in (401, 404):
        return PollError(f"Telegram refused the bot token (HTTP {status}){said}; check BRAINSTEM_TELEGRAM_BOT_TOKEN",
                         status=status)
    if status == 409:
        return PollError(f"Telegram answered 409 Conflict{said}: another process polls this bot, or a webhook is set",
                         status=status)
    if status != 200:
        return PollError(f"Telegram answered HTTP {status}{said}", retry_after=retry, status=status)
    if answer is _NOT_JSON:
        return PollError("Telegram's answer is not JSON", status=status)
    if not isinstance(answer, dict):
        return PollError("Telegram's answer is not the Bot API's: not a JSON object", status=status)
    return PollError(f"Telegram answered ok: false{said}", retry_after=retry, status=status)


def _timeouts(timeout: float) -> httpx.Timeout:
    """Bounded waits: the long poll's own time and a margin to read the answer; seconds elsewhere."""
    return httpx.Timeout(connect=10.0, read=timeout + 15.0, write=10.0, pool=10.0)


class Wire(httpcore.NetworkBackend):
    """The poller's connections: :meth:`abort` cuts every one at once (a stopping daemon does not wait
    out a long poll), and none opens after it."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._lock = threading.Lock()
        self._streams: set[_Stream] = set()
        self.aborted = False

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if self.aborted:
            raise httpcore.ConnectError("stopped")
        stream = _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options), self)
        with self._lock:
            self._streams.add(stream)
            aborted = self.aborted
        if aborted:
            stream.cut()
        return stream

    def connect_unix_socket(self, *args, **kwargs):  # pragma: no cover - never used
        raise httpcore.ConnectError("unix sockets are not used")

    def sleep(self, seconds: float) -> None:  # pragma: no cover
        time.sleep(seconds)

    def forget(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def adopt(self, stream: _Stream) -> None:
        with self._lock:
            self._streams.add(stream)

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            streams = list(self._streams)
        for stream in streams:
            stream.cut()


# The deadline of the request this thread is making: a per-read timeout alone lets a server that drips
# its answer (headers too) a byte at a time hold the poll for ever.
_deadline = threading.local()


def _within_deadline(timeout: float | None, error: type[Exception]) -> float | None:
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the answer took too long to arrive")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, wire: Wire):
        self._inner = inner
        self._wire = wire

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._wire.aborted:
            raise httpcore.ReadError("stopped")
        return self._inner.read(max_bytes, _within_deadline(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._wire.aborted:
            raise httpcore.WriteError("stopped")
        self._inner.write(buffer, _within_deadline(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._wire.forget(self)
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, timeout)
        self._wire.forget(self)
        stream = _Stream(inner, self._wire)
        self._wire.adopt(stream)
        return stream

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def cut(self) -> None:
        """Wake a read blocked on this connection: shut its socket down (closing it would not)."""
        sock = self._inner.get_extra_info("socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def make_client(timeout: float = POLL_TIMEOUT, wire: Wire | None = None) -> httpx.Client:
    """An httpx client for the Bot API: verifying TLS, no proxy or netrc from the environment, bounded waits,
    and connections ``wire`` can cut."""
    transport = httpx.HTTPTransport(verify=tls_context(), trust_env=False)
    # As brainstem.core.wire does: httpx builds its pool with the default backend; ours can be cut.
    transport._pool = httpcore.ConnectionPool(ssl_context=tls_context(), network_backend=wire or Wire())
    return httpx.Client(transport=transport, timeout=_timeouts(timeout), trust_env=False, follow_redirects=False)
