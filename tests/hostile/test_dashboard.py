"""The dashboard against a store the agent filled with hostile text, in-process (Starlette's ``TestClient``).

The agent writes key names and values, ``secret:*`` keys (whose names become redaction
labels), karma, tool names and review items. Here each of those holds HTML/JS payloads
drawn by ``hypothesis`` (script tags, attribute breakers, ``javascript:`` URLs, strings
that look like redaction labels, unicode), and every page reachable from ``/`` is parsed:
no element, attribute, inline script or style and no unsafe URL may come from the store.

Then the headers (a CSP without inline script), and CSRF: a token is one this server
signed, so a cookie and field a client picked itself are refused on every POST the
dashboard's cookie authenticates, while the token a page carries works. Last, the same
hostile store in a real browser (Chromium): nothing runs, and the CSP refuses nothing
the pages need.
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import tempfile
import threading
import time
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import hypothesis
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.operator.dashboard import auth, charts
from brainstem.state import history as session_history
from brainstem.state import inbox, review, versions
from brainstem.store import karma
from brainstem.store.sqlite.store import SQLiteStore
from tests.dashboard_client import TOKEN, TestClient, app_for, client, dashboard_settings

LLM_KEY = "sk-or-v1-hostile-0123456789abcdef"
SID = "7-abcdef"
MARK = "1337"  # every fixed payload's script says alert(1337)

FIXED = [
    "<script>alert(1337)</script>",
    '"><img src=x onerror=alert(1337)>',
    "'><svg/onload=alert(1337)>",
    "x<svg/onload=alert(1337)>",
    "javascript:alert(1337)",
    " JaVaScRiPt:alert(1337)",
    "data:text/html,<script>alert(1337)</script>",
    "</textarea><script>alert(1337)</script>",
    "</pre></td></tr></table><iframe src=javascript:alert(1337)>",
    "</title><script>alert(1337)</script>",
    "</script><script>alert(1337)</script>",
    '" onmouseover="alert(1337)" x="',
    "' autofocus onfocus='alert(1337)",
    " onfocus=alert(1337) autofocus ",
    "<a href=javascript:alert(1337)>click</a>",
    "<style>*{display:none}</style>",
    "<base href=//evil.example/>",
    "<meta http-equiv=refresh content=0;url=//evil.example>",
    "[REDACTED:secret:x]",
    "[REDACTED:<b>x</b>]",
    "[REDACTED:OPENROUTER_API_KEY]",
    "&lt;script&gt;alert(1337)&lt;/script&gt;",
    "&#60;script&#62;alert(1337)&#60;/script&#62;",
    "%3Cscript%3Ealert(1337)%3C/script%3E",
    "<!--", "-->", "<![CDATA[", "]]>",
    "{{ 7*7 }}{% raw %}", "${alert(1337)}",
    "\u202e<script>alert(1337)</script>",
    "ünïcødé 𝔘𝔫𝔦 \u200b\ufeff 漢字 🙂",
    "//evil.example/x", "\\\\evil.example\\x", "../../rollback", "?done=<b>x</b>#frag",
]
# Text an agent could write: anything but lone surrogates (not text) and NUL (not storable as text).
_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
_text = st.text(_chars, min_size=1, max_size=40)
HOSTILE = st.one_of(st.sampled_from(FIXED), _text, st.builds(str.__add__, st.sampled_from(FIXED), _text),
                    st.builds(str.__add__, _text, st.sampled_from(FIXED)))
PLANTED = ("notes", "tooldata:", "prompt:", "secret:", keys.CONFIG_REFLEXES)
# Key names: no control characters (the agent's writes refuse them), never blank, none of the keys
# planted below, the runtime's own or the store's internals (``__``: no agent can write them).
NAME = HOSTILE.map(lambda s: "".join(c for c in s if c.isprintable() or c == " ").strip()).filter(
    lambda n: n and not n.startswith((*PLANTED, "__")) and not keys.is_runtime_owned(n))
# A secret the agent stored: hostile and ending in a tag no page's own words contain (so finding it in a
# page means it leaked), or one of the pages' own words and markup (so a redaction of the finished page,
# rather than of each value, would put the label into the page's markup).
TAGGED = re.compile(r"-[0-9a-f]{10}\Z")
PAGE_WORDS = ["brainstem", "Overview", "Sessions", "class=", 'class="muted"', "href=", "<td>", "</td><td>",
              "/sessions", "/static/app.js", "data-session", "value=", "<pre>", "csrf", "</a>"]
SECRET_VALUE = st.one_of(st.builds(lambda p, tag: f"{p.strip()}-{tag}", HOSTILE,
                                   st.text("0123456789abcdef", min_size=10, max_size=10)),
                         st.sampled_from(PAGE_WORDS))


# --- the store, the app, the pages ------------------------------------------------------------

@pytest.fixture
def bs_settings(monkeypatch):
    return dashboard_settings(monkeypatch, OPENROUTER_API_KEY=LLM_KEY)


def plant(store, payloads: list[str], names: list[str], secret_name: str, secret_value: str) -> dict:
    """Everything the agent can put where a page shows it, each holding a payload; returns what was
    planted where the tests look for it."""
    p = (payloads * 4)[:8]
    secret_key = keys.secret(secret_name)
    store.put(secret_key, secret_value)
    note = f"note: {secret_value} :end"  # a secret copied into an ordinary key: shown redacted
    store.put("notes", note)
    for i, name in enumerate(names):
        store.put(name, p[i % len(p)])
        store.put(f"tooldata:{name}", {name: p[(i + 1) % len(p)], "list": p})
    for i, name in enumerate(names[:3]):  # versioned keys: the changes pages and their diffs
        key = f"prompt:{name}"
        old = None
        for n, value in enumerate((p[0], f"{p[1]}\n{secret_value}", p[2] + "\n" + p[3])):
            versions.record_write(store, key, old, value, source=p[(n + i) % len(p)], session_id=SID)
            store.put(key, value)
            old = value
    for i, name in enumerate(names[:2]):  # code the agent wrote, never approved: /review shows it and its diff
        store.put(keys.tool_code(name), f"{p[i + 2]}\n{secret_value}\n")
    store.put(keys.CONFIG_REFLEXES, json.dumps([{"name": p[4], "when": {"fact": p[5], "lt": 1},
                                                 "do": {"tool": p[6]}}]))
    k = karma.Karma(store, SID)  # no redactor: the dashboard catches what slipped into karma
    k.record("session_start", session_number=7, note=p[0])
    k.record("llm_call", purpose=p[1], model=p[2], cost=0.001, duration_ms=120, response=p[3])
    k.record("tool_complete", tool=p[4], step_id=p[5], duration_ms=5, result={p[6]: p[7]})
    k.record("fetch", tool=p[0], method=p[1], host=p[2], path=p[3], duration_ms=3)
    k.record(p[2], **{"field": p[4], "secret_copy": secret_value})
    k.record("llm_call", purpose="odd numbers", duration_ms=float("nan"), elapsed_ms=float("inf"), cost=p[5])
    k.record("session_end", outcome=p[6], kind=p[7], cost=0.001, steps=1, duration_ms=2000)
    store.put(keys.SESSION_LAST_STARTED, SID)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for sid, outcome in ((SID, "clean"), (p[0], p[1])):
        session_history.append(store, {
            "id": sid, "number": 7, "kind": "session", "started_at": now, "ended_at": now, "outcome": outcome,
            "cost": 0.001, "steps": 1, "steps_failed": 0, "duration_ms": 2000,
            "summary": f"{p[2]} {secret_value} {p[3]}", "reason": p[4]})
    first = review.add(store, tool=p[0], session_id=SID, step_id=p[1], input={p[2]: p[3]}, ok=True,
                       result={"r": p[4]}, error=None)
    review.add(store, tool=p[5], session_id=p[6], step_id=p[7], input=p[0], ok=False, result=None, error=p[1])
    review.add(store, tool=p[2], session_id=SID, step_id=None, input=[p[3]], ok=True, result=p[4], error=None)
    try:
        review.settle(store, first["id"], correction=f"{p[5]} {secret_value}")
    except BrainstemError:
        pass  # a correction the inbox refuses (too long...): the item stays pending, still shown
    for text, sender, urgent in ((p[6], "telegram", False), (f"{p[7]} {secret_value}", "operator", True)):
        try:  # the operator's messages: from Telegram, anyone's text
            inbox.post(store, text, sender=sender, urgent=urgent)
        except inbox.InboxError:
            pass  # only whitespace: no message
    # Schedules: the agent writes its own (the tool's name, its input and its summary prompt are its text), a
    # broken value under schedule: says what it holds, and each run's karma ends in the runner's record.
    tool = p[0] if 1 <= len(p[0]) <= 128 and not any(c == ":" or c.isspace() for c in p[0]) else "x<b>y</b>"
    store.put(keys.schedule("h1"), {"tool": tool, "input": {p[6]: p[7], "list": p}, "every": "1h", "notify": "inbox",
                                    "synthesize": f"{p[5]} {secret_value}", "next_run": now,
                                    "last_run": now, "last_outcome": "failed"})
    store.put(keys.schedule("h2"), {"tool": "kv_read", "every": p[1], "created_by": p[2]})
    store.put(keys.schedule(names[0]), p[3])
    run = karma.Karma(store, "sched-h1-20260504T090000Z")
    run.record("tool_complete", tool=tool, duration_ms=5, result={p[4]: secret_value})
    run.record("schedule_run", id=p[5], scheduled=p[6], outcome=p[7], cost=p[0], missed=p[1], reason=p[2])
    return {"note": note}


TAGS = {"html", "head", "meta", "link", "title", "script", "body", "header", "b", "nav", "a", "span", "main", "h1",
        "h2", "p", "table", "tr", "th", "td", "pre", "details", "summary", "form", "input", "select", "option",
        "button", "noscript", "code", "div", "colgroup", "col", "svg", "text", "line", "rect", "textarea", "label"}
ATTRS = {"lang", "charset", "name", "content", "rel", "href", "src", "defer", "class", "id", "method", "action",
         "type", "value", "placeholder", "autocomplete", "required", "disabled", "title", "selected", "colspan",
         "width", "height", "role", "aria-label", "x", "y", "x1", "y1", "x2", "y2", "data-live", "data-session",
         "data-agent", "data-left", "data-width", "data-autosubmit"}
URL_ATTRS = {"href", "src", "action", "formaction", "xlink:href", "data", "poster", "background"}
OUR_SCRIPT = "/static/app.js"


class Page(HTMLParser):
    """A page's tags, checked as they are parsed: what a browser would build from it.

    Character references are kept as written, so text that was escaped stays escaped here: a raw ``<``
    in text is a tag the parser could not make sense of (a browser might), never text we escaped."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.problems: list[str] = []
        self.scripts: list[str] = []
        self.hrefs: list[str] = []
        self.raw_text: list[str] = []
        self.closed: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        if tag not in TAGS:
            self.problems.append(f"injected element <{tag}>")
        for name, value in attrs:
            if name not in ATTRS:
                self.problems.append(f"injected attribute {name}={value!r} on <{tag}>")
            if name in URL_ATTRS and value is not None and not safe_url(value):
                self.problems.append(f"unsafe URL {name}={value!r} on <{tag}>")
        if tag == "a" and dict(attrs).get("href"):
            self.hrefs.append(dict(attrs)["href"])
        if tag == "script":
            self.scripts.append(dict(attrs).get("src") or "")
            self._in_script = True

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        self.closed.append(tag)
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.problems.append(f"inline script: {data[:80]!r}")
        if "<" in data:
            self.problems.append(f"markup left in text: {data[:120]!r}")
        self.raw_text.append(data)

    def handle_entityref(self, name):
        self.raw_text.append(f"&{name};")

    def handle_charref(self, name):
        self.raw_text.append(f"&#{name};")

    @property
    def text(self) -> str:
        return html.unescape("".join(self.raw_text))

    def handle_pi(self, data):
        self.problems.append(f"processing instruction {data!r}")


def safe_url(value: str) -> bool:
    """One of our paths (or a relative one a redaction label starts), or the empty icon."""
    v = value.strip()
    if v == "data:,":
        return True
    if v.startswith("[REDACTED:"):  # a secret matched the start of one of our paths: still relative
        return True
    return v.startswith("/") and not v.startswith(("//", "/\\"))


def check(path: str, body: str) -> Page:
    page = Page()
    page.feed(body)
    page.close()
    assert not page.problems, (path, page.problems[:5])
    # Parsed to its end: a quote or tag left open by injected text would swallow the rest of the page.
    assert page.closed[-3:] == ["main", "body", "html"], (path, page.closed[-5:])
    assert page.scripts == [OUR_SCRIPT], (path, page.scripts)
    assert body.count("<script") == 1 and "<style" not in body, path
    for payload in FIXED:  # the fixed payloads are long and distinctive: never in the page as written
        if "<" in payload:
            assert payload not in body, (path, payload)
    return page


def crawl(c: TestClient, extra: list[str], limit: int = 400) -> dict[str, tuple[object, Page | None]]:
    """Every page reachable from ``/`` by a link (plus ``extra``), each checked: path -> (response, page)."""
    seen: dict[str, tuple[object, Page | None]] = {}
    todo = ["/", *extra]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        assert len(seen) < limit, "the crawl did not end"
        r = c.get(path)
        assert r.status_code in (200, 404), (path, r.status_code, r.text[:300])
        assert "Traceback" not in r.text, path
        page = None
        if r.headers.get("content-type", "").startswith("text/html"):
            page = check(path, r.text)
            todo += [h for h in page.hrefs if h.startswith("/") and not h.startswith("//") and h not in seen]
        else:
            assert r.headers.get("x-content-type-options") == "nosniff", path
        seen[path] = (r, page)
    return seen


# --- hostile text never becomes markup -----------------------------------------------------------

def with_every_fixed_payload(test):
    """Every fixed payload in every run (eight to an example, each with another secret), before the drawn ones:
    fewer drawn examples then still try them all."""
    secrets = ["<script>alert(1337)</script>-0a1b2c3d4e", "class=", "</td><td>", "x<svg/onload=alert(1337)>-9f8e7d6c5b",
               "href="]
    names = ["x<svg/onload=alert(1337)>", '"><img src=x onerror=alert(1337)>', "{{ 7*7 }}{% raw %}", "ünïcødé 🙂"]
    for n, i in reversed(list(enumerate(range(0, len(FIXED), 8)))):
        test = hypothesis.example(payloads=FIXED[i:i + 8], names=names[:1 + n % 4], secret_name=names[n % 4],
                                  secret_value=secrets[n % len(secrets)])(test)
    return test


@pytest.mark.slow
@hypothesis.settings(max_examples=15, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payloads=st.lists(HOSTILE, min_size=2, max_size=8), names=st.lists(NAME, min_size=1, max_size=4, unique=True),
       secret_name=NAME, secret_value=SECRET_VALUE)
@with_every_fixed_payload
def test_no_page_lets_the_stores_text_become_markup(bs_settings, payloads, names, secret_name, secret_value):
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "store.db")
        try:
            planted = plant(store, payloads, names, secret_name, secret_value)
            app = app_for(bs_settings, store)
            c = client(app)
            first, last = quote(payloads[0], safe=""), quote(payloads[-1], safe="")
            reflected = [f"/review?done={first}", f"/store?prefix={last}", f"/sessions?outcome={first}",
                         f"/changes/{quote('prompt:' + names[0], safe='')}?done={last}",
                         "/store?key=" + quote(keys.secret(secret_name), safe=""), "/sessions?page=2",
                         f"/inbox?done={last}"]
            # (The pages the checks below read are named: a secret matching a path redacts its links.)
            seen = crawl(c, ["/api/karma", f"/api/karma?session={SID}", "/store?key=notes", f"/sessions/{SID}",
                             "/review", "/changes", "/inbox", "/schedules", "/sessions/sched-h1-20260504T090000Z",
                             *reflected])
            assert len(seen) > 12, sorted(seen)

            # The copied secret shows as its label, the label as text (whatever the secret's name holds).
            redact = app.state.dashboard.redact
            r, page = seen["/store?key=notes"]
            shown = page.text
            assert not TAGGED.search(secret_value) or secret_value not in shown
            want = redact.text(redact.text(planted["note"]))
            assert "[REDACTED:" in want and want in shown, (want, shown[-400:])
            # Nor is it in any page, as text or in an attribute.
            for path, (r, _) in seen.items():
                assert not TAGGED.search(secret_value) or secret_value not in html.unescape(r.text), path
            for path in ("/api/karma", f"/api/karma?session={SID}"):
                r = seen[path][0]
                assert r.headers["content-type"].startswith("application/json")
                data = r.json()  # a label is a JSON string, never spliced into the JSON
                lines = "\n".join(e["line"] for e in data["entries"])
                assert "[REDACTED:" in lines, path
                assert not TAGGED.search(secret_value) or secret_value not in lines, path
        finally:
            store.close()


def test_a_secrets_name_is_a_label_shown_as_text(bs_settings, tmp_path):
    """The attack as it was: the agent names a secret ``secret:x<svg/onload=...>`` and copies its value into
    a note (or makes the value a word every page has); the label was put into pages as markup."""
    store = SQLiteStore(tmp_path / "store.db")
    try:
        name, value = "x<svg/onload=alert(1337)>", "agent-chosen-secret-value"
        store.put(keys.secret(name), value)
        store.put(keys.secret("y<img src=x onerror=alert(1337)>"), "brainstem")
        store.put("notes", f"see {value}")
        store.put("prompt:orient", f"orient {value}")
        karma.Karma(store, SID).record("note", text=value)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        session_history.append(store, {"id": f"8-{value}", "started_at": now, "outcome": "clean", "cost": 0.01})
        item = review.add(store, tool="kv_write", session_id=SID, step_id="s1", input={}, ok=True, result="ok",
                          error=None)
        review.settle(store, item["id"], correction=f"not {value}")  # printed through a join filter
        c = client(app_for(bs_settings, store))
        for path in ("/", "/review", "/store?key=notes", "/store", "/changes", f"/sessions/{SID}",
                     "/store?key=prompt:orient", "/sessions"):
            r = c.get(path)
            assert r.status_code == 200, path
            check(path, r.text)
            assert "<svg/onload" not in r.text and "<img" not in r.text and value not in r.text, path
        assert "[REDACTED:secret:x&lt;svg/onload=alert(1337)&gt;]" in c.get("/store?key=notes").text
    finally:
        store.close()


@given(labels=st.lists(HOSTILE, min_size=1, max_size=40), title=HOSTILE)
@hypothesis.settings(max_examples=50, deadline=None, derandomize=True)
def test_a_chart_escapes_every_label_it_draws(labels, title):
    svg = charts.bars([(label, float(i)) for i, label in enumerate(labels)], ceiling=1.5, title=title)
    assert type(svg) is charts.Drawn
    page = Page()
    page.feed(svg)
    page.close()
    assert not page.problems and not page.scripts and not page.hrefs, page.problems
    assert all(payload not in svg for payload in FIXED if "<" in payload or '"' in payload)


def test_non_numbers_where_a_chart_wants_numbers_draw_nothing():
    svg = charts.bars([("a", float("nan")), ("b", float("inf")), ("c", "x"), ("d", None)], ceiling=float("nan"))
    assert "nan" not in svg and "inf" not in svg


# --- headers --------------------------------------------------------------------------------------

def _directives(csp: str) -> dict[str, list[str]]:
    out = {}
    for part in csp.split(";"):
        words = part.split()
        if words:
            out[words[0].lower()] = words[1:]
    return out


@pytest.mark.parametrize("path", ["/", "/sessions", f"/sessions/{SID}", "/live", "/store", "/review", "/inbox",
                                  "/schedules", "/static/app.js", "/api/karma", "/nonesuch"])
def test_the_csp_allows_no_inline_script_or_style(bs_settings, tmp_path, path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        r = client(app_for(bs_settings, store)).get(path)
        d = _directives(r.headers["content-security-policy"])
        assert d["script-src"] == ["'self'"], d
        assert d["style-src"] == ["'self'"], d
        assert "'unsafe-inline'" not in r.headers["content-security-policy"]
        assert "'unsafe-eval'" not in r.headers["content-security-policy"]
        assert d["object-src"] == ["'none'"] and d["base-uri"] == ["'none'"] and d["form-action"] == ["'self'"]
        assert d["frame-ancestors"] == ["'none'"] and d["default-src"] == ["'self'"]
    finally:
        store.close()


def test_the_script_and_stylesheet_are_served_and_nothing_else_is(bs_settings, tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        c = client(app_for(bs_settings, store))
        r = c.get("/static/app.js")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
        assert "innerHTML" not in r.text and "eval(" not in r.text  # text goes in as text
        r = c.get("/static/app.css")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/css")
        for path in ("/static/../app.py", "/static/app.py", "/static/%2e%2e%2fapp.py", "/static/"):
            assert c.get(path).status_code == 404, path
    finally:
        store.close()


# --- CSRF: tokens this server signed, and only those ---------------------------------------------

@pytest.fixture
def acting(bs_settings, tmp_path):
    """A store with two versions of a prompt and two pending review items; an app on loopback and one
    bound beyond it."""
    store = SQLiteStore(tmp_path / "store.db")
    for old, new in ((None, "first"), ("first", "second")):
        versions.record_write(store, "prompt:orient", old, new, source="reflect", session_id=SID)
        store.put("prompt:orient", new)
    ids = [review.add(store, tool="kv_write", session_id=SID, step_id=f"s{i}", input={}, ok=True, result="ok",
                      error=None)["id"] for i in (1, 2)]
    apps = {"loopback": app_for(bs_settings, store), "beyond": app_for(bs_settings, store, loopback_only=False)}
    yield store, ids, apps
    store.close()


def _actions(ids) -> dict[str, tuple[str, dict]]:
    return {"rollback": ("/rollback", {"key": "prompt:orient", "version": "1"}),
            "confirm": (f"/review/{ids[0]}", {"verdict": "confirm"}),
            "correct": (f"/review/{ids[1]}", {"verdict": "correct", "correction": "do better"}),
            "tell": ("/tell", {"text": "hello from the operator", "urgent": "1"}),
            "wake": ("/actions", {"do": "wake"})}


def _state(store) -> tuple:
    return store.get("prompt:orient"), len(versions.versions(store, "prompt:orient")), \
        tuple(it["status"] for it in review.items(store, include_settled=True)), len(inbox.messages(store))


def _page_token(c: TestClient, path: str = "/review") -> str:
    r = c.get(path)
    assert r.status_code == 200
    found = re.search(rf'name="{auth.CSRF_FIELD}" value="([^"]+)"', r.text)
    assert found, path
    return found.group(1)


def _forgeries() -> dict[str, tuple[str | None, str | None]]:
    """(cookie, field) pairs a client can make without the server's key."""
    mine = secrets.token_urlsafe(24)
    other = auth.CsrfSigner(auth.signing_key(auth.new_token())).issue()  # well-formed, signed, not by this server
    other_token = auth.CsrfSigner(auth.signing_key("another-dashboard-token")).issue()
    shaped = f"{secrets.token_urlsafe(24)}.{int(time.time()) + 3600}.{'A' * 43}"
    return {"equal random pair": (mine, mine), "equal empty pair": ("", ""), "equal well-formed pair": (shaped, shaped),
            "signed by another process": (other, other), "signed under another token": (other_token, other_token),
            "field without cookie": (None, mine), "cookie without field": (mine, None)}


@pytest.mark.parametrize("kind", ["loopback", "beyond"])
@pytest.mark.parametrize("action", ["rollback", "confirm", "correct", "tell", "wake"])
def test_a_csrf_pair_the_client_made_up_is_403_on_every_post(acting, kind, action):
    store, ids, apps = acting
    path, form = _actions(ids)[action]
    for case, (cookie, field) in _forgeries().items():
        c = client(apps[kind])  # the dashboard's cookie: only the CSRF token is the client's
        if cookie is not None:
            c.cookies.set(auth.CSRF_COOKIE, cookie)
        data = dict(form)
        if field is not None:
            data[auth.CSRF_FIELD] = field
        before = _state(store)
        r = c.post(path, data=data)
        assert r.status_code == 403 and "CSRF" in r.text, (case, r.status_code, r.text)
        assert _state(store) == before, case
        assert apps[kind].state.dashboard.actions.recent("") == [], case  # nothing was started


def test_every_post_route_checks_the_csrf_token(acting):
    """No POST route is left out of the test above."""
    store, ids, apps = acting
    posts = {route.path for route in apps["loopback"].routes if "POST" in (getattr(route, "methods", None) or ())}
    assert posts == {"/rollback", "/review/{item}", "/tell", "/actions"}, posts


@pytest.mark.parametrize("kind", ["loopback", "beyond"])
def test_the_token_a_page_carries_works_for_each_action(acting, kind):
    store, ids, apps = acting
    c = client(apps[kind])
    token = _page_token(c)
    assert c.cookies.get(auth.CSRF_COOKIE) == token
    assert apps[kind].state.dashboard.csrf.remaining(token) > 0
    for action in ("rollback", "confirm", "correct", "tell"):
        path, form = _actions(ids)[action]
        r = c.post(path, data={**form, auth.CSRF_FIELD: token})
        assert r.status_code == 303, (action, r.status_code, r.text)
    assert store.get("prompt:orient") == "first"
    assert [(m["text"], m["urgent"], m["via"]) for m in inbox.messages(store)] == [
        ("hello from the operator", True, "dashboard")]
    assert [it["status"] for it in review.items(store, include_settled=True)] == [review.CONFIRMED, review.CORRECTED]


def test_a_token_is_refused_once_expired_or_altered(acting):
    store, ids, apps = acting
    signer = apps["loopback"].state.dashboard.csrf
    now = time.time()
    token = signer.issue(now)
    assert signer.check(token, token, now)
    assert not signer.check(token, token, now + signer.ttl + 1)  # expired
    ident, expiry, mac = token.split(".")
    for altered in (f"{ident}.{int(expiry) + 3600}.{mac}",
                    f"{ident[:-1]}{'A' if ident[-1] != 'A' else 'B'}.{expiry}.{mac}",
                    f"{ident}.{expiry}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}", f"{ident}.{expiry}.",
                    f"{ident}.{expiry}", token + ".", " " + token):
        assert not signer.check(altered, altered, now), altered
    assert not signer.check(token, signer.issue(now), now)  # another browser's token
    # Through the app: a signed token whose cookie holds another signed token is 403 too.
    c = client(apps["loopback"])
    c.cookies.set(auth.CSRF_COOKIE, signer.issue())
    path, form = _actions(ids)["rollback"]
    before = _state(store)
    assert c.post(path, data={**form, auth.CSRF_FIELD: signer.issue()}).status_code == 403
    assert _state(store) == before


def test_with_the_same_token_the_key_survives_a_restart_and_with_another_it_does_not(bs_settings, tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        a = app_for(bs_settings, store).state.dashboard.csrf
        b = app_for(bs_settings, store, loopback_only=False).state.dashboard.csrf
        t = a.issue()
        assert b.check(t, t)
        x = app_for(bs_settings, store, token=auth.new_token()).state.dashboard.csrf  # a token made at start
        y = app_for(bs_settings, store, token=auth.new_token()).state.dashboard.csrf
        t = x.issue()
        assert x.check(t, t) and not y.check(t, t)
    finally:
        store.close()


def test_a_page_reuses_a_good_token_and_replaces_a_forged_one(acting):
    store, ids, apps = acting
    c = client(apps["loopback"])
    r = c.get("/review")
    assert "set-cookie" in r.headers
    token = c.cookies.get(auth.CSRF_COOKIE)
    r = c.get("/changes/prompt:orient")
    assert "set-cookie" not in r.headers and f'value="{token}"' in r.text
    c.cookies.delete(auth.CSRF_COOKIE)
    c.cookies.set(auth.CSRF_COOKIE, "made-up-by-the-client")
    fresh = _page_token(c)
    assert fresh != "made-up-by-the-client" and apps["loopback"].state.dashboard.csrf.remaining(fresh) > 0


# --- in a real browser ----------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def served(bs_settings, tmp_path):
    """The dashboard over a hostile store, served by uvicorn on a free loopback port in this process."""
    import socket

    import uvicorn

    store = SQLiteStore(tmp_path / "store.db")
    plant(store, [p for p in FIXED if MARK in p], ["<script>alert(1337)</script>", 'k"><img src=x onerror=alert(1337)>',
                                                   "javascript:alert(1337)"],
          "x<svg/onload=alert(1337)>", "brainstem")  # a word on every page: its label must stay text
    app = app_for(bs_settings, store)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    store.close()


@pytest.mark.slow
def test_in_a_browser_nothing_from_the_store_runs(served):
    if not os.path.exists(CHROMIUM):
        if os.environ.get("BRAINSTEM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"BRAINSTEM_REQUIRE_BROWSER=1 but {CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{served}/?{auth.TOKEN_QUERY}={TOKEN}")  # the link the dashboard prints: the cookie
            ran, errors = [], []
            page.on("dialog", lambda d: (ran.append(d.message), d.dismiss()))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            todo, seen = [served + "/"], set()
            while todo and len(seen) < 200:
                url = todo.pop()
                if url in seen:
                    continue
                seen.add(url)
                page.goto(url)
                page.wait_for_load_state("load")
                for el in page.locator("details").all():  # open every entry: nothing in it may run either
                    el.evaluate("e => e.open = true")
                for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                    href = href.split("#", 1)[0]
                    if href.startswith(served + "/") and href not in seen:
                        todo.append(href)
            assert len(seen) > 15, sorted(seen)
            assert not ran, ran
            # A 404 for a session the agent named with a payload is a page too; nothing else may fail.
            assert not [e for e in errors if "404" not in e], errors
            # The timeline's bars are placed by the script, not by inline styles.
            page.goto(f"{served}/sessions/{SID}")
            widths = page.eval_on_selector_all(".wf span", "els => els.map(e => e.style.width)")
            assert widths and any(w.endswith("%") for w in widths), widths
            # /live fills its log from the API, as text.
            page.goto(served + "/live")
            page.wait_for_function("document.getElementById('log').textContent.length > 0")
            assert "<script>alert(1337)</script>" in page.locator("#log").inner_text()
            assert not ran and not [e for e in errors if "404" not in e], (ran, errors)
        finally:
            browser.close()


def test_the_overview_shows_secret_stops_the_hold_and_damaged_history(bs_settings, tmp_path):
    from brainstem.state import refusals

    store = SQLiteStore(tmp_path / "store.db")
    try:
        session_history.append(store, {"id": "1-aaaaaa", "number": 1, "outcome": "clean"})
        store.append(keys.SESSION_HISTORY, '{"id": "2-bbbbbb", "num')
        refusals.note(store, "guess<b>er")
        c = client(app_for(bs_settings, store))
        page = c.get("/").text
        check("/", page)
        assert "secret refused" in page and "HELD" in page and "guess&lt;b&gt;er" in page
        assert "history damaged" in page and "2-bbbbbb" in page
        refusals.clear(store)
        assert "cleared" in c.get("/").text
    finally:
        store.close()
