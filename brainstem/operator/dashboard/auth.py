"""Who may see the dashboard and who may act through it.

* Bound to loopback with no ``BRAINSTEM_DASHBOARD_TOKEN``, anyone on this machine may read and act
  (the operator's own machine), but only through a ``Host`` that names loopback: a web page elsewhere
  cannot reach it by pointing a DNS name at 127.0.0.1.
* Bound to anything else, the token is required to start at all. Reading needs nothing more (put
  the dashboard behind your reverse proxy's own login if the network is not yours); every action
  needs the token, as ``Authorization: Bearer TOKEN`` or the cookie ``/login`` sets. A wrong token is
  401.
* Every action is a POST that carries the CSRF token of its page: a token this server signed
  (HMAC-SHA256 over a random browser identifier and an expiry, :class:`CsrfSigner`), sent both as a
  cookie and as a form field. A POST whose token is missing, expired, not the cookie's, or not signed
  by this server is 403: no other site can act through an operator's browser, and a client that
  makes up its own equal cookie and field gets nowhere. The signing key is derived from the token
  when one is set (pages stay valid across restarts), else random for each process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import time

from brainstem.core.errors import ConfigError

TOKEN_ENV = "BRAINSTEM_DASHBOARD_TOKEN"
TOKEN_COOKIE = "brainstem_token"
CSRF_COOKIE = "brainstem_csrf"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
CSRF_TTL = 12 * 3600  # seconds a page's CSRF token is good for
_CSRF_SHAPE = re.compile(r"([A-Za-z0-9_-]{16,64})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """A non-loopback bind without a token is refused before anything listens."""
    if not is_loopback(host) and not token:
        raise ConfigError(f"binding the dashboard to {host} needs {TOKEN_ENV} set (a long random string; actions "
                          f"need it, and the bind would otherwise be open to the network); loopback needs none")


def host_allowed(host_header: str | None, loopback_only: bool) -> bool:
    """On a loopback bind, the request's Host must name loopback (DNS rebinding)."""
    if not loopback_only:
        return True
    name = (host_header or "").strip()
    if name.startswith("["):  # [::1] or [::1]:8765, and nothing else after the bracket
        end = name.find("]")
        rest = name[end + 1:] if end > 0 else "x"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return False
        name = name[: end + 1]
    else:
        name, _, port = name.partition(":")
        if port and not port.isdigit():
            return False
    return is_loopback(name)


def same(a: object, b: object) -> bool:
    """Both non-empty text, and equal (in constant time). A form field may be an upload, never a match."""
    return isinstance(a, str) and isinstance(b, str) and bool(a) and bool(b) \
        and hmac.compare_digest(a.encode(), b.encode())


def presented_token(headers, cookies) -> str | None:
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return cookies.get(TOKEN_COOKIE)


def signing_key(token: str | None) -> bytes:
    """The CSRF signing key: derived from the dashboard token when one is set, else random (this process)."""
    if token:
        return hmac.new(token.encode(), b"brainstem dashboard csrf v1", hashlib.sha256).digest()
    return secrets.token_bytes(32)


class CsrfSigner:
    """Issues and checks CSRF tokens ``ID.EXPIRY.MAC``: ``ID`` a random identifier of the browser,
    ``EXPIRY`` unix seconds, ``MAC`` the HMAC-SHA256 of both under this server's key. Only the holder
    of the key makes a token that checks, so a token a client picked itself is refused."""

    def __init__(self, key: bytes, ttl: int = CSRF_TTL):
        self._key = key
        self.ttl = ttl

    def _mac(self, ident: str, expiry: str) -> str:
        digest = hmac.new(self._key, f"csrf\0{ident}\0{expiry}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(self, now: float | None = None) -> str:
        ident = secrets.token_urlsafe(24)
        expiry = str(int(now if now is not None else time.time()) + self.ttl)
        return f"{ident}.{expiry}.{self._mac(ident, expiry)}"

    def remaining(self, token: object, now: float | None = None) -> float:
        """Seconds ``token`` stays good; 0 for one that is malformed, expired or not signed here."""
        if not isinstance(token, str):
            return 0.0
        m = _CSRF_SHAPE.fullmatch(token)
        if m is None:
            return 0.0
        ident, expiry, mac = m.groups()
        if not hmac.compare_digest(mac.encode(), self._mac(ident, expiry).encode()):
            return 0.0
        left = int(expiry) - (now if now is not None else time.time())
        return left if 0 < left <= self.ttl + 60 else 0.0  # a far-future expiry was never issued here

    def check(self, field: object, cookie: object, now: float | None = None) -> bool:
        """The form's token is the cookie's, and one this server signed that has not expired."""
        return same(field, cookie) and self.remaining(field, now) > 0
