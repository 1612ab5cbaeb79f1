"""Who may see the dashboard and who may act through it.

* Bound to loopback with no ``BRAINSTEM_DASHBOARD_TOKEN``, anyone on this machine may read and act
  (the operator's own machine), but only through a ``Host`` that names loopback: a web page elsewhere
  cannot reach it by pointing a DNS name at 127.0.0.1.
* Bound to anything else, the token is required to start at all. Reading needs nothing more (put
  the dashboard behind your reverse proxy's own login if the network is not yours); every action
  needs the token, as ``Authorization: Bearer TOKEN`` or the cookie ``/login`` sets. A wrong token is
  401.
* Every action is a POST that carries the CSRF token of its page (a cookie and a form field that must
  match, compared in constant time); a POST without it is 403, so no other site can act through an
  operator's browser.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

from ..errors import ConfigError

TOKEN_ENV = "BRAINSTEM_DASHBOARD_TOKEN"
TOKEN_COOKIE = "brainstem_token"
CSRF_COOKIE = "brainstem_csrf"
CSRF_FIELD = "csrf"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


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


def same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


def presented_token(headers, cookies) -> str | None:
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return cookies.get(TOKEN_COOKIE)


def new_csrf() -> str:
    return secrets.token_urlsafe(24)
