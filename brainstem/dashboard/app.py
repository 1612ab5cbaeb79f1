"""The dashboard: a small Starlette app over the store, its pages rendered on the server.

Every page reads the store through :mod:`.views`; the only writes are the
operator's actions (a rollback, a review verdict), each a CSRF-checked POST
that needs the token when one is set (:mod:`.auth`). Every value shown passes
the redactor of the secrets this process knows, and ``secret:*`` values are
never read for display at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import keys
from ..errors import BadArgument, BrainstemError
from ..karma import Redactor
from . import auth, charts, views

TEMPLATES = Path(__file__).parent / "templates"
REDACTOR_TTL = 30.0


class Dashboard:
    """The app's state: the agents' stores (by name, "" for the default agent), settings, the token."""

    def __init__(self, settings, stores: dict[str, Any], token: str | None, loopback_only: bool):
        self.settings = settings
        self.stores = stores
        self.token = token
        self.loopback_only = loopback_only
        self._redactor: Redactor | None = None
        self._redactor_at = 0.0
        env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, finalize=self._finalize)
        env.filters["usd"] = lambda v, d=4: "-" if v is None else f"${float(v):.{d}f}"
        env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, default=str)
        self.env = env

    @property
    def redact(self) -> Redactor:
        """The secrets this process knows (settings) and the ``secret:*`` values of the agents shown: a value
        copied out of a secret into an ordinary key (or karma) is still never shown. Re-read every 30 s."""
        import time

        if self._redactor is None or time.monotonic() - self._redactor_at > REDACTOR_TTL:
            r = Redactor(self.settings.known_secrets())
            for store in self.stores.values():
                try:
                    for info in store.list_all(keys.SECRET_PREFIX):
                        try:
                            r.add(info.name, store.get_text(info.name))
                        except BrainstemError:  # not text: nothing a page could print either
                            continue
                except BrainstemError:
                    pass  # the store is away: the pages will say so
            self._redactor, self._redactor_at = r, time.monotonic()
        return self._redactor

    def _finalize(self, value: Any) -> Any:
        """Every value a template prints is redacted first (before escaping, where the secret is whole)."""
        if isinstance(value, Markup):
            return Markup(self.redact.text(str(value)))
        if isinstance(value, str):
            return self.redact.text(value)
        return value

    # --- helpers for handlers ---
    def agent(self, request: Request) -> tuple[str, Any]:
        name = request.query_params.get("agent", next(iter(self.stores)))
        if name not in self.stores:
            raise _NotFound(f"no agent {name!r} here (this dashboard shows: "
                            f"{', '.join(n or '(default)' for n in self.stores)})")
        return name, self.stores[name]

    def can_act(self, request: Request) -> bool:
        return self.token is None or auth.same(auth.presented_token(request.headers, request.cookies), self.token)

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        name = request.query_params.get("agent", next(iter(self.stores)))
        csrf = request.cookies.get(auth.CSRF_COOKIE) or auth.new_csrf()

        def url(path: str, **params: Any) -> str:
            params = {k: v for k, v in params.items() if v not in (None, "")}
            if len(self.stores) > 1 or name:
                params.setdefault("agent", name)
            return path + ("?" + urlencode(params) if params else "")

        html = self.env.get_template(template).render(
            request=request, url=url, agent=name, agents=list(self.stores), csrf=csrf, csrf_field=auth.CSRF_FIELD,
            can_act=self.can_act(request), token_set=self.token is not None, **context)
        response = HTMLResponse(self.redact.text(html), status_code=status)
        if request.cookies.get(auth.CSRF_COOKIE) != csrf:
            response.set_cookie(auth.CSRF_COOKIE, csrf, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response

    def json(self, data: Any) -> Response:
        text = json.dumps(data, ensure_ascii=False, default=str)
        return Response(self.redact.text(text), media_type="application/json")


class _NotFound(Exception):
    pass


def _viewing(request: Request) -> tuple[Dashboard, str, Any]:
    """The dashboard, and the agent (name, store) a page is asked for (``?agent=``)."""
    d: Dashboard = request.app.state.dashboard
    name, store = d.agent(request)
    return d, name, store


def _plain(status: int, text: str) -> Response:
    return Response(f"{status}: {text}", status_code=status, media_type="text/plain")


def _csrf_ok(request: Request, form) -> bool:
    return auth.same(form.get(auth.CSRF_FIELD), request.cookies.get(auth.CSRF_COOKIE))


async def _action(request: Request, act) -> Response:
    """One operator action: refused without the page's CSRF token (403), without the token when one is set
    (401), or for an agent this dashboard does not show (400); then ``act(store, form)`` -> (page to go back
    to, what was done). A :class:`BrainstemError` from it is a 400 naming why; nothing was written."""
    d: Dashboard = request.app.state.dashboard
    form = await request.form()
    if not _csrf_ok(request, form):
        return _plain(403, "this form's CSRF token is missing or stale; reload the page and try again")
    if not d.can_act(request):
        return _plain(401, f"actions need {auth.TOKEN_ENV} (log in at /login)")
    name = str(form.get("agent") or next(iter(d.stores)))
    store = d.stores.get(name)
    if store is None:
        return _plain(400, f"no agent {name!r} here")
    try:
        path, done = act(store, form)
    except BrainstemError as exc:
        return _plain(400, str(exc))
    query = urlencode({**({"agent": name} if name else {}), "done": done})
    return RedirectResponse(f"{path}?{query}", status_code=303)


# --- pages ---

async def overview(request: Request) -> Response:
    from ..review import items
    from ..status import status

    d, name, store = _viewing(request)
    report = status(store, d.settings)
    return d.page(request, "overview.html", title="Overview", report=report, pending=len(items(store)))


async def sessions(request: Request) -> Response:
    d, name, store = _viewing(request)
    page = views.sessions_page(store, outcome=request.query_params.get("outcome") or None,
                               page=_int(request.query_params.get("page"), 1))
    page["rows"] = [d.redact(h) for h in page["rows"]]  # before the template cuts a summary to its width
    per_session = charts.bars([(str(h.get("id")), float(h.get("cost") or 0)) for h in page["rows"][::-1]],
                              ceiling=d.settings.max_session_cost, title="cost per session (this page)")
    per_day = charts.bars([(day["day"], float(day["cost"])) for day in page["days"]],
                          ceiling=d.settings.max_daily_cost, title="cost per UTC day")
    return d.page(request, "sessions.html", title="Sessions", p=page, chart_sessions=Markup(per_session),
                  chart_days=Markup(per_day))


async def session(request: Request) -> Response:
    d, name, store = _viewing(request)
    sid = request.path_params["sid"]
    tl = views.timeline(store, sid, redact=d.redact.text)
    if tl is None:
        return d.page(request, "error.html", status=404, title="No such session",
                      message=f"no karma for session {sid!r} (unknown, or trimmed by retention)")
    return d.page(request, "session.html", title=f"Session {sid}", tl=tl)


async def live(request: Request) -> Response:
    d, name, store = _viewing(request)
    return d.page(request, "live.html", title="Live", latest=views.latest_session(store))


async def api_karma(request: Request) -> Response:
    from ..timeline import format_entry

    d, name, store = _viewing(request)
    sid = request.query_params.get("session") or views.latest_session(store)
    after = max(0, _int(request.query_params.get("after"), 0))
    if not sid:
        return d.json({"session": None, "entries": [], "next": 0})
    from .. import karma as karma_mod

    entries = karma_mod.read(store, sid, after)
    return d.json({"session": sid, "latest": views.latest_session(store), "next": after + len(entries),
                   "entries": [{"event": e.get("event"), "line": format_entry(d.redact(e))} for e in entries]})


async def changes(request: Request) -> Response:
    d, name, store = _viewing(request)
    return d.page(request, "changes.html", title="Self-modification", rows=views.versioned_keys(store))


async def key_history(request: Request) -> Response:
    d, name, store = _viewing(request)
    key = request.path_params["key"]
    h = views.key_history(store, key, _int(request.query_params.get("a"), None), _int(request.query_params.get("b"),
                                                                                       None))
    message = request.query_params.get("done")
    return d.page(request, "key_history.html", title=f"History of {key}", h=h, message=message)


async def rollback(request: Request) -> Response:
    from ..versions import rollback as do_rollback

    def act(store, form):
        key = str(form.get("key") or "")
        if not keys.is_privileged(key):
            raise BadArgument(f"{key!r} is not a versioned key")
        done = do_rollback(store, key, _int(form.get("version"), None), source="operator:dashboard")
        return f"/changes/{key}", f"restored version {done['restored_version']} as version {done['new_version']}"
    return await _action(request, act)


async def store_keys(request: Request) -> Response:
    d, name, store = _viewing(request)
    key = request.query_params.get("key")
    if key:
        return d.page(request, "key.html", title=key, k=views.key_value(store, key, redact=d.redact.text))
    listing = views.key_list(store, request.query_params.get("prefix") or "", _int(request.query_params.get("page"), 1))
    return d.page(request, "store.html", title="The store", s=listing)


async def review_page(request: Request) -> Response:
    from ..reflexes import ReflexError, load
    from ..review import items, tool_records

    d, name, store = _viewing(request)
    rules, fired, problem = [], {}, None
    try:
        rules, fired = load(store)
    except ReflexError as exc:
        problem = str(exc)
    newest = items(store, include_settled=True)[-200:][::-1]
    return d.page(request, "review.html", title="Review and reflexes", items=newest,
                  records=tool_records(store), rules=rules, fired=fired,
                  problem=problem, message=request.query_params.get("done"))


async def review_act(request: Request) -> Response:
    from ..review import settle

    item_id = request.path_params["item"]

    def act(store, form):
        if form.get("verdict") == "confirm":
            item = settle(store, item_id, confirm=True)
        else:
            item = settle(store, item_id, correction=str(form.get("correction") or ""))
        return "/review", f"review item {item_id} {item['status']}"
    return await _action(request, act)


async def login(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    if request.method == "GET":
        return d.page(request, "login.html", title="Log in")
    form = await request.form()
    if not _csrf_ok(request, form):
        return _plain(403, "CSRF token missing or stale; reload the page")
    if d.token is None or not auth.same(str(form.get("token") or ""), d.token):
        return _plain(401, "wrong token")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(auth.TOKEN_COOKIE, d.token, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


def _int(value: Any, default: Any) -> Any:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


# --- the app ---

def make_app(settings, stores: dict[str, Any], *, token: str | None, loopback_only: bool) -> Starlette:
    d = Dashboard(settings, stores, token, loopback_only)
    routes = [
        Route("/", overview), Route("/sessions", sessions), Route("/sessions/{sid}", session),
        Route("/live", live), Route("/api/karma", api_karma), Route("/changes", changes),
        Route("/changes/{key:path}", key_history), Route("/rollback", rollback, methods=["POST"]),
        Route("/store", store_keys), Route("/review", review_page),
        Route("/review/{item}", review_act, methods=["POST"]), Route("/login", login, methods=["GET", "POST"]),
    ]
    async def guard(request: Request, call_next):
        if not auth.host_allowed(request.headers.get("host"), loopback_only):
            return _plain(403, "this dashboard answers only to a loopback Host")
        try:
            response = await call_next(request)
        except _NotFound as exc:
            return _plain(404, str(exc))
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Content-Security-Policy",
                                    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                    "script-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
        return response

    app = Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])
    app.state.dashboard = d
    return app
