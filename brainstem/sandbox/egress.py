"""Egress policy for ``ctx.fetch``: which URLs a tool may reach, and the fetch itself.

``check_url(url, allow)`` raises :class:`EgressDenied` unless the URL is
http(s) and every address its host resolves to is public, or the host or the
address is on the operator's ``allow`` list (hostnames such as ``localhost``,
or IPs/CIDRs such as ``127.0.0.1/32``; from ``BRAINSTEM_FETCH_ALLOW``).
Refused: loopback, private, link-local, multicast, reserved, unspecified,
shared (100.64/10) and anything else that is not globally routable, IPv4
hidden in IPv6 (``::ffff:a.b.c.d``, NAT64, 6to4), and cloud metadata
endpoints by address (169.254.169.254, fd00:ec2::254, ...) and by name
(``metadata.google.internal``...).  Odd IPv4 spellings (``2130706433``,
``0x7f.1``, ``0177.0.0.1``, ``127.1``) are resolved by the same
``getaddrinfo`` a connection would use, so they are judged by the address
they really mean; userinfo (``https://good@169.254.169.254/``) is parsed
away, so the real host is judged.

DNS rebinding: we resolve once, check every address, and then connect to the
address we checked (the request URL carries the IP; the ``Host`` header and
TLS SNI/certificate check carry the original name).  A second, later lookup
by the HTTP client — the window rebinding needs — never happens.  Proxies
from the environment are ignored for the same reason (``trust_env=False``).

``fetch(...)`` follows redirects itself (at most 5), re-checking every hop.
One deadline covers the whole exchange: name resolution (``getaddrinfo``
has no timeout, so it runs in a thread we stop waiting for), connection, TLS,
every header and body byte of every hop; a server dripping one byte a second
cannot stretch it. Bodies are read raw and decoded here (gzip and deflate, at
most three layers), in pieces of at most 64 KiB, and capped at ``max_bytes``
*after* decoding (``truncated: True``), so a compressed bomb costs the
runtime no more memory than the cap. It returns ``{"status", "headers",
"text", "json", "url", "truncated"}`` with headers as a plain ``dict`` of
``str``. Failures raise :class:`FetchError` (or its subclasses
:class:`EgressDenied`, :class:`FetchTimeout`) with a message that carries no
headers.

A :class:`Guard` sees each hop before it is sent and each answer before the
caller does: the runtime uses it to put bound secrets in (and refuse them
elsewhere), scrub them out of what comes back, and meter requests to the LLM
host (see ``brainstem.tools.services`` and ``brainstem.llm.meter``).
"""

from __future__ import annotations

import ipaddress
import json as _json
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from brainstem.core.wire import deadline_transport, tls_context
from brainstem.sandbox import own_ports

MAX_REDIRECTS = 5
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
ALLOWED_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})

METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS DNS
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",
    )
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")

Resolver = Callable[[str, int], Iterable[str]]




class FetchError(Exception):
    """A fetch failed; the message is safe to show to tool code (no headers)."""


class EgressDenied(FetchError):
    """The egress policy refused a URL (or a request it would have sent)."""


class FetchTimeout(FetchError):
    """The exchange did not finish within its deadline."""


# --------------------------------------------------------------------------- helpers


def _normalise_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def _parse_allow(allow: Iterable[str] | None) -> tuple[set[str], list[ipaddress._BaseNetwork]]:
    names: set[str] = set()
    nets: list = []
    for entry in allow or ():
        entry = str(entry).strip()
        if not entry:
            continue
        candidate = entry[1:-1] if entry.startswith("[") and entry.endswith("]") else entry
        try:
            nets.append(ipaddress.ip_network(candidate, strict=False))
        except ValueError:
            names.add(_normalise_host(entry))
    return names, nets


def _embedded_v4(ip: ipaddress._BaseAddress) -> ipaddress.IPv4Address | None:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64 or ip in _NAT64_LOCAL:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return None


def address_problem(ip: ipaddress._BaseAddress) -> str | None:
    """Why ``ip`` may not be reached without an allow entry, or None if it is public."""
    inner = _embedded_v4(ip)
    if inner is not None:
        problem = address_problem(inner)
        return f"{problem} (inside {ip})" if problem else None
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private:
        return "a private address"
    if not ip.is_global:
        return "not a public address"
    return None


def _default_resolver(host: str, port: int, timeout: float = 10.0) -> list[str]:
    """getaddrinfo has no timeout of its own: it runs in a thread we stop waiting for at ``timeout``."""
    box: dict[str, Any] = {}

    def resolve() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as e:
            box["error"] = e

    worker = threading.Thread(target=resolve, name="brainstem-resolve", daemon=True)
    worker.start()
    worker.join(max(0.0, timeout))
    if worker.is_alive():
        raise FetchTimeout(f"resolving {host!r} took longer than the time left")
    if "error" in box:
        raise FetchError(f"cannot resolve host {host!r}: {box['error']}")
    seen: list[str] = []
    for info in box["infos"]:
        addr = info[4][0]
        if addr not in seen:
            seen.append(addr)
    return seen


class _Target:
    __slots__ = ("url", "host", "port", "ip")

    def __init__(self, url: httpx.URL, host: str, port: int, ip: str):
        self.url = url
        self.host = host
        self.port = port
        self.ip = ip


def _parse(url: Any) -> tuple[httpx.URL, str, int]:
    if type(url) is not str:
        raise EgressDenied("url must be a str")
    if len(url) > 8192:
        raise EgressDenied("url too long")
    if any(ord(c) < 0x21 or c == "\\" or ord(c) == 0x7F for c in url):
        raise EgressDenied("url contains whitespace, control characters or backslashes")
    try:
        parsed = httpx.URL(url)
    except Exception as e:  # noqa: BLE001 - httpx raises several types
        raise EgressDenied(f"invalid url ({type(e).__name__})") from None
    if parsed.scheme not in ("http", "https"):
        raise EgressDenied(f"scheme {parsed.scheme!r} is not allowed (http and https only)")
    host = parsed.host
    if not host:
        raise EgressDenied("url has no host")
    if "%" in host:
        raise EgressDenied("percent-encoded or zoned hosts are not allowed")
    try:
        other = urllib.parse.urlsplit(url).hostname or ""
        if not other.isascii():
            other = other.encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        other = ""
    if _normalise_host(other) != _normalise_host(host):
        raise EgressDenied("ambiguous url (parsers disagree about its host)")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return parsed, host, port


def _check(url: Any, allow: Iterable[str] | None, resolver: Resolver | None, timeout: float = 10.0) -> _Target:
    parsed, host, port = _parse(url)
    names, nets = _parse_allow(allow)
    name = _normalise_host(host)
    host_allowed = name in names
    if name in METADATA_HOSTS and not host_allowed:
        raise EgressDenied(f"host {name!r} is a cloud metadata endpoint")
    # Resolve the name without its trailing dot ("localhost." is localhost);
    # whatever it resolves to is what we check and then connect to.
    bare = host.rstrip(".") or host
    addresses = list(resolver(bare, port) if resolver else _default_resolver(bare, port, timeout))
    if not addresses:
        raise FetchError(f"cannot resolve host {host!r}")
    chosen = None
    for text in addresses:
        try:
            ip = ipaddress.ip_address(str(text).split("%", 1)[0])
        except ValueError:
            raise EgressDenied(f"host {host!r} resolved to an invalid address") from None
        if not host_allowed and not any(ip in net for net in nets if net.version == ip.version):
            problem = address_problem(ip)
            if problem:
                raise EgressDenied(f"host {host!r} resolves to {ip}, {problem}")
        if own_ports.is_own(ip, port):  # allowed or not: the dashboard and metrics are the operator's
            raise EgressDenied(f"port {port} of {host!r} is one the runtime itself listens on")
        if chosen is None:
            chosen = ip
    assert chosen is not None
    return _Target(parsed, host, port, str(chosen))


def check_url(url: str, allow: list[str] | None = None, *, resolver: Resolver | None = None) -> None:
    """Raise :class:`EgressDenied` unless ``url`` may be fetched under ``allow``."""
    _check(url, allow, resolver)


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


def _read_body(response: httpx.Response, max_bytes: int, deadline: float) -> tuple[bytes, bool]:
    """(the decoded body, truncated): read raw, decoded by us, capped *after* decoding."""
    encodings = [e.strip().lower() for e in response.headers.get("content-encoding", "").split(",")
                 if e.strip() and e.strip().lower() != "identity"]
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


def _host_header(target: _Target) -> str:
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

    __slots__ = ("method", "scheme", "host", "port", "path", "url", "headers", "body", "body_kind", "note")

    def __init__(self, method, target: _Target, url: str, headers: dict, body, body_kind):
        self.method = method
        self.scheme = target.url.scheme
        self.host = _normalise_host(target.host)
        self.port = target.port
        self.path = target.url.path or "/"
        self.url = url
        self.headers = headers
        self.body = body
        self.body_kind = body_kind
        self.note: dict = {}  # what the guard wants recorded about this hop


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
    with httpx.Client(transport=transport or deadline_transport(deadline, tls_context()), follow_redirects=False,
                      trust_env=False, verify=tls_context()) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise timed_out()
            try:
                target = _check(current, allow, resolver, remaining)
            except FetchTimeout:
                raise timed_out() from None
            this_origin = (target.url.scheme, _normalise_host(target.host), target.port)
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


def _send(client: httpx.Client, hop: Hop, target: _Target, guard: Guard, deadline: float,
          timed_out: Callable[[], FetchTimeout]) -> httpx.Response:
    """Send one hop, as the guard lets it go, to the address that was checked (never re-resolved)."""
    send_url, send_headers, send_body = guard.outgoing(hop)
    sent = httpx.URL(send_url)
    if _normalise_host(sent.host) != hop.host or (sent.port or target.port) != target.port:
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
    hop.note["bytes"] = len(raw)
    text = _decode(raw, response.charset_encoding)
    resp_headers, text = guard.incoming(hop, response.status_code, resp_headers, text)
    parsed_json = None
    if not truncated and text and text.strip():
        try:
            parsed_json = _json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            parsed_json = None
    return {"status": response.status_code, "headers": resp_headers, "text": text or "", "json": parsed_json,
            "url": hop.url, "truncated": truncated}
