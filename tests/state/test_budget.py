"""The daily ceiling is a reservation: before a metered request its worst case is held against today's spend
in the store, atomically (one Lua script on Redis, one BEGIN IMMEDIATE transaction on SQLite), so spenders
in many threads, processes and hosts can never book past the ceiling together; after the answer the hold is
settled at the actual cost. A hold whose process died stops counting at its deadline. Today's spend itself is
one atomic store operation: spenders at once lose no update, and a lock left under its name delays nothing."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
import uuid

import pytest

from brainstem.core import keys
from brainstem.state.budget import (
    Budget,
    BudgetExceeded,
    DailyLedger,
    add_daily,
    daily_reserved,
    daily_spent,
    dollars,
    today,
)
from brainstem.store import open_store
from tests.helpers import unique_prefix, wait_for

CEILING = 0.10
AMOUNT = 0.01  # exactly ten fit under the ceiling


def hold_many(url: str, attempts: int, out=None) -> int:
    """Try ``attempts`` holds of AMOUNT (kept, not settled) through a connection of its own; how many were granted."""
    store = open_store(url)
    day = today()
    granted = [t for t in (uuid.uuid4().hex for _ in range(attempts))
               if store.reserve_spend(day, AMOUNT, CEILING, t, 60)]
    store.close()
    if out is not None:
        out.put(granted)
    return len(granted)


def settle_all(url: str, tokens: list[str], actual: float) -> None:
    store = open_store(url)
    for t in tokens:
        store.settle_spend(today(), t, actual)
    store.close()


def test_threads_never_hold_past_the_ceiling(real_store_url):
    from queue import Queue

    out: Queue = Queue()
    threads = [threading.Thread(target=hold_many, args=(real_store_url, 8, out)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokens = [tok for _ in threads for tok in out.get()]
    assert len(tokens) == round(CEILING / AMOUNT)  # 48 tries, ten granted: never an eleventh
    store = open_store(real_store_url)
    assert store.daily_spend(today()) == (0.0, pytest.approx(CEILING))
    assert daily_spent(store) == 0.0 and daily_reserved(store) == pytest.approx(CEILING)  # held is not spent
    settle_all(real_store_url, tokens, AMOUNT)
    assert store.daily_spend(today()) == (pytest.approx(CEILING), 0.0)
    assert not store.reserve_spend(today(), AMOUNT, CEILING, "one-more", 60)


def test_processes_never_hold_past_the_ceiling(real_store_url):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=hold_many, args=(real_store_url, 6, out)) for _ in range(5)]
    for p in procs:
        p.start()
    tokens = [tok for _ in procs for tok in out.get(timeout=60)]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(tokens) == round(CEILING / AMOUNT)
    settle_all(real_store_url, tokens, AMOUNT)
    store = open_store(real_store_url)
    assert daily_spent(store) == pytest.approx(CEILING) and daily_spent(store) <= CEILING + 1e-9


def test_spenders_reserving_and_settling_at_once_never_book_past_the_ceiling(real_store_url):
    """The way requests really go: hold, wait for the answer, settle at what it cost, again, until refused."""
    def spender():
        store = open_store(real_store_url)
        while True:
            token = uuid.uuid4().hex
            if not store.reserve_spend(today(), 0.007, CEILING, token, 60):
                break
            time.sleep(0.001)
            store.settle_spend(today(), token, 0.006)  # the answer cost less than its worst case
        store.close()

    threads = [threading.Thread(target=spender) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = open_store(real_store_url)
    spent, held = store.daily_spend(today())
    assert held == 0.0 and CEILING - 0.007 < spent <= CEILING + 1e-9


def test_an_expired_hold_stops_counting(real_store_url):
    store = open_store(real_store_url)
    day = today()
    assert store.reserve_spend(day, CEILING, CEILING, "a-process-that-died", 0.3)
    assert not store.reserve_spend(day, AMOUNT, CEILING, "next", 60)
    assert store.daily_spend(day)[1] == pytest.approx(CEILING)
    wait_for(lambda: store.daily_spend(day) == (0.0, 0.0), 5, "the 0.3 s hold to expire")
    assert store.reserve_spend(day, CEILING, CEILING, "next", 60)
    # The dead process's late settle still books what it spent (it was billed), its hold long gone.
    assert store.settle_spend(day, "a-process-that-died", 0.002) == pytest.approx(0.002)
    assert store.daily_spend(day) == (pytest.approx(0.002), pytest.approx(CEILING))


def test_settling_below_the_worst_case_frees_the_difference(real_store_url):
    store = open_store(real_store_url)
    day = today()
    assert store.reserve_spend(day, 0.08, CEILING, "a", 60)
    assert not store.reserve_spend(day, 0.05, CEILING, "b", 60)
    assert store.settle_spend(day, "a", 0.03) == pytest.approx(0.03)
    assert store.daily_spend(day) == (pytest.approx(0.03), 0.0)
    assert store.reserve_spend(day, 0.05, CEILING, "b", 60)
    assert not store.reserve_spend(day, 0.03, CEILING, "c", 60)  # 0.03 spent + 0.05 held + 0.03 > 0.10
    store.settle_spend(day, "b", 0.0)  # not sent after all
    assert store.daily_spend(day) == (pytest.approx(0.03), 0.0)
    assert store.get_json(keys.DAILY_COST) == {"date": day, "usd": 0.03}  # what `status` and other tools read


def test_settle_is_once_per_hold_and_corrections_never_go_below_zero(real_store_url):
    store = open_store(real_store_url)
    day = today()
    assert store.reserve_spend(day, 0.05, CEILING, "a", 60)
    store.settle_spend(day, "a", 0.04)
    assert add_daily(store, -1.0) == 0.0  # an operator's correction: never below nothing
    assert add_daily(store, 0.25) == pytest.approx(0.25)  # a charge with no hold may pass the ceiling (anomalies)
    assert store.daily_spend(day) == (pytest.approx(0.25), 0.0)


def test_yesterdays_spend_does_not_count_today(real_store_url):
    store = open_store(real_store_url)
    store.put(keys.DAILY_COST, {"date": "2000-01-01", "usd": 99.0})
    assert store.daily_spend(today()) == (0.0, 0.0)
    assert store.reserve_spend(today(), CEILING, CEILING, "a", 60)
    store.settle_spend(today(), "a", 0.01)
    assert store.get_json(keys.DAILY_COST) == {"date": today(), "usd": 0.01}


def test_each_agent_has_its_own_spend_and_holds(real_store_url):
    a = open_store(real_store_url, prefix=unique_prefix())
    b = open_store(real_store_url, prefix=unique_prefix())
    assert a.reserve_spend(today(), CEILING, CEILING, "t", 60)
    assert b.reserve_spend(today(), CEILING, CEILING, "t", 60)  # the same token, another agent: its own
    a.settle_spend(today(), "t", 0.04)
    assert a.daily_spend(today()) == (pytest.approx(0.04), 0.0)
    assert b.daily_spend(today()) == (0.0, pytest.approx(CEILING))
    assert a.get_json(keys.DAILY_COST)["usd"] == 0.04 and b.get(keys.DAILY_COST) is None
    # The holds are the store's internals: never listed as a key.
    assert [k.name for k in b.list_all()] == []


def test_on_a_cluster_the_spend_and_its_holds_share_the_agents_slot(redis_cluster):
    import redis

    url, ports = redis_cluster
    name = unique_prefix()[:-1]
    store = open_store(url, prefix=name)
    assert store.reserve_spend(today(), 0.06, CEILING, "a", 60)
    assert not store.reserve_spend(today(), 0.06, CEILING, "b", 60)
    store.settle_spend(today(), "a", 0.05)
    assert store.daily_spend(today()) == (pytest.approx(0.05), 0.0)
    tag = "{" + name + "}:"
    client = redis.Redis(port=ports[0], decode_responses=True)
    try:
        assert {client.execute_command("CLUSTER", "KEYSLOT", tag + k)
                for k in (keys.DAILY_COST, "__holds__:" + keys.DAILY_COST, "soul")} == \
            {client.execute_command("CLUSTER", "KEYSLOT", tag + "soul")}
    finally:
        client.close()


def test_a_dry_runs_overlay_holds_against_the_real_store(tmp_path):
    """A dry run's overlay passes today's spend through: its real calls are real money."""
    from brainstem.store.overlay import OverlayStore
    from brainstem.store.sqlite.store import SQLiteStore

    base = SQLiteStore(tmp_path / "s.db")
    through = OverlayStore(base, passthrough={keys.DAILY_COST}.__contains__)
    assert through.reserve_spend(today(), 0.08, CEILING, "a", 60)
    assert not base.reserve_spend(today(), 0.08, CEILING, "b", 60)
    through.settle_spend(today(), "a", 0.01)
    assert base.daily_spend(today()) == (pytest.approx(0.01), 0.0)
    kept = OverlayStore(base)  # a recorded replay: nothing reaches the store
    assert kept.reserve_spend(today(), 0.09, CEILING, "c", 60)
    assert not kept.reserve_spend(today(), 0.01, CEILING, "d", 60)
    kept.settle_spend(today(), "c", 0.02)
    assert kept.daily_spend(today()) == (pytest.approx(0.03), 0.0)
    assert base.daily_spend(today()) == (pytest.approx(0.01), 0.0)
    base.close()


# --- the budget's side -----------------------------------------------------------------------------

def test_a_budget_refuses_a_hold_that_would_pass_todays_ceiling(sqlite_store):
    other = Budget(max_cost=1.0, max_steps=1, max_duration=60, daily=DailyLedger(sqlite_store, CEILING))
    mine = Budget(max_cost=1.0, max_steps=1, max_duration=60, daily=DailyLedger(sqlite_store, CEILING))
    theirs = other.reserve(0.07, ttl_s=60)
    assert mine.headroom() == (pytest.approx(0.03), "daily")
    with pytest.raises(BudgetExceeded) as exc:
        mine.reserve(0.05, ttl_s=60)
    assert exc.value.limit == "daily" and mine.held == 0.0
    other.settle(theirs, 0.02)
    other.settle(theirs, 0.02)  # once only
    assert other.spent == pytest.approx(0.02) and daily_spent(sqlite_store) == pytest.approx(0.02)
    hold = mine.reserve(0.05, ttl_s=60)
    assert mine.held == pytest.approx(0.05) and mine.headroom()[0] == pytest.approx(0.03)
    mine.release(hold)
    assert mine.held == 0.0 and daily_spent(sqlite_store) == pytest.approx(0.02)


def test_a_budget_holds_against_its_own_ceiling_too():
    b = Budget(max_cost=0.10, max_steps=1, max_duration=60, reserve_fraction=0.0)
    b.reserve(0.06, ttl_s=60)
    with pytest.raises(BudgetExceeded) as exc:
        b.reserve(0.06, ttl_s=60)
    assert exc.value.limit == "cost"
    b.reserve(0.04, ttl_s=0.05)  # a hold whose request never came back
    wait_for(lambda: b.held == pytest.approx(0.06), 5, "the 50 ms hold to expire")


# --- end to end: tool runs at once -----------------------------------------------------------------------

ASK = '''
def execute(args, ctx):
    try:
        r = ctx.fetch(args["url"], method="POST", json=args["body"], timeout=30,
                      headers={"Authorization": "Bearer " + ctx.secrets["OPENROUTER_API_KEY"]})
    except Exception as e:
        return {"error": str(e)}
    return {"status": r["status"]}
'''


@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_tool_runs_at_once_book_at_most_the_daily_ceiling(real_store_url, llm):
    """Three ``brainstem tool run`` of one agent, each read today's spend as $0 when it started: before
    holds, each spent the whole ceiling. Each request's worst case (~$0.0495: 9,900 tokens of haiku) is
    held before it goes, so two fit under $0.10 and the third is refused, whenever it asks."""
    import os
    import subprocess
    import sys

    from brainstem.state.seed import seed
    from tests.wake_helpers import wake_env

    store = open_store(real_store_url)
    seed(store)
    store.put(keys.tool_code("ask"), ASK)
    store.put(keys.tool_meta("ask"), '{"secrets": ["OPENROUTER_API_KEY"], "timeout_ms": 60000}')
    # Every token allowed is spent, reported without usage.cost, slowly: the three are in flight together.
    llm.responder = lambda req: {"content": "w", "delay": 3.0,
                                 "usage": {"prompt_tokens": 10, "completion_tokens": req["max_tokens"]}}
    env = wake_env(real_store_url, llm, BRAINSTEM_TOOL_SECRETS="OPENROUTER_API_KEY",
                   BRAINSTEM_FETCH_ALLOW="127.0.0.1", BRAINSTEM_MAX_DAILY_COST=CEILING)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))} | env
    body = {"model": "haiku", "messages": [{"role": "user", "content": "write"}], "max_tokens": 9900}
    args = json.dumps({"url": llm.base_url + "/chat/completions", "body": body})
    # Processes: three runs at once, each with its own view of today's spend.
    procs = [subprocess.Popen([sys.executable, "-m", "brainstem", "tool", "run", "ask", "-v", "--input", args],
                              env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [json.loads(out) for out, _ in outs]
    assert sorted(r.get("status", 0) for r in results) == [0, 200, 200], results
    (refused,) = [r["error"] for r in results if "error" in r]
    assert "today's ceiling" in refused
    assert any("budget_exceeded" in err and "limit=daily" in err for _, err in outs)
    assert len(llm.requests) == 2
    billed = sum((10 * 1.0 + req["max_tokens"] * 5.0) / 1e6 for req in llm.requests)
    assert daily_spent(store) == pytest.approx(billed, abs=1e-9)
    assert daily_spent(store) <= CEILING
    assert store.daily_spend(today())[1] == 0.0  # every hold settled
    store.close()


# --- today's spend: one atomic store operation -------------------------------------------------

def test_concurrent_spenders_lose_no_update(real_store_url):
    """Two spenders at once (a live session and a dry run, say), each with its own connection."""
    stores = [open_store(real_store_url) for _ in range(3)]
    per_thread, amount = 60, 0.001

    def spend(store):
        for _ in range(per_thread):
            add_daily(store, amount)

    threads = [threading.Thread(target=spend, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert daily_spent(stores[0]) == pytest.approx(len(stores) * per_thread * amount)
    assert stores[0].lease_owner(keys.DAILY_COST) is None  # every holder let go


def test_a_dead_spenders_lease_does_not_stop_spend_being_counted(real_store_url):
    """Today's spend is one atomic store operation, not a read-modify-write under a lock: a lock left
    under its name (by an older version that died holding it) neither delays nor loses a spend."""
    import time

    store = open_store(real_store_url)
    assert store.acquire_lease(keys.DAILY_COST, "a-dead-process", 60_000)
    t0 = time.monotonic()
    assert add_daily(store, 0.5) == pytest.approx(0.5)
    assert time.monotonic() - t0 < 1.0
    assert daily_spent(store) == pytest.approx(0.5)


@pytest.mark.parametrize("usd, least, text", [(0.0144, 4, "$0.0144"), (0.000001, 4, "$0.000001"),
                                              (0.006 - 0.0057 - 0.00006, 4, "$0.00024"), (2.5, 2, "$2.50"),
                                              (0.004, 2, "$0.004"), (1234.5, 2, "$1,234.50"), (0.0, 4, "$0.0000"),
                                              (1 / 3, 4, "$0.333333")])
def test_an_amount_is_never_rounded_into_another_number(usd, least, text):
    assert dollars(usd, least) == text
