"""Wake now, dry run and replay from the dashboard (``brainstem/operator/dashboard/actions.py``), in-process.

The app runs in-process (Starlette's ``TestClient``) over a real SQLite store and starts each action as the
real ``brainstem`` command, a process against the LLM double:

* wake now runs a session (``wake --force``) whose outcome line and session the action's page shows; a dry
  run writes nothing but its karma; a replay of that session says ``same behaviour``;
* a POST without its CSRF token, or one a browser says another origin sent (another site, or another port
  of this host: same site, not same origin), is 403 and starts nothing;
* one action at a time per agent, run for the agent whose page started it; the process never gets the
  dashboard's token; bad input is a one-line 400, and what the command says is shown as text.
"""

from __future__ import annotations

import sys
import time

import pytest

from brainstem.core import keys
from brainstem.core.errors import BadArgument
from brainstem.operator.dashboard import actions, auth
from brainstem.operator.dashboard.app import make_app
from brainstem.state import history as session_history
from brainstem.state.seed import example_soul_path, seed
from brainstem.store import karma, open_store
from tests.dashboard_client import TOKEN, app_for, client, dashboard_settings
from tests.doubles import LLMDouble
from tests.helpers import one_line
from tests.wake_helpers import answers, plan, reflection, seeded, think, wake_env


def csrf_of(c) -> str:
    c.get("/")
    return c.cookies.get(auth.CSRF_COOKIE)


def wait_done(c, location: str, timeout: float = 90) -> dict:
    action_id = location.split("?")[0].rsplit("/", 1)[1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = c.get(f"/api/actions/{action_id}").json()
        if state["state"] == "done":
            return state
        time.sleep(0.2)
    pytest.fail(f"action {action_id} did not end: {state}")


@pytest.fixture
def world(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = seeded(url)
    with LLMDouble() as llm:
        llm.responder = answers(default=plan(think("Say hello", id="hi")), reflect=reflection("said hello"))
        env = wake_env(url, llm, BRAINSTEM_DASHBOARD_TOKEN=TOKEN)
        settings = dashboard_settings(monkeypatch, **env)
        monkeypatch.setenv("BRAINSTEM_DASHBOARD_TOKEN", TOKEN)  # the dashboard's, never its actions'
        yield store, client(app_for(settings, store)), llm
    store.close()


def test_wake_now_then_a_dry_run_then_a_replay_each_as_the_command_line_runs_them(world):
    store, c, llm = world
    r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), "do": "wake"})
    assert r.status_code == 303 and r.headers["location"].startswith("/actions/"), r.text
    page = c.get(r.headers["location"])
    assert page.status_code == 200 and "brainstem wake --force" in page.text
    done = wait_done(c, r.headers["location"])
    sid = done["session_id"]
    assert done["returncode"] == 0 and done["outcome"] == "clean", done
    assert done["summary"].startswith(f"session {sid}: clean"), done["summary"]
    assert [h["id"] for h in session_history.read(store)] == [sid]
    page = c.get(r.headers["location"]).text
    assert f'href="/sessions/{sid}"' in page and done["summary"].split(";")[0] in page

    before = {k.name for k in store.list_all()}
    history = session_history.read(store)
    r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), "do": "dry_run"})
    dry = wait_done(c, r.headers["location"])
    assert dry["returncode"] == 0 and dry["session_id"] and dry["session_id"] != sid, dry
    assert karma.read(store, dry["session_id"])[-1].get("dry_run") is True
    assert session_history.read(store) == history  # a dry run is no session of the history
    assert {k.name for k in store.list_all()} - before <= {keys.karma(dry["session_id"])} | {
        keys.UNLISTED_KARMA, keys.DAILY_COST, keys.LAST_GROUND_TRUTH}

    r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), "do": "replay", "session": sid})
    replayed = wait_done(c, r.headers["location"])
    assert (replayed["returncode"], replayed["verdict"]) == (0, "same behaviour"), replayed
    page = c.get(r.headers["location"]).text
    assert "same behaviour" in page and f'href="/sessions/{sid}"' in page
    # The session's page offers the replay, and the overview lists what was started from it.
    assert 'name="do" value="replay"' in c.get(f"/sessions/{sid}").text
    overview = c.get("/").text
    assert overview.count('href="/actions/') == 3 and "Wake now" in overview and "Dry run" in overview


def test_a_replay_of_an_unknown_session_says_so_as_text(world):
    store, c, llm = world
    hostile = '99-<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), "do": "replay", "session": hostile})
    done = wait_done(c, r.headers["location"])
    assert (done["returncode"], done["verdict"]) == (2, "cannot be replayed") and "99-" in done["output"]
    page = c.get(r.headers["location"]).text
    assert "cannot be replayed" in page and "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the command it ran, and what it said, as text


@pytest.mark.parametrize("case", ["no csrf", "other site", "same site, other port", "other origin, no fetch header",
                                  "null origin"])
def test_an_action_from_another_origin_or_without_its_csrf_token_starts_nothing(world, case):
    store, c, llm = world
    form = {"do": "wake"}
    if case != "no csrf":
        form[auth.CSRF_FIELD] = csrf_of(c)
    headers = {"other site": {"sec-fetch-site": "cross-site", "origin": "https://evil.example"},
               "same site, other port": {"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:9999"},
               "other origin, no fetch header": {"origin": "http://127.0.0.1:9999"},
               "null origin": {"origin": "null"}}.get(case, {})
    r = c.post("/actions", data=form, headers=headers)
    assert r.status_code == 403 and one_line(r.text), (r.status_code, r.text)
    time.sleep(0.3)
    d = c.app.state.dashboard
    assert d.actions.recent("") == [] and not llm.requests and not session_history.read(store)


def test_the_dashboards_own_origin_is_let_through(world):
    store, c, llm = world
    r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), "do": "replay", "session": "1"},
               headers={"origin": "http://127.0.0.1:8765", "sec-fetch-site": "same-origin"})
    assert r.status_code == 303, r.text
    wait_done(c, r.headers["location"])


def test_bad_input_is_a_one_line_400_and_starts_nothing(world):
    store, c, llm = world
    for form in ({"do": "rm -rf"}, {"do": "replay"}, {"do": "replay", "session": "--live"}):
        r = c.post("/actions", data={auth.CSRF_FIELD: csrf_of(c), **form})
        assert r.status_code == 400 and one_line(r.text), (form, r.text)
    assert c.app.state.dashboard.actions.recent("") == []
    assert c.get("/actions/nope").status_code == 404 and c.get("/api/actions/nope").status_code == 404


def test_one_action_at_a_time_per_agent_and_never_the_dashboards_token():
    slow = actions.Actions(program=[sys.executable, "-c", "import time; time.sleep(1.5)"])
    first = slow.start("wake", "a")
    with pytest.raises(BadArgument, match="still running"):
        slow.start("dry_run", "a")
    other = slow.start("wake", "b")  # another agent's is its own
    assert slow.running("a") is first and slow.running("b") is other
    env = actions.child_env("b", {"BRAINSTEM_DASHBOARD_TOKEN": TOKEN, "BRAINSTEM_KV": "sqlite:///x.db", "PATH": "/bin"})
    assert env == {"BRAINSTEM_KV": "sqlite:///x.db", "PATH": "/bin", "BRAINSTEM_KV_PREFIX": "b"}
    assert "BRAINSTEM_KV_PREFIX" not in actions.child_env("", {})
    deadline = time.monotonic() + 10
    while slow.running("a") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first.state == "done" and first.returncode == 0
    assert slow.start("dry_run", "a").kind == "dry_run"


def test_an_action_runs_the_agent_whose_page_started_it(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    stores = {}
    for name in ("a", "b"):
        stores[name] = open_store(url, prefix=name)
        seed(stores[name], soul_file=example_soul_path())
    with LLMDouble() as llm:
        llm.responder = answers(default=plan(think("Say hello", id="hi")), reflect=reflection("said hello"))
        settings = dashboard_settings(monkeypatch, **wake_env(url, llm))
        c = client(make_app(settings, stores, token=TOKEN, loopback_only=True))
        c.get("/?agent=b")
        r = c.post("/actions", data={auth.CSRF_FIELD: c.cookies.get(auth.CSRF_COOKIE), "do": "wake", "agent": "b"})
        assert r.status_code == 303 and "agent=b" in r.headers["location"], r.text
        action_id = r.headers["location"].split("?")[0].rsplit("/", 1)[1]
        assert c.get(f"/api/actions/{action_id}?agent=a").status_code == 404  # another agent's page: not here
        deadline = time.monotonic() + 90
        while c.get(f"/api/actions/{action_id}?agent=b").json()["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
        done = c.get(f"/api/actions/{action_id}?agent=b").json()
    assert done["outcome"] == "clean", done
    assert [h["id"] for h in session_history.read(stores["b"])] == [done["session_id"]]
    assert session_history.read(stores["a"]) == []
    for s in stores.values():
        s.close()


def test_a_command_that_cannot_start_is_one_line_and_nothing_is_left_running(tmp_path):
    broken = actions.Actions(program=[str(tmp_path / "no-such-program")])
    with pytest.raises(BadArgument, match="could not start brainstem wake --force"):
        broken.start("wake", "")
    assert broken.running("") is None and broken.recent("") == []
