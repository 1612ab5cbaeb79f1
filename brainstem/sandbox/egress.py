"""Egress policy for ``ctx.fetch``: which URLs a tool may reach.

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
away, so the real host is judged.  The runtime's own listening ports
(``own_ports``) are refused whatever the allow list says.

:func:`check` resolves once and returns the address it checked, for the
fetch (``brainstem.sandbox.fetch``) to connect to: see there for DNS
rebinding.  Name resolution (``getaddrinfo`` has no timeout) runs in a thread
we stop waiting for.  The errors here are the fetch's too: :class:`FetchError`
and its subclasses :class:`EgressDenied` and :class:`FetchTimeout`, each with
a message that carries no headers.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from brainstem.sandbox import own_ports

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


def normalise_host(host: str) -> str:
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
            names.add(normalise_host(entry))
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


def one_form(address: str) -> str:
    """``address`` in one spelling: an IPv4 address inside an IPv6 one (mapped, NAT64, 6to4) as itself,
    any other address as ipaddress prints it; text that is no address, unchanged."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    return str(_embedded_v4(ip) or ip)


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


class Target:
    """A URL that passed the policy: its host and port, and the address checked, to connect to."""

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
    if normalise_host(other) != normalise_host(host):
        raise EgressDenied("ambiguous url (parsers disagree about its host)")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return parsed, host, port


def check(url: Any, allow: Iterable[str] | None, resolver: Resolver | None, timeout: float = 10.0) -> Target:
    """The :class:`Target` of ``url`` under ``allow``; raises :class:`EgressDenied` (or :class:`FetchError`,
    :class:`FetchTimeout` when the name cannot be resolved in ``timeout`` seconds)."""
    parsed, host, port = _parse(url)
    names, nets = _parse_allow(allow)
    name = normalise_host(host)
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
    return Target(parsed, host, port, str(chosen))


def check_url(url: str, allow: list[str] | None = None, *, resolver: Resolver | None = None) -> None:
    """Raise :class:`EgressDenied` unless ``url`` may be fetched under ``allow``."""
    check(url, allow, resolver)
