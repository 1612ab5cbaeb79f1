"""The pool of ready sandbox workers is the process's, not a session's.

``brainstem run`` runs in this process (``Runner.run``: the real scheduler, its signal handlers and
threads) for two agents of one SQLite store, and ``brainstem wake`` as the operator runs it
(``run_cli``), against the LLM double; the waiting workers are watched from /proc, as
tests/sandbox/test_pool.py does.
"""

from __future__ import annotations

import threading

import pytest

from brainstem.core.settings import load_settings
from brainstem.daemon.scheduler import Runner, read_wake_log
from brainstem.sandbox import pool
from brainstem.state.seed import example_soul_path, seed
from brainstem.store import open_store
from tests.helpers import run_cli
from tests.sandbox.procfs import PROC, named, wait_for
from tests.wake_helpers import (
    API_KEY,
    action,
    all_text,
    answers,
    events_of,
    is_orient,
    is_reflect,
    last_session,
    plan,
    reflection,
    seeded,
    think,
    user_text,
    wake_env,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not PROC.is_dir(), reason="needs /proc (Linux)")]

SIZE = 2
WAIT = 60.0


def _agent(url: str, name: str, tmp_path) -> object:
    soul = tmp_path / f"{name}.md"
    soul.write_text(example_soul_path().read_text() + f"\n\nMy name is {name.upper()}-AGENT.\n")
    store = open_store(url, prefix=f"{name}:")
    seed(store, soul_file=soul)
    return store


def _ran(store) -> int:
    return sum(1 for e in read_wake_log(store) if e.get("fire") == "ran")


def test_one_agents_session_ending_leaves_the_others_ready_workers(tmp_path, llm, monkeypatch):
    """Bob's session fills the pool and waits in a think step; Alice's session, in the same daemon, runs a
    tool and ends; Bob's ready workers are still there, and his next tool call takes one of them. Between
    sessions the daemon keeps them, and it gives them back when it stops."""
    for name in ("OPENROUTER_API_KEY", "BRAINSTEM_KV", "BRAINSTEM_KV_PREFIX", "BRAINSTEM_AGENT"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/agents.db"
    alice, bob = _agent(url, "alice", tmp_path), _agent(url, "bob", tmp_path)
    bob_waits, alice_done = threading.Event(), threading.Event()

    def respond(req: dict):
        text = all_text(req)
        if is_reflect(req):
            return reflection()
        if is_orient(req) and "BOB-AGENT" in text:
            return plan(action("kv_read", {"key": "wisdom"}), think("bob waits"), action("kv_read", {"key": "wisdom"}))
        if is_orient(req):
            bob_waits.wait(WAIT)  # Alice starts once Bob's first call has filled the pool
            return plan(action("kv_read", {"key": "wisdom"}), think("alice thinks"))
        if "bob waits" in user_text(req):
            bob_waits.set()
            alice_done.wait(WAIT)  # Bob's session is held here, its workers ready, while Alice's ends
        return "ok"

    llm.responder = respond
    settings = load_settings(kv=url, openrouter_api_key=API_KEY, openrouter_base_url=llm.base_url, llm_backoff=0.01,
                             sandbox_pool=SIZE)
    runner = Runner(settings, ["alice", "bob"], grace=5.0)
    seen: dict = {}

    def drive() -> None:
        try:
            seen["alice ran"] = wait_for(lambda: _ran(alice), WAIT, 0.05)
            seen["ready after alice"] = len([w for w in pool.ready() if w.usable()])
            waiting = set(named("brainstem-idle"))
            alice_done.set()
            seen["bob ran"] = wait_for(lambda: _ran(bob), WAIT, 0.05)
            seen["taken"] = len(waiting - set(named("brainstem-idle")))  # the one Bob's second call ran in
            seen["ready between sessions"] = len(pool.ready())
        finally:
            alice_done.set()
            runner.stopping.set()

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        assert runner.run("1h", None) == 0
    finally:
        alice_done.set()
        runner.stopping.set()
        driver.join(WAIT)
    assert seen["alice ran"] and seen["bob ran"], seen
    assert seen["ready after alice"] == SIZE, seen
    assert seen["taken"] == 1, seen
    assert seen["ready between sessions"] == SIZE, seen
    assert pool.ready() == [] and pool.users() == 0  # stopped: given back
    assert wait_for(lambda: not named("brainstem-idle"), 5.0), "the stopped daemon's workers still wait"
    for store in (alice, bob):
        store.close()


def test_a_one_shot_wake_leaves_no_worker_waiting(tmp_path, llm):
    """`brainstem wake` ends its work with its session: the workers its tool call left ready go with it."""
    url = f"sqlite:///{tmp_path}/agent.db"
    store = seeded(url)
    llm.queue(plan(action("kv_read", {"key": "wisdom"})))
    llm.responder = answers()
    r = run_cli("wake", "--force", env=wake_env(url, llm, BRAINSTEM_SANDBOX_POOL=SIZE))
    assert r.returncode == 0, r.stdout + r.stderr
    _, entries = last_session(store)
    assert [e.get("ok") for e in events_of(entries, "tool_complete")] == [True], entries
    assert pool.ready() == [] and pool.users() == 0
    assert wait_for(lambda: not named("brainstem-idle"), 5.0), "workers still wait after the wake"
    store.close()


def _store_view(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    return SQLiteStore(tmp_path / "shared.db", prefix="bob:")


def test_shutdown_never_closes_the_session_of_the_host_that_took_the_lease_over(tmp_path):
    """A session of this daemon's still running after the grace period lost its lease to another host,
    which runs its own session now: the daemon's shutdown leaves that session's breadcrumb, schedule and
    karma alone (the holder records the lost one's end)."""
    import os

    from brainstem.core import keys
    from brainstem.daemon.scheduler import Agent
    from brainstem.store import karma
    from brainstem.store.lease import host_name

    st = _store_view(tmp_path)
    mine = f"{host_name()}:{os.getpid()}:mine"
    assert st.acquire_lease(keys.WAKE_LEASE, mine, 30_000)
    assert st.release_lease(keys.WAKE_LEASE, mine) and st.acquire_lease(keys.WAKE_LEASE, "host-b:2:theirs", 30_000)
    karma.begin_session(st, "2-theirs", lease="host-b:2:theirs")
    st.put(keys.WAKE_CONFIG, {"next_wake_after": "2999-01-01T00:00:00Z", "set_by": "2-theirs"})
    before = {k.name: st.get(k.name) if not k.is_log else st.read_log(k.name) for k in st.list_all("")}
    runner = Runner.__new__(Runner)
    runner.grace = 30.0
    runner._force_interrupted(Agent(name="bob", prefix="bob:", store=st))
    after = {k.name: st.get(k.name) if not k.is_log else st.read_log(k.name) for k in st.list_all("")}
    assert after == before and st.lease_owner(keys.WAKE_LEASE) == "host-b:2:theirs"


def test_shutdown_records_its_own_session_still_running_as_interrupted(tmp_path):
    import os

    from brainstem.core import keys, outcomes
    from brainstem.daemon.scheduler import Agent
    from brainstem.state import history
    from brainstem.store import karma
    from brainstem.store.lease import host_name

    st = _store_view(tmp_path)
    mine = f"{host_name()}:{os.getpid()}:mine"
    assert st.acquire_lease(keys.WAKE_LEASE, mine, 30_000)
    karma.begin_session(st, "1-mine", lease=mine)
    runner = Runner.__new__(Runner)
    runner.grace = 30.0
    runner._force_interrupted(Agent(name="bob", prefix="bob:", store=st))
    assert karma.read_breadcrumb(st) is None and st.lease_owner(keys.WAKE_LEASE) is None
    assert [e["outcome"] for e in history.recent(st, 5)] == [outcomes.INTERRUPTED]
