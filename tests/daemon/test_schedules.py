"""``brainstem run`` runs the agents' schedules beside their sessions (:mod:`brainstem.daemon.schedules`).

The daemon runs in this process (``Runner.run``: the real scheduler, its signal handlers and threads) for
one agent of an SQLite store that sleeps for an hour, so no session is due; its schedule is a real agent
tool run in the sandbox. The same across processes and hosts is in tests/e2e/test_schedules.py.

How it finds what is due, the store's due index, is tested with the watch alone (a recording scheduler):
each path that writes a schedule sets its entry, the full look corrects what was written around Brainstem,
and an agent whose entries stay due (no daemon serves it) holds no other agent back.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from datetime import timedelta

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.settings import load_settings
from brainstem.daemon import schedules
from brainstem.daemon.scheduler import Agent, Runner
from brainstem.state.guarded import AgentKV
from brainstem.state.schedules import Limits, load
from brainstem.state.sleep import due_now
from brainstem.store import karma, open_store
from brainstem.store.due import LOOK
from tests.helpers import ok, put_tool, run_cli, wait_for
from tests.wake_helpers import API_KEY, iso_in, seeded

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_session_running_does_not_hold_the_schedules_back(agent, llm):
    runner, store = agent
    runner.agents[0].running = True  # as while one of its sessions runs (no tick fires here to end it)
    runner.grace = 0.0  # that session is not waited for at the stop
    drive(runner, lambda: runs(store) >= 2)
    assert runs(store) >= 2 and llm.requests == []


# --- the due index ------------------------------------------------------------------------------------------

def body(next_run: str, **fields) -> dict:
    return {"tool": "noop", "every": "1h", "next_run": next_run, "created_by": "operator", **fields}


def written_around(url: str, prefix: str, key: str, value: dict) -> None:
    """``value`` at ``key`` written by a plain client, as something outside Brainstem would."""
    if url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(url.split("?", 1)[0])
        client.set(prefix + key, json.dumps(value))
        client.close()
        return
    db = sqlite3.connect(url[len("sqlite:///"):])
    db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
               (prefix + key, json.dumps(value)))
    db.commit()
    db.close()


class Sched:
    """The daemon's scheduler, recording the passes it is asked to start."""

    def __init__(self):
        self.jobs: list[str] = []

    def add_job(self, fn, args, id, **_):  # noqa: A002 - APScheduler's own name
        self.jobs.append(id)


class FakeRunner:
    def __init__(self, url: str, names: list[str]):
        self.settings = load_settings(kv=url, openrouter_api_key=API_KEY)
        self.agents = [Agent(name=n, prefix=n + ":", store=open_store(url, prefix=n + ":")) for n in names]
        self.stopping = threading.Event()
        self.metrics = None

    def _providers(self):
        return None

    def fire(self, agent):  # a watch starts it as a job; Sched records the job's id instead
        raise AssertionError("not run here")


@pytest.fixture
def fleet(real_store_url):
    """``fleet(*names)`` -> a daemon's runner for those agents (unique names per test on the shared Redis)."""
    made = []

    def make(*names: str) -> FakeRunner:
        tag = f"{time.monotonic_ns() % 10**9}"
        runner = FakeRunner(real_store_url, [f"{n}{tag}" for n in names])
        made.append(runner)
        return runner
    yield make
    for runner in made:
        for a in (a for a in runner.agents if a.store is not None):
            for info in a.store.list_all(keys.SCHEDULE_PREFIX):
                a.store.delete(info.name)
            a.store.set_due(LOOK, None)
            a.store.close()


def test_each_path_that_writes_a_schedule_sets_its_entry(fleet, real_store_url):
    [agent] = fleet("paths").agents
    store, env = agent.store, {"BRAINSTEM_KV": real_store_url, "BRAINSTEM_KV_PREFIX": agent.prefix}
    later = iso(now_utc() + timedelta(hours=2))
    put_tool(store, "noop", "def execute(args, ctx):\n    return 'ok'\n", {"description": "nothing"})
    AgentKV(store, limits=Limits(min_interval=60)).put("schedule:byagent", {"tool": "noop", "every": "1h"})
    ok(run_cli("kv", "put", "schedule:bykv", json.dumps(body(later)), env=env))
    new_id = ok(run_cli("schedule", "add", "noop", "--every", "1h", env=env)).strip()
    for key in ("schedule:byagent", "schedule:bykv", f"schedule:{new_id}"):
        stored = json.loads(store.get(key))
        assert store.due_at(key) == pytest.approx(now_utc().fromisoformat(stored["next_run"].replace("Z", "+00:00"))
                                                  .timestamp())
    ok(run_cli("schedule", "pause", new_id, env=env))
    assert store.due_at(f"schedule:{new_id}") is None  # paused: nothing to look at
    ok(run_cli("schedule", "rm", new_id, env=env))
    ok(run_cli("kv", "del", "schedule:bykv", env=env))
    assert store.due_at("schedule:bykv") is None and store.due_at(f"schedule:{new_id}") is None


def test_the_runners_claim_moves_the_entry_on(fleet):
    runner = fleet("claim")
    [agent] = runner.agents
    agent.store.put("schedule:tick", body(iso(now_utc() - timedelta(seconds=5)), tool="nosuchtool"))
    assert due_now(agent.store) == ["schedule:tick"]
    schedules.run_pass(runner, agent)
    next_run = load(agent.store, "tick").next_run
    assert next_run is not None and next_run > iso(now_utc())
    assert agent.store.due_at("schedule:tick") == pytest.approx(now_utc().fromisoformat(
        next_run.replace("Z", "+00:00")).timestamp())
    assert due_now(agent.store) == [] and not schedules.due_agents(runner, schedules._Watch(runner))


def test_a_schedule_written_around_brainstem_is_found_by_the_full_look(fleet, real_store_url):
    [agent] = fleet("around").agents
    store = agent.store
    store.put("schedule:known", body(iso(now_utc() + timedelta(hours=1))))
    assert due_now(store) == []  # the first look, a full one, sets the next at RELOOK
    written_around(real_store_url, agent.prefix, "schedule:hidden", body(iso(now_utc() - timedelta(seconds=5))))
    assert store.due_at("schedule:hidden") is None and due_now(store) == []  # the index does not know it yet
    store.set_due(LOOK, time.time() - 1)  # RELOOK has passed
    assert due_now(store) == ["schedule:hidden"]  # found, and indexed
    assert store.due_at("schedule:hidden") is not None and store.due_at(LOOK) > time.time() + 60


def test_a_stale_or_missing_entry_is_corrected(fleet, real_store_url):
    [agent] = fleet("stale").agents
    store = agent.store
    store.put("schedule:a", body(iso(now_utc() + timedelta(hours=1))))
    due_now(store)
    store.set_due("schedule:a", time.time() - 10)  # stale: says due, the schedule says not
    store.set_due("schedule:gone", time.time() - 10)  # its schedule is not there at all
    assert due_now(store) == []
    assert store.due_at("schedule:a") > time.time() + 3000 and store.due_at("schedule:gone") is None
    store.set_due("schedule:a", None)  # missing: the full look puts it back
    store.set_due(LOOK, time.time() - 1)
    assert due_now(store) == [] and store.due_at("schedule:a") > time.time() + 3000


def test_the_watch_starts_passes_only_for_agents_with_something_due(fleet):
    runner = fleet("due", "idle", "other")
    due, idle, other = runner.agents
    due.store.put("schedule:now", body(iso(now_utc() - timedelta(seconds=2))))
    idle.store.put("schedule:later", body(iso(now_utc() + timedelta(hours=1))))
    for a in runner.agents:
        due_now(a.store) if a is not due else None  # looked at: their next full look is RELOOK away
    sched = Sched()
    schedules.watch(runner, sched)  # the first tick: each agent once (its index may not exist yet)
    assert len(sched.jobs) == 3
    sched = Sched()
    schedules.watch(runner, sched)
    assert sched.jobs == [f"schedules-{due.name}"] and other.name  # the idle ones cost nothing


def test_an_agent_no_daemon_serves_holds_no_other_back(fleet):
    served = fleet("served")
    dead = fleet("dead")  # its entries stay due: no daemon runs it
    [a] = served.agents
    [d] = dead.agents
    d.store.put("schedule:stuck", body(iso(now_utc() - timedelta(hours=1))))
    a.store.put("schedule:now", body(iso(now_utc() - timedelta(seconds=2))))
    w = schedules._Watch(served)
    w.unlooked = []
    served.agents.append(Agent(name="nobody", prefix="nobody:"))  # two agents: the index across agents is asked
    w.by_name["nobody"] = served.agents[-1]
    schedules._WATCHES[served] = w
    sched = Sched()
    schedules.watch(served, sched)
    assert sched.jobs == [f"schedules-{a.name}"]
