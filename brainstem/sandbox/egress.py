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

``fetch(...)`` follows redirects itself (at most 5), re-checking every hop,
streams the body and stops at ``max_bytes`` (``truncated: True``), and caps
the total time.  It returns ``{"status", "headers", "text", "json", "url",
"truncated"}`` with headers as a plain ``dict`` of ``str``.  Failures raise
:class:`FetchError` (or its subclass :class:`EgressDenied`) with a message
that carries no headers.
"""

from __future__ import annotations

import ipaddress
import json as _json
import socket
import time
import urllib.parse
from typing import Any, Callable, Iterable

import httpx

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


_ssl_context = None


def _tls_context():
    """One verifying SSL context per process (building one costs ~30 ms); connections
    themselves are never pooled across fetches (see fetch)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


class FetchError(Exception):
    """A fetch failed; the message is safe to show to tool code (no headers)."""


class EgressDenied(FetchError):
    """The egress policy refused a URL."""


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


def _default_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as e:
        raise FetchError(f"cannot resolve host {host!r}: {e}") from None
    seen: list[str] = []
    for info in infos:
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
        raise EgressDenied(f"invalid url: {e}") from None
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


def _check(url: Any, allow: Iterable[str] | None, resolver: Resolver | None) -> _Target:
    parsed, host, port = _parse(url)
    names, nets = _parse_allow(allow)
    name = _normalise_host(host)
    host_allowed = name in names
    if name in METADATA_HOSTS and not host_allowed:
        raise EgressDenied(f"host {name!r} is a cloud metadata endpoint")
    resolve = resolver or _default_resolver
    # Resolve the name without its trailing dot ("localhost." is localhost);
    # whatever it resolves to is what we check and then connect to.
    addresses = list(resolve(host.rstrip(".") or host, port))
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
        if chosen is None:
            chosen = ip
    assert chosen is not None
    return _Target(parsed, host, port, str(chosen))


def check_url(url: str, allow: list[str] | None = None, *, resolver: Resolver | None = None) -> None:
    """Raise :class:`EgressDenied` unless ``url`` may be fetched under ``allow``."""
    _check(url, allow, resolver)


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


def fetch(
    url: str,
    method: str = "GET",
    headers: dict | None = None,
    json: Any = None,
    data: Any = None,
    timeout: float | None = None,
    *,
    allow: list[str] | None = None,
    max_bytes: int = 2_000_000,
    max_timeout: float = 30,
    transport: httpx.BaseTransport | None = None,
    resolver: Resolver | None = None,
) -> dict:
    """Fetch ``url`` under the egress policy; see the module docstring."""
    if type(method) is not str or method.upper() not in ALLOWED_METHODS:
        raise FetchError(f"method {str(method)[:20]!r} is not allowed")
    method = method.upper()
    try:
        budget = float(timeout) if timeout is not None else float(max_timeout)
    except (TypeError, ValueError):
        raise FetchError("timeout must be a number") from None
    budget = max(0.1, min(budget, float(max_timeout)))
    deadline = time.monotonic() + budget
    req_headers: dict[str, str] = {}
    for k, v in (headers or {}).items():
        if type(k) is not str or type(v) is not str:
            raise FetchError("headers must be str to str")
        if k.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            continue
        req_headers[k] = v
    body_kwargs: dict[str, Any] = {}
    if json is not None:
        body_kwargs["json"] = json
    elif data is not None:
        if isinstance(data, dict):
            body_kwargs["data"] = data
        else:
            body_kwargs["content"] = data.encode("utf-8") if isinstance(data, str) else data

    current = url
    origin = None
    # A fresh client (and so a fresh connection pool) per fetch: a pooled
    # connection keyed by IP could otherwise carry a request for another name.
    with httpx.Client(transport=transport, follow_redirects=False, trust_env=False,
                      verify=_tls_context()) as client:
        for _hop in range(MAX_REDIRECTS + 1):
            target = _check(current, allow, resolver)
            this_origin = (target.url.scheme, _normalise_host(target.host), target.port)
            if origin is not None and this_origin != origin:
                for k in list(req_headers):
                    if k.lower() in ("authorization", "cookie", "proxy-authorization"):
                        del req_headers[k]
            origin = this_origin
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FetchError(f"fetch timed out after {budget:g} s")
            request = client.build_request(
                method,
                target.url.copy_with(host=target.ip),
                headers={**req_headers, "Host": _host_header(target)},
                timeout=httpx.Timeout(remaining),
                extensions={"sni_hostname": target.host} if target.url.scheme == "https" else {},
                **body_kwargs,
            )
            try:
                response = client.send(request, stream=True)
            except httpx.TimeoutException:
                raise FetchError(f"fetch timed out after {budget:g} s") from None
            except httpx.HTTPError as e:
                raise FetchError(f"fetch failed: {type(e).__name__}: {e}") from None
            try:
                location = response.headers.get("location")
                if response.status_code in REDIRECT_CODES and location:
                    current = str(target.url.join(location))
                    if response.status_code == 303 or (
                        response.status_code in (301, 302) and method == "POST"
                    ):
                        method = "GET" if method != "HEAD" else "HEAD"
                        body_kwargs = {}
                    continue
                chunks: list[bytes] = []
                size = 0
                truncated = False
                try:
                    for chunk in response.iter_bytes():
                        if time.monotonic() > deadline:
                            raise FetchError(f"fetch timed out after {budget:g} s")
                        if size + len(chunk) > max_bytes:
                            chunks.append(chunk[: max_bytes - size])
                            size = max_bytes
                            truncated = True
                            break
                        chunks.append(chunk)
                        size += len(chunk)
                except httpx.TimeoutException:
                    raise FetchError(f"fetch timed out after {budget:g} s") from None
                except httpx.HTTPError as e:
                    raise FetchError(f"fetch failed while reading: {type(e).__name__}: {e}") from None
                raw = b"".join(chunks)
                text = _decode(raw, response.charset_encoding)
                parsed_json = None
                if not truncated and text.strip():
                    try:
                        parsed_json = _json.loads(text, parse_constant=_no_constant)
                    except (ValueError, RecursionError):
                        parsed_json = None
                return {
                    "status": response.status_code,
                    "headers": {str(k): str(v) for k, v in response.headers.items()},
                    "text": text,
                    "json": parsed_json,
                    "url": str(target.url),
                    "truncated": truncated,
                }
            finally:
                response.close()
    raise FetchError(f"too many redirects (more than {MAX_REDIRECTS})")
