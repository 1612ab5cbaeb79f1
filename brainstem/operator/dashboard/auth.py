"""Who may use the dashboard: only the holder of its token, from anywhere, loopback included.

* Every request needs the dashboard token (``BRAINSTEM_DASHBOARD_TOKEN``, or one ``brainstem dashboard``
  makes at start and prints once, in the URL to open). Being on this machine is not enough: a tool the
  agent wrote can reach loopback too. A request without the token is 401 with a short page saying how to
  get in, before any route runs: no page, script, stylesheet or 404 of this app answers it. A token made
  at start lives in the dashboard's process only (which redacts it from its pages like any secret it
  knows): the runtime that runs the agent's code never holds it, so its scrubber has nothing to look for.
* The token comes as ``Authorization: Bearer TOKEN`` (scripts), or as ``?token=TOKEN`` on a GET of any
  page (the link printed at start), which sets a cookie for the rest of the visit and redirects to the
  same address without it, so the token leaves the address bar and the history. The cookie holds a value
  derived from the token (:attr:`Gate.cookie_value`), not the token: a browser sends cookies to every port
  of a host, and what it sends elsewhere is not the token a script would use. When a Bearer
  ``Authorization`` header is present, it is what is judged (a wrong one is 401 whatever the cookie).
* Every action is a POST. One authenticated by the cookie also carries the CSRF token of its page: a
  token this server signed (HMAC-SHA256 over a random browser identifier and an expiry,
  :class:`CsrfSigner`), sent both as a cookie and as a form field; missing, expired, not the cookie's, or
  not signed by this server is 403. A browser attaches the cookie to a request another site makes it
  send, so the cookie alone cannot tell the operator's own form from another site's. A Bearer header is
  different: a browser never adds one by itself, and another site's script can set it only through a
  CORS preflight this server never answers, so a request that carries the right one was written by
  someone holding the token. Bearer POSTs need no CSRF token.
* An action a browser says another origin sent (``Sec-Fetch-Site`` other than ``same-origin``, or else an
  ``Origin`` that does not name this ``Host``) is 403 before anything else is looked at, whatever it
  carries: a page on another port of this host is the same *site*, so its forms arrive with the
  SameSite cookie; the CSRF token stops them, and this stops them first. A client that sends neither
  header (a script, an old browser) is judged by the token and the CSRF token alone.
* On a loopback bind, the request's ``Host`` must name loopback as well (DNS rebinding): defence in depth.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from urllib.parse import urlencode, urlsplit

from brainstem.core.errors import ConfigError

TOKEN_ENV = "BRAINSTEM_DASHBOARD_TOKEN"
TOKEN_QUERY = "token"
TOKEN_COOKIE = "brainstem_session"
CSRF_COOKIE = "brainstem_csrf"
CSRF_FIELD = "csrf"
MIN_TOKEN_LEN = 16
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
CSRF_TTL = 12 * 3600  # seconds a page's CSRF token is good for
_CSRF_SHAPE = re.compile(r"([A-Za-z0-9_-]{16,64})\.([0-9]{1,12})\.([A-Za-z0-9_-]{43})")
_TOKEN_SHAPE = re.compile(r"[\x21-\x7e]+")  # what a header, a URL and a terminal all carry as it is
BEARER = "bearer"
QUERY = "query"
COOKIE = "cookie"

# The whole answer to a request without the token: nothing from the store, nothing that varies.
UNAUTHORIZED_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>brainstem dashboard: token needed</title></head>
<body><h1>This dashboard needs its token</h1>
<p>Open the address <code>brainstem dashboard</code> printed when it started (it ends in
<code>?{TOKEN_QUERY}=</code>), or enter the token (<code>{TOKEN_ENV}</code> when it is set) here.
Scripts send <code>Authorization: Bearer TOKEN</code>.</p>
<form method="get"><input type="password" name="{TOKEN_QUERY}" placeholder="token" autocomplete="off">
<button type="submit">Open</button></form>
</body></html>
"""


def new_token() -> str:
    """A token for a dashboard started without ``BRAINSTEM_DASHBOARD_TOKEN``."""
    return secrets.token_urlsafe(32)


def check_token(token: object) -> str:
    """The token, if it is one a browser and a script can both carry and nobody guesses; else a ConfigError."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LEN or not _TOKEN_SHAPE.fullmatch(token):
        raise ConfigError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_LEN} printable ASCII characters without "
                          f"spaces (a long random string: openssl rand -hex 24); unset, the dashboard makes one")
    return token


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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


def same_origin(headers) -> bool:
    """Whether a browser's request comes from this dashboard's own pages, as far as its headers say (see
    above): behind a reverse proxy that rewrites ``Host``, ``Sec-Fetch-Site`` is what decides."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.strip().lower() in ("same-origin", "none")  # none: the operator's own navigation
    origin = headers.get("origin")
    if origin is None:
        return True
    try:
        return origin != "null" and urlsplit(origin.strip()).netloc.lower() == (headers.get("host") or "").lower()
    except ValueError:
        return False


def same(a: object, b: object) -> bool:
    """Both non-empty text, and equal (in constant time). A form field may be an upload, never a match."""
    return isinstance(a, str) and isinstance(b, str) and bool(a) and bool(b) \
        and hmac.compare_digest(a.encode(), b.encode())


def _derived(token: str, purpose: bytes) -> bytes:
    return hmac.new(token.encode(), b"brainstem dashboard " + purpose, hashlib.sha256).digest()


def signing_key(token: str) -> bytes:
    """The CSRF signing key, derived from the token: pages stay valid across a restart with the same token."""
    return _derived(check_token(token), b"csrf v1")


class Gate:
    """The dashboard's token, and whether (and how) a request shows it holds it."""

    def __init__(self, token: str):
        self.token = check_token(token)
        self.cookie_value = base64.urlsafe_b64encode(_derived(token, b"cookie v1")).rstrip(b"=").decode()

    def admits(self, method: str, headers, query, cookies) -> str | None:
        """``BEARER``, ``QUERY`` or ``COOKIE``: how the request carries the token; None when it does not."""
        scheme, _, value = (headers.get("authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer":  # present, it is what is judged: a wrong one is not rescued by a cookie
            return BEARER if same(value.strip(), self.token) else None
        # Another scheme is not ours (a reverse proxy's Basic login passes through): the cookie decides.
        if method in ("GET", "HEAD") and TOKEN_QUERY in query:
            values = query.getlist(TOKEN_QUERY)
            return QUERY if len(values) == 1 and same(values[0], self.token) else None
        return COOKIE if same(cookies.get(TOKEN_COOKIE), self.cookie_value) else None


def without_token(raw_path: bytes, query) -> str:
    """Where a ``?token=`` link goes next: the same path and query, less the token. Always a path on this
    server (``//host`` would name another one)."""
    path = "/" + raw_path.decode("latin-1").lstrip("/")
    rest = [(k, v) for k, v in query.multi_items() if k != TOKEN_QUERY]
    return path + ("?" + urlencode(rest) if rest else "")


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
