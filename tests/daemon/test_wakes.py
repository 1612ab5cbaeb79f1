"""The daemon's watch for urgent messages and dead sessions (:mod:`brainstem.daemon.wakes`), driven by the
store's wake index: with a recording scheduler, on a real Redis and SQLite, each wake it starts and each
entry it sets from what the real keys say; and, with many idle agents on fakeredis, the store commands of a
whole tick (the schedules' watch, the urgent watch and the dead-session sweep), the same for 40 agents as for
400. Whole daemons picking up an urgent message and a dead host are in tests/state/test_inbox.py and
tests/store/test_lease.py.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.settings import load_settings
from brainstem.daemon import wakes
from brainstem.daemon.scheduler import Agent, Runner
from brainstem.session.wake import dead_session_due, urgent_due
from brainstem.state import inbox
from brainstem.state.sleep import PESSIMISTIC
from brainstem.store.due import LEASE, URGENT, WAKES
from tests.daemon.test_schedules import FakeRunner, Sched, fleet, written_around  # noqa: F401 -- fleet: its fixture


@pytest.fixture
def daemon(real_store_url, request):  # the store parametrizes the fleet it asks for
    """``daemon(*names)`` -> a daemon's runner for those agents, each asleep for an hour, past its first pass."""
    make_runner, made = request.getfixturevalue("fleet"), []

    def make(*names: str) -> FakeRunner:
        runner = make_runner(*names)
        for a in runner.agents:
            a.store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(hours=1))})
        made.append(runner)
        tick(runner)  # the first pass: each agent looked at in full
        return runner
    yield make
    for runner in made:
        for a in runner.agents:
            for key, _ in a.store.due_keys(index=WAKES):
                a.store.set_due(key, None, WAKES)


def tick(runner) -> list[str]:
    sched = Sched()
    wakes.watch(runner, sched)
    return sched.jobs


def pessimistic(retry_in: float = 0.0) -> dict:
    """wake_config as a session leaves it when it starts (and, if it dies, after)."""
    return {"next_wake_after": iso(now_utc() + timedelta(hours=1)), "set_by": PESSIMISTIC, "session_id": "1-dead",
            "retry_after": iso(now_utc() + timedelta(seconds=retry_in)), "crash_streak": 0}


def test_an_urgent_message_wakes_its_agent_once_and_its_entry_goes_once_it_is_shown(daemon):
    runner = daemon("urgent", "quiet")
    agent, quiet = runner.agents
    assert tick(runner) == []
    message = inbox.post(agent.store, "the server is on fire", urgent=True)
    assert tick(runner) == [f"urgent-{agent.name}"]  # the quiet agent costs nothing, and is not woken
    assert agent.store.due_at(URGENT, WAKES) == pytest.approx(time.time() + wakes.URGENT_REFIRE, abs=5)
    assert tick(runner) == []  # once per message
    inbox.note_shown(agent.store, message["id"])  # a session put it before the model
    agent.store.set_due(URGENT, time.time() - 1, WAKES)  # the refire time has come
    assert tick(runner) == [] and agent.store.due_at(URGENT, WAKES) is None  # nothing waits: gone
    assert urgent_due(agent.store) == 0 and quiet.store.due_keys(index=WAKES) == []


def test_an_urgent_message_left_while_a_session_runs_waits_for_its_end(daemon):
    [agent] = daemon("busy").agents
    inbox.post(agent.store, "after your plan", urgent=True)
    assert agent.store.acquire_lease(keys.WAKE_LEASE, "host-b:1:running", 60_000)  # a session runs elsewhere
    agent.store.put(keys.WAKE_CONFIG, pessimistic())
    assert tick_one(agent) == [] and agent.store.due_at(URGENT, WAKES) is not None  # asked again next tick
    assert agent.store.release_lease(keys.WAKE_LEASE, "host-b:1:running")
    agent.store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(hours=1))})  # it ended
    assert tick_one(agent) == [f"urgent-{agent.name}"]


def test_a_dead_session_is_picked_up_when_its_lease_runs_out(daemon):
    runner = daemon("dead", "alive")
    dead, alive = runner.agents
    for a, owner in ((dead, "host-gone:1:dead"), (alive, "host-b:1:alive")):
        a.store.put(keys.WAKE_CONFIG, pessimistic())
        assert a.store.acquire_lease(keys.WAKE_LEASE, owner, 1_000)
    assert alive.store.renew_lease(keys.WAKE_LEASE, "host-b:1:alive", 60_000)  # its heartbeat: it runs on
    assert tick(runner) == []  # the lease is held: nothing is due yet
    assert dead.store.due_at(LEASE, WAKES) == pytest.approx(time.time() + 1, abs=1)
    time.sleep(max(0.0, dead.store.due_at(LEASE, WAKES) - time.time()) + 0.2)
    assert dead_session_due(dead.store)
    assert tick(runner) == [f"pickup-{dead.name}"]
    # Looked at again half a lease period on, should the pickup not take: not every second.
    assert dead.store.due_at(LEASE, WAKES) == pytest.approx(time.time() + wakes.recheck(runner), abs=2)
    assert alive.store.due_at(LEASE, WAKES) > time.time() + 50


def test_the_lease_entry_follows_what_the_keys_say(daemon):
    [agent] = daemon("crashy").agents
    store = agent.store
    store.put(keys.WAKE_CONFIG, pessimistic(retry_in=120))  # a crash loop backing off
    store.set_due(LEASE, time.time() - 1, WAKES)
    assert tick_one(agent) == [] and store.due_at(LEASE, WAKES) == pytest.approx(time.time() + 120, abs=3)
    assert store.acquire_lease(keys.WAKE_LEASE, "host-b:1:live", 60_000)  # found running when asked
    store.put(keys.WAKE_CONFIG, pessimistic())
    store.set_due(LEASE, time.time() - 1, WAKES)
    assert tick_one(agent) == [] and store.due_at(LEASE, WAKES) > time.time()
    store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(minutes=5))})  # it ended
    store.set_due(LEASE, time.time() - 1, WAKES)
    assert tick_one(agent) == [] and store.due_at(LEASE, WAKES) is None
    store.set_due("stray", time.time() - 1, WAKES)  # not an entry of the watch's
    assert tick_one(agent) == [] and store.due_keys(index=WAKES) == []


def tick_one(agent) -> list[str]:
    """A tick of a daemon serving ``agent`` alone (past its first pass)."""
    runner = FakeRunner.__new__(FakeRunner)
    runner.settings, runner.agents, runner.stopping, runner.metrics = load_settings(), [agent], _Never(), None
    w = wakes._Watch(runner)
    w.first = False
    w.next = 1  # the full look's turn is elsewhere
    wakes._WATCHES[runner] = w
    return tick(runner)


class _Never:
    def is_set(self) -> bool:
        return False


def test_the_full_look_finds_an_urgent_mark_written_around_brainstem(daemon, real_store_url):
    runner = daemon("around", "other")
    agent = runner.agents[0]
    written_around(real_store_url, agent.prefix, keys.INBOX_URGENT, 5)  # as a plain client would
    assert agent.store.due_at(URGENT, WAKES) is None  # the index was not told
    wakes._WATCHES[runner].next = 0  # its turn for a full look
    assert tick(runner) == [f"urgent-{agent.name}"]
    assert tick(runner) == []  # found once: the entry is the index's now


# --- the cost of a tick -----------------------------------------------------------------------------------

def idle_daemon(n: int, client) -> Runner:
    """A daemon's runner over ``n`` idle agents on fakeredis: each asleep, with an urgent message long read."""
    from brainstem.store.redis.store import RedisStore

    runner = Runner(load_settings(kv="redis://fake/0", openrouter_api_key="sk-unused"), [f"i{i}" for i in range(n)])
    for agent in runner.agents:
        agent.store = RedisStore("redis://fake/0", prefix=agent.prefix, client=client)
        agent.store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(hours=1))})
        for key in (keys.INBOX_COUNTER, keys.INBOX_URGENT, keys.INBOX_READ):  # message 1, urgent, was read
            agent.store.put(key, "1")
    runner.index = RedisStore("redis://fake/0", prefix="", client=client)  # type: ignore[attr-defined]
    return runner


def commands_per_tick(n: int, monkeypatch) -> tuple[int, int]:
    """(store commands of a tick of the daemon's watch over ``n`` idle agents, of the same look at each)."""
    import fakeredis

    client = fakeredis.FakeRedis(decode_responses=True)
    runner = idle_daemon(n, client)
    calls: list[str] = []
    original = client.execute_command
    monkeypatch.setattr(client, "execute_command", lambda *a, **k: (calls.append(a[0]), original(*a, **k))[1])
    for _ in range(n // wakes.FIRST_PASS + 2):  # the first pass round the agents, then one tick more
        runner.watch_inboxes(Sched())
    calls.clear()
    runner.watch_inboxes(Sched())
    tick_cost = len(calls)
    calls.clear()
    for agent in runner.agents:  # what the watch read of each agent before the index
        urgent_due(agent.store)
        dead_session_due(agent.store)
    return tick_cost, len(calls)


def test_a_tick_costs_in_proportion_to_what_is_due_not_to_the_agents(monkeypatch):
    few, looked_few = commands_per_tick(40, monkeypatch)
    many, looked_many = commands_per_tick(400, monkeypatch)
    # Each index read once, and this tick's share of the safety net's full looks (one agent of either).
    assert few == many <= 12, (few, many)
    assert looked_many >= 3 * 400 and looked_few >= 3 * 40  # a get or more of each agent's keys, each second


def test_an_agent_with_something_due_adds_only_its_own_reads(monkeypatch):
    import fakeredis

    client = fakeredis.FakeRedis(decode_responses=True)
    runner = idle_daemon(300, client)
    for _ in range(3):
        runner.watch_inboxes(Sched())
    inbox.post(runner.agents[123].store, "now", urgent=True)
    calls: list[str] = []
    original = client.execute_command
    monkeypatch.setattr(client, "execute_command", lambda *a, **k: (calls.append(a[0]), original(*a, **k))[1])
    sched = Sched()
    runner.watch_inboxes(sched)
    assert sched.jobs == ["urgent-i123"]
    assert len(calls) <= 25, calls


def test_a_runner_with_no_agents_looks_at_nothing():
    runner = FakeRunner.__new__(FakeRunner)
    runner.settings, runner.agents, runner.stopping, runner.metrics = load_settings(), [], _Never(), None
    assert tick(runner) == []


def test_an_agent_running_here_or_backing_off_is_left_for_later(daemon):
    [agent] = daemon("later").agents
    inbox.post(agent.store, "now", urgent=True)
    agent.running = True
    assert tick_one(agent) == [] and agent.store.due_at(URGENT, WAKES) is not None
    agent.running, agent.backoff_until = False, time.monotonic() + 60
    assert tick_one(agent) == []
    agent.backoff_until = 0.0
    assert tick_one(agent) == [f"urgent-{agent.name}"]


def test_an_unopened_agent_is_skipped():
    assert not wakes._idle(Agent(name="x", prefix="x:"))


# --- a whole daemon ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_brainstem_run_wakes_an_urgent_message_and_takes_a_dead_session_over_from_the_index(real_store_url, llm,
                                                                                          monkeypatch):
    """``Runner.run`` in this process (the real scheduler and threads) for two agents asleep for an hour: one
    gets an urgent message, the other's session died on a host that is gone. The index across agents tells the
    watch of both; each is woken once, by its own kind of fire."""
    from brainstem.core.clock import now_iso
    from brainstem.store import karma
    from tests.helpers import wait_for
    from tests.wake_helpers import API_KEY, events_of, responder, seeded

    for var in ("OPENROUTER_API_KEY", "BRAINSTEM_KV", "BRAINSTEM_KV_PREFIX", "BRAINSTEM_AGENT"):
        monkeypatch.delenv(var, raising=False)
    base, tag = real_store_url.split("?")[0], f"{time.monotonic_ns() % 10**9}"
    told, dead = f"told{tag}", f"dead{tag}"
    stores = {n: seeded(f"{base}?prefix={n}") for n in (told, dead)}
    for store in stores.values():
        store.put(keys.WAKE_CONFIG, {"next_wake_after": iso(now_utc() + timedelta(hours=1))})
    gone = "host-gone:1:x"
    stores[dead].put(keys.WAKE_CONFIG, pessimistic())
    stores[dead].put(keys.SESSION_CURRENT, {"id": "1-dead", "started_at": now_iso(ms=True), "pid": 1,
                                           "host": "host-gone", "lease": gone})
    assert stores[dead].acquire_lease(keys.WAKE_LEASE, gone, 2_000)
    llm.responder = responder()
    settings = load_settings(kv=base, openrouter_api_key=API_KEY, openrouter_base_url=llm.base_url, llm_backoff=0.01,
                             lease_seconds=2)
    runner = Runner(settings, [told, dead], grace=5.0)

    def started(name: str) -> dict | None:
        sid = karma.latest_session_id(stores[name])
        entries = karma.read(stores[name], sid) if sid and sid != "1-dead" else []
        return entries[0] if entries and events_of(entries, "session_end") else None

    seen: dict = {}

    def drive() -> None:
        try:
            time.sleep(1.5)  # the daemon's first ticks: neither is due yet (an hour's sleep, a lease held)
            seen["quiet"] = (started(told), started(dead))
            inbox.post(stores[told], "this cannot wait", urgent=True)
            seen["told"] = wait_for(lambda: started(told), 30, "the urgent session")
            seen["dead"] = wait_for(lambda: started(dead), 30, "the takeover")
        finally:
            runner.stopping.set()
    driver = threading.Thread(target=drive)
    driver.start()
    try:
        assert runner.run("1h", None, run_now=False) == 0
    finally:
        runner.stopping.set()
        driver.join(60)
    assert seen["quiet"] == (None, None), seen
    assert seen["told"]["woke_for"] == "urgent_inbox"
    assert seen["dead"]["crashed_session"] == "1-dead"
    for store in stores.values():
        assert [f["fire"] for f in map(json.loads, store.read_log(keys.WAKE_LOG))] == ["ran"]
        store.close()
