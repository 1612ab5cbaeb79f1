"""What the dashboard's pages show (``brainstem/operator/dashboard/views.py``), in-process: the schedules page.

Each test fills a real SQLite store as the operator's commands and the runner leave it (schedules, values
under ``schedule:`` that are not schedules, each run's karma ending in ``schedule_run``) and reads
:func:`views.schedules_page` directly or ``/schedules`` through the app with Starlette's ``TestClient``:

* every schedule with what it runs, when, its next run (``due`` once that has come), paused or not, who
  made it, where its result goes, its last run and outcome, and a link to its newest run's karma, which
  opens on the page a session's karma does;
* a value that is not a schedule (not JSON, not a schedule, a log, not text) is a row saying why, never a 500;
* no schedules: a page saying how to add one; several agents: one table each, each linking its own;
* the page only reads (a schedule without ``next_run`` shows its first run, not stored) and needs the token.

Hostile text in schedules (script tags in the input and the summary prompt, the tool's name) is crawled with
everything else in tests/hostile/test_dashboard.py; the page in a browser is tests/e2e/test_dashboard.py.
"""

from __future__ import annotations

import html
import re
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import events, keys
from brainstem.core.clock import iso
from brainstem.operator.dashboard import views
from brainstem.operator.dashboard.app import make_app
from brainstem.state import schedules
from brainstem.store import karma
from brainstem.store.sqlite.store import SQLiteStore
from tests.dashboard_client import TOKEN, app_for, client, dashboard_settings

NOW = datetime(2026, 5, 4, 9, 30, tzinfo=timezone.utc)


@pytest.fixture
def settings(monkeypatch):
    return dashboard_settings(monkeypatch, BRAINSTEM_SCHEDULE_MAX="7", BRAINSTEM_SCHEDULE_MIN_INTERVAL="600")


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(tmp_path / "store.db")
    yield s
    s.close()


def put(store, schedule_id: str, **fields) -> None:
    store.put(keys.schedule(schedule_id), fields)


def ran(store, run_id: str, outcome: str = "ok", **extra) -> None:
    """A run's karma as the runner keeps it: the tool's start and end, then the ``schedule_run`` entry."""
    schedule_id = views.run_of(run_id)
    k = karma.Karma(store, run_id)
    k.record(events.TOOL_START, tool="kv_read", elapsed_ms=2)
    k.record(events.TOOL_COMPLETE, tool="kv_read", duration_ms=40, elapsed_ms=42, result={"value": "x"})
    k.record(events.SCHEDULE_RUN, id=schedule_id, scheduled="2026-05-04T09:00:00Z", outcome=outcome, cost=0.0,
             elapsed_ms=45, **extra)


def snapshot(store) -> dict:
    return {i.name: (tuple(store.read_log(i.name)) if i.is_log else store.get(i.name)) for i in store.list_all("")}


def rows_of(page_html: str) -> dict[str, str]:
    """The schedules table's rows as text, by id (the first cell)."""
    table = page_html.split('<table class="schedules">', 1)[1].split("</table>", 1)[0]
    out = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]:
        cells = [html.unescape(re.sub(r"<[^>]+>", " ", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        out[cells[0].strip()] = " ".join(" | ".join(cells).split())
    return out


# --- run ids ------------------------------------------------------------------------------------

@pytest.mark.parametrize("run_id, schedule_id", [
    ("sched-abc-20260504T090000Z", "abc"), ("sched-a-b-20260504T090000Z", "a-b"),
    ("sched-abc-20260504T090000Z-2", "abc"), ("sched-x-20260101T000000Z-20260504T090000Z", "x-20260101T000000Z"),
    ("7-abcdef", None), ("sched-abc", None), ("sched--20260504T090000Z", None), ("sched-abc-2026-05-04", None)])
def test_a_runs_karma_id_names_its_schedule(run_id, schedule_id):
    assert views.run_of(run_id) == schedule_id


def test_each_schedule_links_its_newest_runs_karma_and_only_its_own(store):
    put(store, "a", tool="kv_read", every="1h")
    put(store, "a-b", tool="kv_read", every="1h")
    put(store, "never", tool="kv_read", every="1h")
    for run_id in ("sched-a-20260504T070000Z", "sched-a-20260504T080000Z", "sched-a-20260504T080000Z-2",
                   "sched-a-20260504T080000Z-10", "sched-a-b-20260504T060000Z"):
        ran(store, run_id)
    store.put(keys.karma("sched-a-20260504T230000Z"), "a value, not karma")  # never a run
    rows = {r["id"]: r for r in views.schedules_page(store, NOW)["rows"]}
    assert rows["a"]["run"] == "sched-a-20260504T080000Z-10"
    assert rows["a-b"]["run"] == "sched-a-b-20260504T060000Z"
    assert rows["never"]["run"] is None


# --- what a row holds ----------------------------------------------------------------------------

def test_each_schedule_with_its_timing_next_run_state_and_last_run(store):
    put(store, "balance", tool="check_or_balance", every="6h", notify="inbox", created_by="operator",
        next_run="2026-05-04T12:00:00Z", last_run="2026-05-04T06:00:03Z", last_outcome="ok")
    put(store, "morning", tool="web_fetch", input={"url": "https://example.org"}, cron="0 9 * * MON-FRI",
        tz="Europe/London", notify="telegram", synthesize="One line: what changed?", missed="skip",
        next_run="2026-05-04T08:00:00Z", last_outcome="skipped_missed")
    put(store, "held", tool="kv_read", every="1d", enabled=False, next_run="2026-05-04T00:00:00Z")
    page = views.schedules_page(store, NOW)
    assert (page["agents"], page["invalid"]) == (2, 0)
    rows = {r["id"]: r for r in page["rows"]}
    assert [r["id"] for r in page["rows"]] == ["balance", "held", "morning"]
    b = rows["balance"]
    assert (b["tool"], b["when"], b["enabled"], b["created_by"], b["notify"]) == (
        "check_or_balance", "every 6h", True, "operator", "inbox")
    assert (b["next_run"], b["due"], b["next_in"]) == ("2026-05-04 12:00", False, "in 2h 30m")
    assert (b["last_run"], b["last_ago"], b["last_outcome"]) == ("2026-05-04 06:00:03", "3h 29m ago", "ok")
    m = rows["morning"]
    assert m["when"] == "cron 0 9 * * MON-FRI (Europe/London)" and m["missed"] == "skip"
    assert (m["next_run"], m["due"], m["next_in"]) == ("2026-05-04 08:00", True, "1h 30m ago")
    assert m["synthesize"] == "One line: what changed?" and '"url": "https://example.org"' in m["input"]
    assert (m["last_run"], m["last_outcome"]) == ("", "skipped_missed")
    assert rows["held"]["enabled"] is False and rows["held"]["next_run"] == "" and not rows["held"]["due"]


def test_a_schedule_without_a_next_run_shows_its_first_and_nothing_is_written(store):
    put(store, "fresh", tool="kv_read", cron="0 12 * * *")
    before = snapshot(store)
    (row,) = views.schedules_page(store, NOW)["rows"]
    assert row["next_run"] == "2026-05-04 12:00" and not row["due"]
    assert snapshot(store) == before


def test_a_value_that_is_not_a_schedule_is_a_row_saying_why(store, tmp_path):
    put(store, "good", tool="kv_read", every="1h")
    store.put("schedule:not-json", "{not json")
    put(store, "no-timing", tool="kv_read", created_by="operator")
    put(store, "slow", tool="kv_read", every="often")
    store.append("schedule:a-log", {"tool": "kv_read"})
    db = sqlite3.connect(tmp_path / "store.db")  # bytes that are not UTF-8, written around Brainstem
    db.execute("INSERT INTO kv (key, value) VALUES (?, ?)", ("schedule:bytes", b"\xff\xfe not text"))
    db.commit()
    db.close()
    ran(store, "sched-slow-20260504T080000Z", outcome="failed")  # it ran before it was broken
    page = views.schedules_page(store, NOW)
    assert page["invalid"] == 5
    rows = {r["id"]: r for r in page["rows"]}
    assert sorted(rows) == ["a-log", "bytes", "good", "no-timing", "not-json", "slow"]
    assert rows["not-json"]["error"].startswith("not valid JSON")
    assert rows["no-timing"]["error"].startswith("give exactly one of every") and rows["no-timing"]["operator"]
    assert "'often' is not a duration" in rows["slow"]["error"] and not rows["slow"]["operator"]
    assert rows["slow"]["run"] == "sched-slow-20260504T080000Z"
    assert "a log, not a schedule" in rows["a-log"]["error"] and "not text" in rows["bytes"]["error"]
    assert "error" not in rows["good"]


# --- the page ------------------------------------------------------------------------------------

def test_the_page_lists_each_schedule_and_links_its_last_runs_karma(settings, store):
    put(store, "balance", tool="check_or_balance", every="6h", notify="inbox", created_by="operator",
        next_run="2999-01-01T00:00:00Z", last_run="2026-05-04T06:00:03Z", last_outcome="ok")
    put(store, "digest", tool="kv_read", every="1h", next_run="2020-01-01T00:00:00Z", last_run="2019-12-31T23:00:00Z",
        last_outcome="refused")
    put(store, "held", tool="kv_read", every="1d", enabled=False)
    put(store, "broken", tool="kv_read", every="often")
    ran(store, "sched-balance-20260504T060000Z")
    c = client(app_for(settings, store))
    r = c.get("/schedules")
    assert r.status_code == 200
    assert '<a href="/schedules" class="here">Schedules</a>' in r.text  # in the nav, marked as the page shown
    assert "up to 7 schedules of its own, none running more often than every 600 s" in r.text
    rows = rows_of(r.text)
    assert list(rows) == ["balance", "broken", "digest", "held"]
    assert "| every 6h | 2999-01-01 00:00" in rows["balance"] and "| operator | inbox |" in rows["balance"]
    assert '<span class="ok">ok</span>' in r.text and '<span class="bad">refused</span>' in r.text
    assert "2020-01-01 00:00 due" in rows["digest"] and "| agent |" in rows["digest"]
    assert "| paused |" in rows["held"] and "never" in rows["held"]
    assert "invalid, never runs: every 'often' is not a duration" in rows["broken"]
    assert r.text.count(">karma</a>") == 1
    link = re.search(r'<a href="([^"]+)" title="sched-balance-20260504T060000Z">karma</a>', r.text)
    assert link and link.group(1) == "/sessions/sched-balance-20260504T060000Z"

    run = c.get(link.group(1))
    assert run.status_code == 200
    assert "<h1>Schedule run sched-balance-20260504T060000Z</h1>" in run.text
    assert '<b class="ok">ok</b> · a run of schedule <a href="/schedules">balance</a>' in run.text
    assert "due 2026-05-04T09:00:00Z" in run.text and run.text.count('<tr id="e') == 3


def test_a_run_without_its_schedule_run_entry_and_an_unknown_run(settings, store):
    karma.Karma(store, "sched-x-20260504T090000Z").record(events.TOOL_START, tool="kv_read")
    c = client(app_for(settings, store))
    r = c.get("/sessions/sched-x-20260504T090000Z")
    assert r.status_code == 200 and "<b>running (or died)</b>: no <code>schedule_run</code> entry yet" in r.text
    r = c.get("/sessions/sched-x-20260504T100000Z")
    assert r.status_code == 404 and "<h1>No such schedule run</h1>" in r.text
    assert "<h1>No such session</h1>" in c.get("/sessions/9-nonesuch").text


def test_with_no_schedules_the_page_says_how_to_add_one(settings, store):
    r = client(app_for(settings, store)).get("/schedules")
    assert r.status_code == 200
    assert "No schedules yet" in r.text and "brainstem schedule add check_or_balance --every 6h" in r.text
    assert '<table class="schedules">' not in r.text


def test_several_agents_one_table_each_linking_its_own_runs(settings, tmp_path):
    path = tmp_path / "shared.db"
    alice, bob = SQLiteStore(path, prefix="alice"), SQLiteStore(path, prefix="bob")
    try:
        put(alice, "a1", tool="kv_read", every="1h")
        ran(alice, "sched-a1-20260504T090000Z")
        app = make_app(settings, {"alice": alice, "bob": bob}, token=TOKEN, loopback_only=True)
        c = client(app)
        for agent in ("alice", "bob"):  # whichever agent the pages are switched to
            r = c.get(f"/schedules?agent={agent}")
            assert r.status_code == 200
            assert r.text.index("<h2>Agent alice</h2>") < r.text.index("<h2>Agent bob</h2>")
            alices, bobs = r.text.split("<h2>Agent bob</h2>")
            assert "a1" in alices and "No schedules yet" in bobs and "a1" not in bobs
            assert 'href="/sessions/sched-a1-20260504T090000Z?agent=alice"' in alices
        assert "a run of schedule" in c.get("/sessions/sched-a1-20260504T090000Z?agent=alice").text
        assert c.get("/sessions/sched-a1-20260504T090000Z?agent=bob").status_code == 404  # not bob's karma
        assert c.get("/schedules?agent=carol").status_code == 404
    finally:
        alice.close()
        bob.close()


def test_the_page_only_reads_and_needs_the_token(settings, store):
    put(store, "fresh", tool="kv_read", every="1h")  # no next_run: the page shows one, never stores it
    put(store, "broken", tool="kv_read", every="often")
    ran(store, "sched-fresh-20260504T090000Z")
    app = app_for(settings, store)
    before = snapshot(store)
    assert client(app, logged_in=False).get("/schedules").status_code == 401
    c = client(app)
    for path in ("/schedules", "/", "/sessions/sched-fresh-20260504T090000Z"):
        assert c.get(path).status_code == 200, path
    assert c.post("/schedules").status_code == 405
    assert snapshot(store) == before
    assert schedules.load(store, "fresh").next_run is None


def test_the_overview_counts_the_schedules_and_names_the_next(settings, store):
    put(store, "later", tool="kv_read", every="1h", next_run="2999-01-01T00:00:00Z")
    put(store, "sooner", tool="kv_read", every="1h", next_run=iso(datetime.now(timezone.utc) + timedelta(hours=1)))
    put(store, "held", tool="kv_read", every="1h", enabled=False)
    put(store, "broken", tool="kv_read", every="often")
    r = client(app_for(settings, store)).get("/")
    row = re.search(r"<tr><th>schedules</th><td>(.*?)</td></tr>", r.text).group(1)
    assert '<a href="/schedules">3 schedule(s), 1 paused</a>; next: sooner (kv_read) at' in row
    assert '<span class="bad">1 invalid (never run)</span>' in row


def test_the_agents_text_in_a_schedule_is_shown_as_text(settings, store):
    """Its tool's name, input and summary prompt, a broken value and a run's record are the agent's text."""
    attack = "<script>alert(1337)</script>"
    put(store, "h1", tool="<img/src=x/onerror=alert(1337)>", input={attack: attack}, every="1h", notify="inbox",
        synthesize=f'"></pre>{attack}')
    put(store, "h2", tool="kv_read", every=attack)
    store.put("schedule:<b>x</b>", attack)
    ran(store, "sched-h1-20260504T090000Z", reason=attack)
    c = client(app_for(settings, store))
    for path in ("/schedules", "/sessions/sched-h1-20260504T090000Z", "/"):
        body = c.get(path).text
        assert "<script>alert" not in body and "<img/src" not in body and "<b>x</b>" not in body, path
        assert body.count("<script") == 1, path  # the dashboard's own, and nothing else
    body = c.get("/schedules").text
    assert "&lt;img/src=x/onerror=alert(1337)&gt;" in body and "&lt;/pre&gt;&lt;script&gt;" in body
    assert "every &#39;&lt;script&gt;alert(1337)&lt;/script&gt;&#39; is not a duration" in body
    assert '<td class="nowrap">&lt;b&gt;x&lt;/b&gt;</td>' in body  # the id its key gives, as text


def test_a_schedule_whose_next_run_cannot_be_worked_out_is_a_row_saying_so(store, monkeypatch):
    from brainstem.core.errors import ConfigError

    put(store, "odd", tool="kv_read", cron="0 0 29 2 *", created_by="operator")
    put(store, "fine", tool="kv_read", every="1h", next_run="2026-05-04T10:00:00Z")

    def upcoming(schedule, now):
        if schedule.id == "odd":
            raise ConfigError("cron '0 0 29 2 *' does not run within 28 years")
        return schedule.next_run
    monkeypatch.setattr(schedules, "upcoming", upcoming)
    page = views.schedules_page(store, NOW)
    rows = {r["id"]: r for r in page["rows"]}
    assert rows["odd"]["error"] == "no next run: cron '0 0 29 2 *' does not run within 28 years"
    assert rows["odd"]["operator"] and rows["fine"]["next_run"] == "2026-05-04 10:00"
    assert page["invalid"] == 1


# --- what runs the agent, and kinds of session ---

def test_the_overview_says_whether_a_daemon_and_a_telegram_poller_are_running(settings, store):
    from brainstem.state import daemon_health

    alive = views.liveness(store, settings, NOW)
    assert not alive["daemon"]["running"] and alive["daemon"]["at"] is None
    assert not alive["telegram"]["running"] and not alive["telegram"]["configured"]
    assert "never seen" in client(app_for(settings, store)).get("/").text
    daemon_health.note_seen(store, "host-a", 4242)
    store.acquire_lease(keys.TELEGRAM_LEASE, "host-a:4242:x", 60_000)
    page = client(app_for(settings, store)).get("/").text
    assert "running</span> on host-a (pid 4242), seen" in page and "polling</span>" in page
    store.release_lease(keys.TELEGRAM_LEASE, "host-a:4242:x")
    store.put(keys.DAEMON_SEEN, {"at": iso(NOW - timedelta(hours=2)), "host": "host-a", "pid": 4242})
    store.put(keys.TELEGRAM_STATE, {"last_poll_at": iso(NOW - timedelta(hours=3))})
    alive = views.liveness(store, settings, NOW)
    assert (alive["daemon"]["running"], alive["daemon"]["at"], alive["daemon"]["ago"]) == (False, "2026-05-04 07:30",
                                                                                          "2h ago")
    assert (alive["telegram"]["running"], alive["telegram"]["ago"]) == (False, "3h ago")
    page = client(app_for(settings, store)).get("/").text
    assert "not seen since" in page and "not polling" in page


def test_each_session_is_listed_with_its_kind(settings, store):
    store.put(keys.SESSION_HISTORY, [
        {"id": "1-a", "kind": "session", "outcome": "clean", "started_at": "2026-05-04T08:00:00Z"},
        {"id": "2-b", "kind": "deep_reflect", "outcome": "clean", "started_at": "2026-05-04T09:00:00Z"}])
    k = karma.Karma(store, "dry-3")
    k.record(events.SESSION_END, outcome="clean", kind="session", dry_run=True, cost=0.001)
    store.put(keys.UNLISTED_KARMA, [{"id": "dry-3", "at": "2026-05-04T09:10:00Z"}, {"id": "gone", "at": "x"}])
    assert [views.kind_name(h) for h in store.get_json(keys.SESSION_HISTORY)] == ["session", "deep reflection"]
    assert views.kind_name({"kind": "reflex"}) == "reflexes only" and views.kind_name(None) == ""
    assert [(u["id"], u["kind"], u["kept"]) for u in views.unlisted(store)] == [("gone", "", False),
                                                                                ("dry-3", "dry run", True)]
    page = client(app_for(settings, store)).get("/sessions").text
    assert '<td class="nowrap">deep reflection</td>' in page and '<td class="nowrap">session</td>' in page
    assert "Dry runs, wakes reflexes handled, live replays" in page and "<td>dry run</td>" in page


@pytest.mark.parametrize(("truth", "shown"), [
    ({"balances": {"openrouter": None, "wallet_usdc": None}, "not_offered": ["openrouter"]},
     "LLM credit not offered by this server, wallet USDC unknown"),
    ({"balances": {"openrouter": None, "wallet_usdc": None}}, "LLM credit unknown, wallet USDC unknown"),
    ({"balances": {"openrouter": 7.25, "wallet_usdc": None}}, "LLM credit $7.25, wallet USDC unknown"),
])
def test_the_overview_tells_credit_not_offered_from_unknown(settings, store, truth, shown):
    store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-04T09:00:00Z", **truth})
    row = re.search(r"<tr><th>balances</th><td>(.*?)</td></tr>", client(app_for(settings, store)).get("/").text)
    assert html.unescape(row.group(1)).startswith(shown)


@pytest.mark.parametrize("daily, session, says", [
    ("0.004", "0.5", "$0.0057 of $0.004 daily ceiling (142.5%); per session at most $0.50"),
    ("inf", "inf", "$0.0057, no daily ceiling; per session no ceiling"),
])
def test_the_overview_states_todays_spend_against_the_ceiling_as_set(monkeypatch, store, daily, session, says):
    """A ceiling under a cent is not shown as $0.00, and no ceiling is said in words."""
    from brainstem.state.budget import today

    settings = dashboard_settings(monkeypatch, BRAINSTEM_MAX_DAILY_COST=daily, BRAINSTEM_MAX_SESSION_COST=session)
    store.settle_spend(today(), None, 0.0057)
    r = client(app_for(settings, store)).get("/")
    row = re.search(r"<tr><th>spent today</th><td>(.*?)</td></tr>", r.text).group(1)
    assert html.unescape(row) == says


def test_no_ceiling_draws_no_ceiling_line_on_the_sessions_page(monkeypatch, store):
    """With the ceilings set to inf there is none to draw (not a line at $0)."""
    settings = dashboard_settings(monkeypatch, BRAINSTEM_MAX_DAILY_COST="inf", BRAINSTEM_MAX_SESSION_COST="inf")
    store.put(keys.SESSION_HISTORY, [{"id": "1-aaaaaa", "number": 1, "outcome": "clean", "cost": 0.02, "steps": 1,
                                      "started_at": iso(datetime.now(timezone.utc)), "duration_ms": 10}])
    page = client(app_for(settings, store)).get("/sessions").text
    assert "cost per UTC day" in page and 'class="ceiling' not in page and "ceiling $" not in page
    finite = dashboard_settings(monkeypatch, BRAINSTEM_MAX_DAILY_COST="5", BRAINSTEM_MAX_SESSION_COST="0.5")
    assert "ceiling $5" in client(app_for(finite, store)).get("/sessions").text  # a finite one is named


# --- the overview: the LLM credit's runway, and paid calls held back --------------------------------------

def test_the_overview_shows_the_runway_and_that_no_paid_call_is_made(monkeypatch, store):
    from brainstem.state.budget import today as utc_today
    from brainstem.state.seed import seed

    seed(store)
    today = utc_today()  # the runway's window ends today
    store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-10T09:00:00Z", "balances": {"openrouter": 3.0}})
    store.put(keys.SPEND_DAYS, {"since": today, "days": {today: 1.5}})
    settings = dashboard_settings(monkeypatch, BRAINSTEM_MIN_CREDIT="5", OPENROUTER_BASE_URL="http://127.0.0.1:9/v1")
    store.put(keys.LLM_CREDIT, {"floor": {"since": "2026-05-10T09:00:00Z", "credit": 3.0, "min_credit": 5.0}})
    page = html.unescape(client(app_for(settings, store)).get("/").text)
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    assert "runway 2.0 days (LLM credit $3.00 at $1.5000 a day, the last 7 days' mean)" in text
    assert "no paid calls the LLM credit ($3.00) is below BRAINSTEM_MIN_CREDIT ($5.00)" in text
