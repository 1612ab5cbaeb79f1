"""``brainstem run`` runs the agents' schedules beside their sessions (:mod:`brainstem.daemon.schedules`).

The daemon runs in this process (``Runner.run``: the real scheduler, its signal handlers and threads) for
one agent of an SQLite store that sleeps for an hour, so no session is due; its schedule is a real agent
tool run in the sandbox. The same across processes and hosts is in tests/e2e/test_schedules.py.
"""

from __future__ import annotations

import threading

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.settings import load_settings
from brainstem.daemon.scheduler import Runner
from brainstem.state.schedules import load
from brainstem.store import karma
from tests.helpers import put_tool, wait_for
from tests.wake_helpers import API_KEY, iso_in, seeded

pytestmark = pytest.mark.slow

COUNT = "def execute(args, ctx):\n    ctx.kv.put('runs', str(int(ctx.kv.get('runs') or 0) + 1))\n    return 'ok'\n"


@pytest.fixture
def agent(tmp_path, llm, monkeypatch):
    """(runner, store): a daemon for an asleep agent whose schedule runs every 2 s."""
    for name in ("OPENROUTER_API_KEY", "BRAINSTEM_KV", "BRAINSTEM_KV_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/agent.db"
    store = seeded(url)
    store.put(keys.WAKE_CONFIG, {"next_wake_after": iso_in(3600)})
    put_tool(store, "count", COUNT, {"description": "counts", "kv_access": "own"})
    store.put(keys.schedule("tick"), {"tool": "count", "every": "2s", "next_run": iso(now_utc()),
                                      "created_by": "operator"})
    settings = load_settings(kv=url, openrouter_api_key=API_KEY, openrouter_base_url=llm.base_url, llm_backoff=0.01)
    yield Runner(settings, [None], grace=5.0), store
    store.close()


def runs(store) -> int:
    return int(store.get("tooldata:count:runs") or 0)


def drive(runner, until) -> dict:
    """Run the daemon (no tick fires: every hour, not now) until ``until()`` holds; what it saw."""
    seen: dict = {}

    def watch() -> None:
        try:
            seen["until"] = wait_for(until, 30, "the schedule's runs")
        finally:
            runner.stopping.set()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert runner.run("1h", None, run_now=False) == 0
    finally:
        runner.stopping.set()
        watcher.join(35)
    return seen


def test_the_daemon_runs_a_schedule_each_time_it_is_due_and_wakes_no_session(agent, llm):
    runner, store = agent
    drive(runner, lambda: runs(store) >= 3)
    ended = [k.name for k in store.list_all("karma:sched-tick-")]
    assert len(ended) >= 3
    for name in ended:
        [end] = [e for e in karma.read(store, name[len("karma:"):]) if e["event"] == "schedule_run"]
        assert end["outcome"] == "ok"
    assert runs(store) == len(ended)  # each run recorded, none twice
    assert llm.requests == [] and karma.latest_session_id(store) is None  # the agent slept on
    assert load(store, "tick").last_outcome == "ok"


def test_a_session_running_does_not_hold_the_schedules_back(agent, llm):
    runner, store = agent
    runner.agents[0].running = True  # as while one of its sessions runs (no tick fires here to end it)
    runner.grace = 0.0  # that session is not waited for at the stop
    drive(runner, lambda: runs(store) >= 2)
    assert runs(store) >= 2 and llm.requests == []
