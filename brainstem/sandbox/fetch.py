"""``ctx.fetch`` itself: an HTTP exchange under the egress policy, within one deadline.

DNS rebinding: the policy (``egress.check``) resolves once and checks every
address, and we connect to the address it checked (the request URL carries
the IP; the ``Host`` header and TLS SNI/certificate check carry the original
name).  A second, later lookup by the HTTP client -- the window rebinding
needs -- never happens.  Proxies from the environment are ignored for the same
reason (``trust_env=False``).

``fetch(...)`` follows redirects itself (at most 5), re-checking every hop.
One deadline covers the whole exchange: name resolution, connection, TLS,
every header and body byte of every hop; a server dripping one byte a second
cannot stretch it. Bodies are read raw and decoded here (gzip and deflate, at
most three layers), in pieces of at most 64 KiB, and capped at ``max_bytes``
*after* decoding (``truncated: True``), so a compressed bomb costs the
runtime no more memory than the cap. It returns ``{"status", "headers",
"text", "json", "url", "truncated"}`` with headers as a plain ``dict`` of
``str``. Failures raise :class:`~brainstem.sandbox.egress.FetchError` (or
its subclasses ``EgressDenied``, ``FetchTimeout``) with a message that
carries no headers.

A :class:`Guard` sees each hop before it is sent and each answer before the
caller does: the runtime uses it to put bound secrets in (and refuse them
elsewhere), scrub them out of what comes back, and meter requests to the LLM
host (see ``brainstem.tools.services`` and ``brainstem.llm.meter``).
"""

from __future__ import annotations

import json as _json
import time
import urllib.parse
import zlib
from collections.abc import Callable
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from brainstem.core.wire import deadline_transport, tls_context
from brainstem.sandbox.egress import EgressDenied, FetchError, FetchTimeout, Resolver, Target, check, normalise_host

MAX_REDIRECTS = 5
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})

# --------------------------------------------------------------------------- bodies

MAX_ENCODINGS = 3
_CHUNK = 64 * 1024


def _decoder(name: str):
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return _Deflate()
    raise FetchError(f"response uses Content-Encoding {name!r}, which fetch does not decode")


class _Deflate:
    """``deflate`` is zlib-wrapped by the standard and raw in practice: try one, fall back to the other."""

    def __init__(self):
        self._d = zlib.decompressobj()
        self._first = True

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self._first:
            self._first = False
            try:
                return self._d.decompress(data, max_length)
            except zlib.error:
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._d.decompress(data, max_length)

    @property
    def unconsumed_tail(self) -> bytes:
        return self._d.unconsumed_tail

    def flush(self) -> bytes:
        return self._d.flush(_CHUNK)


def _inflate(decoder, chunks):
    """Decode a stream in pieces of at most 64 KiB: memory stays bounded whatever the ratio."""
    for data in chunks:
        while data:
            try:
                out = decoder.decompress(data, _CHUNK)
            except zlib.error as e:
                raise FetchError(f"response body is not valid compressed data: {e}") from None
            if out:
                yield out
            data = decoder.unconsumed_tail
    tail = decoder.flush()
    if tail:
        yield tail


# What a sealed answer's headers lose: sizes counted over what the server echoed, which the secret's length
# and quoting (how many of its characters a URL or JSON escapes) shape; the text itself is put back.
SIZE_HEADERS = frozenset({"content-length", "content-range"})
SEALED_ERROR = "fetch failed: the answer to a request that carried a secret {}; it is not handed over"


def _encodings(response: httpx.Response) -> list[str]:
    return [e.strip().lower() for e in response.headers.get("content-encoding", "").split(",")
            if e.strip() and e.strip().lower() != "identity"]


def _read_body(response: httpx.Response, max_bytes: int, deadline: float) -> tuple[bytes, bool]:
    """(the decoded body, truncated): read raw, decoded by us, capped *after* decoding."""
    encodings = _encodings(response)
    if len(encodings) > MAX_ENCODINGS:
        raise FetchError(f"response is encoded {len(encodings)} times (at most {MAX_ENCODINGS})")
    if response.is_stream_consumed:
        # A response built in memory (a test's mock transport), already decoded by httpx.
        stream = iter([response.content])
    else:
        stream = response.iter_raw(_CHUNK)
        for name in reversed(encodings):  # the last encoding applied is undone first
            stream = _inflate(_decoder(name), stream)
    chunks: list[bytes] = []
    size = 0
    for chunk in stream:
        if time.monotonic() > deadline:
            raise FetchTimeout("deadline passed while reading")
        if size + len(chunk) > max_bytes:
            chunks.append(chunk[: max_bytes - size])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def _encode_body(json: Any, data: Any) -> tuple[bytes | None, str | None, str | None]:
    """(body bytes, kind, content type): encoded here, once, so a guard sees exactly what is sent."""
    if json is not None:
        try:
            return _json.dumps(json, ensure_ascii=False, allow_nan=False).encode("utf-8"), "json", "application/json"
        except (TypeError, ValueError) as e:
            raise FetchError(f"json body is not JSON: {e}") from None
    if data is None:
        return None, None, None
    if isinstance(data, dict):
        if not all(type(k) is str and type(v) is str for k, v in data.items()):
            raise FetchError("form data must be str to str")
        return urllib.parse.urlencode(data).encode("ascii"), "form", "application/x-www-form-urlencoded"
    if isinstance(data, str):
        return data.encode("utf-8"), "raw", None
    if isinstance(data, (bytes, bytearray)):
        return bytes(data), "raw", None
    raise FetchError("data must be a str or a dict of str")


# --------------------------------------------------------------------------- fetch


def _host_header(target: Target) -> str:
    host = target.host
    if ":" in host:
        host = f"[{host}]"
    default = 443 if target.url.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _decode(body: bytes, encoding: str | None) -> str:
    try:
        return body.decode(encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


class Hop:
    """One request of a fetch, as a guard sees it (in the tool's own terms: placeholders, not values)."""

    __slots__ = ("method", "scheme", "host", "ip", "port", "path", "url", "headers", "body", "body_kind", "note",
                 "sealed")

    def __init__(self, method, target: Target, url: str, headers: dict, body, body_kind):
        self.method = method
        self.scheme = target.url.scheme
        self.host = normalise_host(target.host)
        self.ip = target.ip  # the address checked and connected to, whatever the spelling of the host
        self.port = target.port
        self.path = target.url.path or "/"
        self.url = url
        self.headers = headers
        self.body = body
        self.body_kind = body_kind
        self.note: dict = {}  # what the guard wants recorded about this hop
        # Set by a guard that put a secret into this request. Its answer is then taken only as sent:
        # uncompressed (a compressed size answers guesses about what was compressed with the secret), read as
        # UTF-8 (a charset the server names would be a transformation of the echo), and whole (a cut through an
        # echo leaves a piece too short to recognise). Otherwise the tool gets a fixed error, never the answer.
        self.sealed = False


class Guard:
    """What sits between a tool's fetch and the wire; the default lets everything through unchanged."""

    def outgoing(self, hop: Hop) -> tuple[str, dict, bytes | None]:
        """The URL, headers and body to send for ``hop``; raise :class:`EgressDenied` to refuse it."""
        return hop.url, hop.headers, hop.body

    def incoming(self, hop: Hop, status: int | None, headers: dict, text: str | None,
                 error: str | None = None) -> tuple[dict, str | None]:
        """What the tool may see of a response (``error`` set when the request failed after sending)."""
        return headers, text


def fetch(
    url: str,
    method: str = "GET",
    headers: dict | None = None,
    json: Any = None,
    data: Any = None,
    timeout: float | None = None,
    *,
    allow: list[str] | None = None,
    max_bytes: int = 1_000_000,
    max_timeout: float = 30,
    transport: httpx.BaseTransport | None = None,
    resolver: Resolver | None = None,
    guard: Guard | None = None,
    trace: list | None = None,
) -> dict:
    """Fetch ``url`` under the egress policy; see the module docstring.

    One deadline (``timeout``, at most ``max_timeout``) covers the whole exchange: every
    resolution, connection, header and body byte of every hop. ``trace`` (a list) receives
    one :class:`Hop` per request sent or refused.
    """
    if type(method) is not str or method.upper() not in ALLOWED_METHODS:
        raise FetchError(f"method {str(method)[:20]!r} is not allowed")
    method = method.upper()
    budget = _time_budget(timeout, max_timeout)
    deadline = time.monotonic() + budget
    guard = guard or Guard()
    req_headers = _request_headers(headers)
    body, body_kind, content_type = _encode_body(json, data)
    if content_type and not any(k.lower() == "content-type" for k in req_headers):
        req_headers["Content-Type"] = content_type

    def timed_out() -> FetchTimeout:
        return FetchTimeout(f"fetch timed out after {budget:g} s")

    current = url
    origin = None
    # A fresh client (and so a fresh connection pool) per fetch: a pooled
    # connection keyed by IP could otherwise carry a request for another name.
    # No cookie jar: a cookie a server sets would ride on later hops (matched by the address connected to)
    # past every check of what the request carries, a secret echoed into it included. A tool sends the
    # cookies it means to, in its own headers.
    with httpx.Client(transport=transport or deadline_transport(deadline, tls_context()), follow_redirects=False,
                      trust_env=False, verify=tls_context(), cookies=_no_cookies()) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timed_out()
            try:
                target = check(current, allow, resolver, remaining)
            except FetchTimeout:
                raise timed_out() from None
            this_origin = (target.url.scheme, normalise_host(target.host), target.port)
            if origin is not None and this_origin != origin:
                _drop(req_headers, "authorization", "cookie", "proxy-authorization")  # never across origins
            origin = this_origin
            hop = Hop(method, target, str(target.url), dict(req_headers), body, body_kind)
            if trace is not None:
                trace.append(hop)
            response = _send(client, hop, target, guard, deadline, timed_out)
            try:
                resp_headers = {str(k): str(v) for k, v in response.headers.items()}
                location = response.headers.get("location")
                if response.status_code not in REDIRECT_CODES or not location:
                    return _answer(response, hop, resp_headers, guard, max_bytes, deadline, timed_out)
                resp_headers, _ = guard.incoming(hop, response.status_code, resp_headers, None)
                # The guard has scrubbed Location: a secret echoed into it goes on as its placeholder.
                location = next((v for k, v in resp_headers.items() if k.lower() == "location"), location)
                current = str(target.url.join(location))
                if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
                    method = "GET" if method != "HEAD" else "HEAD"
                    body = body_kind = None
                    _drop(req_headers, "content-type")
            finally:
                response.close()
    raise FetchError(f"too many redirects (more than {MAX_REDIRECTS})")


def _no_cookies():
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def _time_budget(timeout: Any, max_timeout: float) -> float:
    """The whole fetch's seconds: ``timeout`` (default and at most ``max_timeout``), at least 0.1."""
    try:
        budget = float(timeout) if timeout is not None else float(max_timeout)
    except (TypeError, ValueError):
        raise FetchError("timeout must be a number") from None
    if budget != budget:
        raise FetchError("timeout must be a number")
    return max(0.1, min(budget, float(max_timeout)))


def _request_headers(headers: Any) -> dict[str, str]:
    """The tool's headers, minus those the transport owns; we decode bodies ourselves, capped after
    decoding, so only what we can decode is accepted."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if type(name) is not str or type(value) is not str:
            raise FetchError("headers must be str to str")
        if name.lower() in ("host", "content-length", "transfer-encoding", "connection", "accept-encoding"):
            continue
        out[name] = value
    out["Accept-Encoding"] = "gzip, deflate"
    return out


def _drop(headers: dict[str, str], *names: str) -> None:
    for name in [k for k in headers if k.lower() in names]:
        del headers[name]


def _send(client: httpx.Client, hop: Hop, target: Target, guard: Guard, deadline: float,
          timed_out: Callable[[], FetchTimeout]) -> httpx.Response:
    """Send one hop, as the guard lets it go, to the address that was checked (never re-resolved)."""
    send_url, send_headers, send_body = guard.outgoing(hop)
    if hop.sealed:
        send_headers = {**{k: v for k, v in send_headers.items() if k.lower() != "accept-encoding"},
                        "Accept-Encoding": "identity"}
    sent = httpx.URL(send_url)
    if normalise_host(sent.host) != hop.host or (sent.port or target.port) != target.port:
        raise EgressDenied("refused: the request's host changed after secrets were put in")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise timed_out()
    try:
        request = client.build_request(
            hop.method,
            sent.copy_with(host=target.ip),
            headers={**send_headers, "Host": _host_header(target)},
            timeout=httpx.Timeout(remaining),
            extensions={"sni_hostname": target.host} if target.url.scheme == "https" else {},
            content=send_body,
        )
        return client.send(request, stream=True)
    except httpx.TimeoutException:
        guard.incoming(hop, None, {}, None, error="timed out")
        raise timed_out() from None
    except Exception as e:  # noqa: BLE001 - the HTTP stack's own text may quote the request, secrets and all
        guard.incoming(hop, None, {}, None, error=type(e).__name__)
        raise FetchError(_stack_error("fetch failed", e)) from None


# What the HTTP stack's errors become: fixed text by kind. Their own messages quote what they choke on (a
# header value, a URL), and that may be a secret put in for the wire.
_STACK_ERRORS = (
    (httpx.ConnectError, "could not connect"),
    (httpx.RemoteProtocolError, "the server broke the HTTP protocol"),
    (httpx.LocalProtocolError, "the request is not valid HTTP (a header name or value it may not hold?)"),
    (httpx.ReadError, "the connection failed while reading"),
    (httpx.WriteError, "the connection failed while sending"),
    (httpx.DecodingError, "the response could not be decoded"),
    (httpx.TooManyRedirects, "too many redirects"),
    (httpx.InvalidURL, "the URL is not valid"),
)


def _stack_error(what: str, e: BaseException) -> str:
    reason = next((text for kind, text in _STACK_ERRORS if isinstance(e, kind)), "the HTTP exchange failed")
    return f"{what}: {reason}"


def _answer(response: httpx.Response, hop: Hop, resp_headers: dict, guard: Guard, max_bytes: int,
            deadline: float, timed_out: Callable[[], FetchTimeout]) -> dict:
    """The final response as the tool sees it: the body read within the deadline, decoded and
    capped, then through the guard."""
    if hop.sealed and _encodings(response):
        guard.incoming(hop, response.status_code, resp_headers, None, error="compressed")
        raise FetchError(SEALED_ERROR.format("was compressed"))
    try:
        raw, truncated = _read_body(response, max_bytes, deadline)
    except (httpx.TimeoutException, FetchTimeout):
        guard.incoming(hop, response.status_code, resp_headers, None, error="timed out")
        raise timed_out() from None
    except httpx.HTTPError as e:
        guard.incoming(hop, response.status_code, resp_headers, None, error=type(e).__name__)
        raise FetchError(_stack_error("fetch failed while reading", e)) from None
    except FetchError as e:
        guard.incoming(hop, response.status_code, resp_headers, None, error=str(e))
        raise
    hop.note["bytes"] = None if hop.sealed else len(raw)  # a size the value's quoting shaped: not kept
    if hop.sealed:
        resp_headers = {k: v for k, v in resp_headers.items() if k.lower() not in SIZE_HEADERS}
    if hop.sealed and truncated:
        guard.incoming(hop, response.status_code, resp_headers, None, error="over the cap")
        raise FetchError(SEALED_ERROR.format(f"passed the {max_bytes}-byte cap"))
    text = _decode(raw, "utf-8" if hop.sealed else response.charset_encoding)
    resp_headers, text = guard.incoming(hop, response.status_code, resp_headers, text)
    parsed_json = None
    if not truncated and text and text.strip():
        try:
            parsed_json = _json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            parsed_json = None
    return {"status": response.status_code, "headers": resp_headers, "text": text or "", "json": parsed_json,
            "url": hop.url, "truncated": truncated}
