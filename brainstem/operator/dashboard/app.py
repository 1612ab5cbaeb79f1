"""The dashboard: a small Starlette app over the store, its pages rendered on the server.

Every request needs the dashboard token, loopback included; without it the answer is 401 and a
short page that holds nothing from the store (:mod:`.auth`). Every page reads the store through
:mod:`.views`; the only writes are the operator's actions (a rollback, a review verdict, a message to the
agent; wake now, a dry run or a replay, each the command line's own run as a process, :mod:`.actions`), each
a POST from this dashboard's own origin, carrying a CSRF token this server signed unless it came with a
Bearer header.

Everything in the store is the agent's to write (key names, values, karma, tool
names, review items, even the names of ``secret:*`` keys), so every string a
page prints is treated as hostile text: redacted of the secrets this process
knows, then escaped, in that order, always (a redaction label is text too). The
only markup printed as is is a chart :mod:`.charts` drew from escaped pieces.
``secret:*`` values are never read for display at all. No page carries inline
script or style: the CSP allows neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, Undefined
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from brainstem.core import keys
from brainstem.core.clock import now_utc
from brainstem.core.errors import BadArgument, BrainstemError
from brainstem.core.secrets import PCHAR_SAFE
from brainstem.operator import output
from brainstem.operator.dashboard import actions, auth, charts, views
from brainstem.state import secret_marks
from brainstem.store import karma as karma_mod
from brainstem.store.karma import Redactor

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
REDACTOR_TTL = 30.0
AUTH_SCOPE = "brainstem.auth"  # how the request carried the token (auth.BEARER, auth.COOKIE), for _action
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class Dashboard:
    """The app's state: the agents' stores (by name, "" for the default agent), settings, the token."""

    def __init__(self, settings, stores: dict[str, Any], token: str, loopback_only: bool):
        self.settings = settings
        self.stores = stores
        self.gate = auth.Gate(token)
        self.loopback_only = loopback_only
        self.csrf = auth.CsrfSigner(auth.signing_key(token))
        self.actions = actions.Actions()
        self.static = {name: (STATIC / name).read_bytes() for name in STATIC_TYPES}
        self._redactor: Redactor | None = None
        self._redactor_at = 0.0
        env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, finalize=self._finalize)
        env.filters["usd"] = _usd
        env.filters["kind"] = views.kind_name
        env.filters["ceiling"] = output.ceiling
        env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, default=str)
        self.env = env

    @property
    def redact(self) -> Redactor:
        """The secrets this process knows (settings, and this dashboard's token even when it made it at
        start) and the ``secret:*`` values of the agents shown, but for those the agent wrote itself (see
        :mod:`brainstem.state.secret_marks`): a value copied out of a secret into an ordinary key (or karma)
        is still never shown, and the agent cannot choose text to hide. Re-read every 30 s."""
        import time

        if self._redactor is None or time.monotonic() - self._redactor_at > REDACTOR_TTL:
            r = Redactor({**self.settings.known_secrets(), auth.TOKEN_ENV: self.gate.token})
            for store in self.stores.values():
                try:
                    for name, value in secret_marks.operator_secrets(store).items():
                        r.add(name, value)
                except BrainstemError:
                    pass  # the store is away: the pages will say so
            self._redactor, self._redactor_at = r, time.monotonic()
        return self._redactor

    def _finalize(self, value: Any) -> Markup:
        """Every value a template prints: as text, redacted (where a secret is whole, and the label it
        leaves is text like the rest), then escaped. Markup other than a chart drawn here (a filter's
        output, a template constant) is taken back to its text first, so nothing reaches a page as HTML
        that this package did not build from escaped pieces."""
        if type(value) is charts.Drawn:
            return value
        text = value.unescape() if isinstance(value, Markup) else str(value)
        return escape(self.redact.text(text))

    # --- helpers for handlers ---
    def agent(self, request: Request) -> tuple[str, Any]:
        name = request.query_params.get("agent", next(iter(self.stores)))
        if name not in self.stores:
            raise _NotFound(f"no agent {name!r} here (this dashboard shows: "
                            f"{', '.join(n or '(default)' for n in self.stores)})")
        return name, self.stores[name]

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        name = request.query_params.get("agent", next(iter(self.stores)))
        # The browser's CSRF token while it has more than half its life left; else a fresh one (and cookie).
        csrf = request.cookies.get(auth.CSRF_COOKIE)
        if self.csrf.remaining(csrf) <= self.csrf.ttl / 2:
            csrf = self.csrf.issue()

        def url(path: str, **params: Any) -> str:
            agent = params.pop("agent", name)  # a link to another agent's page names it (/schedules has them all)
            params = {k: v for k, v in params.items() if v not in (None, "")}
            if len(self.stores) > 1 or agent:
                params["agent"] = agent
            return local_path(path) + ("?" + urlencode(params) if params else "")

        html = self.env.get_template(template).render(
            request=request, url=url, path=local_path, agent=name, agents=list(self.stores), csrf=csrf,
            csrf_field=auth.CSRF_FIELD, **context)
        # Not redacted again as a whole: every value was redacted as text before it was escaped, and a
        # label put into finished HTML would land unescaped (or cut through the page's own markup).
        response = HTMLResponse(html, status_code=status)
        if request.cookies.get(auth.CSRF_COOKIE) != csrf:
            response.set_cookie(auth.CSRF_COOKIE, csrf, max_age=self.csrf.ttl, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response

    def json(self, data: Any) -> Response:
        """Redacted as data, then encoded: a label is a JSON string like any other, never spliced into JSON."""
        text = json.dumps(self.redact(data), ensure_ascii=False, default=str)
        return Response(text, media_type="application/json")


class _NotFound(Exception):
    pass


def local_path(path: str) -> str:
    """One of our paths, ``/ROUTE`` or ``/ROUTE/NAME`` with NAME from the store (a key, a session id),
    percent-encoded: whatever NAME holds (``/``, ``..``, ``?``, ``#``, quotes, spaces) stays one path
    segment of this route, and the result always starts with ``/`` and never ``//``."""
    route, sep, name = path.lstrip("/").partition("/")
    # The encoding the redactor knows (a secret copied into a name is caught in the link too).
    return "/" + quote(route, safe="") + sep + quote(name, safe=PCHAR_SAFE)


def _usd(value: Any, digits: int = 4) -> str:
    if value is None or isinstance(value, Undefined):  # a field the entry does not have
        return "-"
    try:
        return f"${float(value):.{int(digits)}f}"
    except (TypeError, ValueError, OverflowError):
        return str(value)  # not a number: shown as the text it is (escaped like any other)


def _viewing(request: Request) -> tuple[Dashboard, str, Any]:
    """The dashboard, and the agent (name, store) a page is asked for (``?agent=``)."""
    d: Dashboard = request.app.state.dashboard
    name, store = d.agent(request)
    return d, name, store


def _plain(status: int, text: str) -> Response:
    return Response(f"{status}: {text}", status_code=status, media_type="text/plain")


def _csrf_ok(request: Request, form) -> bool:
    """The form's token is the browser's cookie, and one this server signed that has not expired."""
    d: Dashboard = request.app.state.dashboard
    return d.csrf.check(form.get(auth.CSRF_FIELD), request.cookies.get(auth.CSRF_COOKIE))


def _agent_of(d: Dashboard, form) -> str:
    """The agent a form acts for (its ``agent`` field; the first shown when it has none)."""
    return str(form.get("agent") or next(iter(d.stores)))


async def _action(request: Request, act) -> Response:
    """One operator action (the token was checked before any route ran): refused when the browser says it
    comes from another origin (403, whatever it carries), without the page's CSRF token when the token came
    in the cookie (403; a Bearer header is never sent cross-site, see :mod:`.auth`), or for an agent this
    dashboard does not show (400); then ``act(store, form)`` -> (page to go to, what was done). A
    :class:`BrainstemError` from it is a 400 naming why; nothing was done."""
    d: Dashboard = request.app.state.dashboard
    if not auth.same_origin(request.headers):
        return _plain(403, "this form was sent from another site's page; use the dashboard's own")
    form = await request.form()
    if request.scope.get(AUTH_SCOPE) != auth.BEARER and not _csrf_ok(request, form):
        return _plain(403, "this form's CSRF token is missing or stale; reload the page and try again")
    name = _agent_of(d, form)
    store = d.stores.get(name)
    if store is None:
        return _plain(400, f"no agent {name!r} here")
    try:
        path, done = act(store, form)
    except BrainstemError as exc:
        return _plain(400, str(exc))
    query = urlencode({**({"agent": name} if name else {}), **({"done": done} if done else {})})
    return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)


# --- pages ---

async def overview(request: Request) -> Response:
    from brainstem.operator.status import status
    from brainstem.state.review import items

    d, name, store = _viewing(request)
    report = status(store, d.settings)
    return d.page(request, "overview.html", title="Overview", report=report, pending=len(items(store)),
                  alive=views.liveness(store, d.settings), busy=d.actions.running(name),
                  recent=[a.public() for a in d.actions.recent(name)])


async def sessions(request: Request) -> Response:
    d, name, store = _viewing(request)
    page = views.sessions_page(store, outcome=request.query_params.get("outcome") or None,
                               page=_int(request.query_params.get("page"), 1))
    page["rows"] = [d.redact(h) for h in page["rows"]]  # before the template cuts a summary to its width
    # The charts are printed as drawn, so their labels are redacted here (they escape them themselves).
    per_session = charts.bars([(str(h.get("id")), charts.number(h.get("cost"))) for h in page["rows"][::-1]],
                              ceiling=d.settings.max_session_cost, title="cost per session (this page)")
    per_day = charts.bars([(d.redact.text(str(day["day"])), charts.number(day["cost"])) for day in page["days"]],
                          ceiling=d.settings.max_daily_cost, title="cost per UTC day")
    return d.page(request, "sessions.html", title="Sessions", p=page, chart_sessions=per_session,
                  chart_days=per_day, unlisted=views.unlisted(store))


async def session(request: Request) -> Response:
    d, name, store = _viewing(request)
    sid = request.path_params["sid"]
    tl = views.timeline(store, sid, redact=d.redact.text)
    schedule_id = views.run_of(sid)  # a schedule's run keeps its karma as a session does: shown the same way
    what = "session" if schedule_id is None else "schedule run"
    if tl is None:
        return d.page(request, "error.html", status=404, title=f"No such {what}",
                      message=f"no karma for {what} {sid!r} (unknown, or trimmed by retention)")
    return d.page(request, "session.html", title=f"{what.capitalize()} {sid}", tl=tl, schedule_id=schedule_id)


async def schedules_page(request: Request) -> Response:
    """Every agent's schedules, one table each (a schedule runs whichever agent the pages are switched to).
    Read-only: the commands change them."""
    d, name, store = _viewing(request)
    now = now_utc()
    tables = [{"agent": agent, **views.schedules_page(s, now, redact=d.redact.text)}
              for agent, s in d.stores.items()]
    return d.page(request, "schedules.html", title="Schedules", tables=tables,
                  min_interval=d.settings.schedule_min_interval, max_count=d.settings.schedule_max)


async def live(request: Request) -> Response:
    d, name, store = _viewing(request)
    return d.page(request, "live.html", title="Live", latest=views.latest_session(store))


async def api_karma(request: Request) -> Response:
    from brainstem.core.timeline import format_entry

    d, name, store = _viewing(request)
    sid = request.query_params.get("session") or views.latest_session(store)
    after = max(0, _int(request.query_params.get("after"), 0))
    if not sid:
        return d.json({"session": None, "entries": [], "next": 0})
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
    from brainstem.state.versions import rollback as do_rollback

    def act(store, form):
        key = str(form.get("key") or "")
        if not keys.is_privileged(key):
            raise BadArgument(f"{key!r} is not a versioned key")
        done = do_rollback(store, key, _int(form.get("version"), None), source="operator:dashboard")
        return (local_path(f"/changes/{key}"),
                f"restored version {done['restored_version']} as version {done['new_version']}")
    return await _action(request, act)


async def store_keys(request: Request) -> Response:
    d, name, store = _viewing(request)
    key = request.query_params.get("key")
    if key:
        return d.page(request, "key.html", title=key, k=views.key_value(store, key, redact=d.redact.text))
    listing = views.key_list(store, request.query_params.get("prefix") or "", _int(request.query_params.get("page"), 1))
    return d.page(request, "store.html", title="The store", s=listing)


async def review_page(request: Request) -> Response:
    from brainstem.state.reflexes import ReflexError, load
    from brainstem.state.review import items, tool_records

    d, name, store = _viewing(request)
    rules, fired, problem = [], {}, None
    try:
        rules, fired = load(store)
    except ReflexError as exc:
        problem = str(exc)
    newest = items(store, include_settled=True)[-200:][::-1]
    return d.page(request, "review.html", title="Review and reflexes", items=newest,
                  records=tool_records(store), rules=rules, fired=fired,
                  pending=views.pending_code(store, redact=d.redact.text),
                  problem=problem, message=request.query_params.get("done"))


async def review_act(request: Request) -> Response:
    from brainstem.state.review import settle

    item_id = request.path_params["item"]

    def act(store, form):
        if form.get("verdict") == "confirm":
            item = settle(store, item_id, confirm=True)
        else:
            item = settle(store, item_id, correction=str(form.get("correction") or ""))
        return "/review", f"review item {item_id} {item['status']}"
    return await _action(request, act)


async def inbox_page(request: Request) -> Response:
    from brainstem.state import inbox

    d, name, store = _viewing(request)
    newest = inbox.messages(store, limit=200)[::-1]
    return d.page(request, "inbox.html", title="Inbox", messages=newest, summary=inbox.summary(store),
                  message=request.query_params.get("done"))


async def tell(request: Request) -> Response:
    """The operator leaves the agent a message (``brainstem tell``), urgent when the box is ticked."""
    from brainstem.state import inbox

    def act(store, form):
        urgent = form.get("urgent") in ("1", "on", "true")
        try:
            msg = inbox.post(store, str(form.get("text") or ""), sender="operator", urgent=urgent,
                             extra={"via": "dashboard"})
        except inbox.InboxError as exc:
            raise BadArgument(str(exc)) from None
        return "/inbox", f"message {msg['id']} left{' (urgent: the agent is due now)' if urgent else ''}"
    return await _action(request, act)


async def run_action(request: Request) -> Response:
    """Wake now, a dry run or a replay (``do``; ``session`` for a replay), run as the command line runs them
    (:mod:`.actions`); then the action's page, which shows how it ends."""
    def act(store, form):
        d: Dashboard = request.app.state.dashboard
        started = d.actions.start(str(form.get("do") or ""), _agent_of(d, form), str(form.get("session") or "") or None)
        return local_path(f"/actions/{started.id}"), ""
    return await _action(request, act)


def _started(request: Request) -> tuple[Dashboard, actions.Action]:
    """The action a page or the API asks for, started for the agent it is asked for; else a 404."""
    d, name, store = _viewing(request)
    found = d.actions.get(request.path_params["id"])
    if found is None or found.agent != name:
        raise _NotFound(f"no such action here (this dashboard keeps its last {actions.KEEP}, until it restarts)")
    return d, found


async def action_page(request: Request) -> Response:
    d, found = _started(request)
    return d.page(request, "action.html", title=f"{found.name.capitalize()} {found.id}", a=found.public())


async def api_action(request: Request) -> Response:
    d, found = _started(request)
    return d.json(found.public())


async def static(request: Request) -> Response:
    """The dashboard's one script and one stylesheet (the CSP allows no inline ones)."""
    d: Dashboard = request.app.state.dashboard
    name = request.path_params["name"]
    if name not in d.static:
        return _plain(404, "no such file")
    return Response(d.static[name], media_type=STATIC_TYPES[name], headers={"Cache-Control": "no-cache"})


def _int(value: Any, default: Any) -> Any:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


# --- the app ---

def _admit(request: Request, gate: auth.Gate) -> Response | None:
    """The answer to a request that does not carry the token (401), or to a ``?token=`` link (the cookie,
    and the same address without the token); None for a request that goes on to its route."""
    how = gate.admits(request.method, request.headers, request.query_params, request.cookies)
    if how is None:
        return HTMLResponse(auth.UNAUTHORIZED_PAGE, status_code=401, headers={
            "WWW-Authenticate": 'Bearer realm="brainstem dashboard"', "Cache-Control": "no-store"})
    if how == auth.QUERY:
        response = RedirectResponse(auth.without_token(request.scope.get("raw_path") or b"/", request.query_params),
                                    status_code=303)
        response.set_cookie(auth.TOKEN_COOKIE, gate.cookie_value, path="/", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response
    request.scope[AUTH_SCOPE] = how
    return None


def make_app(settings, stores: dict[str, Any], *, token: str, loopback_only: bool) -> Starlette:
    d = Dashboard(settings, stores, token, loopback_only)
    routes = [
        Route("/", overview), Route("/sessions", sessions), Route("/sessions/{sid}", session),
        Route("/live", live), Route("/api/karma", api_karma), Route("/changes", changes),
        Route("/changes/{key:path}", key_history), Route("/rollback", rollback, methods=["POST"]),
        Route("/store", store_keys), Route("/review", review_page),
        Route("/review/{item}", review_act, methods=["POST"]), Route("/inbox", inbox_page),
        Route("/tell", tell, methods=["POST"]), Route("/schedules", schedules_page), Route("/static/{name}", static),
        Route("/actions", run_action, methods=["POST"]), Route("/actions/{id}", action_page),
        Route("/api/actions/{id}", api_action),
    ]
    async def guard(request: Request, call_next):
        if not auth.host_allowed(request.headers.get("host"), loopback_only):
            return _plain(403, "this dashboard answers only to a loopback Host")
        try:
            response = _admit(request, d.gate) or await call_next(request)
        except _NotFound as exc:
            return _plain(404, str(exc))
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Content-Security-Policy", CSP)
        return response

    app = Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])
    app.state.dashboard = d
    return app
