"""The fenced view: a session's writes go through only while its wake lease is still its own.

On real stores (SQLite on disk, a real redis-server): every kind of write a session makes is refused once
the lease is another's or gone, the same write through the plain store goes through, reads see the store,
and a call answered after the lease was lost is still booked and recorded.
"""

from __future__ import annotations

import json
import time

import pytest

from brainstem.core import events, keys
from brainstem.core.errors import ForeignAgentKey, LeaseLost
from brainstem.store import karma
from brainstem.store.fenced import FencedStore
from tests.helpers import wait_for

OWNER, OTHER = "host-a:1:aaaa", "host-b:2:bbbb"


# --- fencing in the store's write path ---------------------------------------------

# Every kind of write a session makes: the schedule, the breadcrumb, history, karma, memory, a tool's data,
# a counter, trimming and deleting logs, and new spend.
def _every_write(view):
    return (lambda: view.put(keys.WAKE_CONFIG, {"by": "a again"}),
            lambda: view.put(keys.SESSION_LAST_COMPLETED, "1-a"),
            lambda: view.delete(keys.SESSION_CURRENT),
            lambda: view.append(keys.SESSION_HISTORY, json.dumps({"id": "1-a", "again": True})),
            lambda: view.append(keys.karma("1-a"), json.dumps({"event": "llm_call"})),
            lambda: view.put(keys.LAST_REFLECT, {"summary": "stale"}),
            lambda: view.put("tooldata:t:x", "1"), lambda: view.put("notes", "still mine"),
            lambda: view.incr(keys.SESSION_COUNTER), lambda: view.trim_log(keys.SESSION_HISTORY, 0),
            lambda: view.delete_log(keys.SESSION_HISTORY),
            lambda: view.reserve_spend("2026-01-01", 0.01, 5.0, "t1", 60))


def _everything(view):
    return {k.name: view.get(k.name) if not k.is_log else view.read_log(k.name) for k in view.list_all("")}


def test_every_write_is_made_only_while_the_lease_is_the_writers(st):
    session = FencedStore(st, keys.WAKE_LEASE, OWNER)
    with pytest.raises(LeaseLost, match="wake_config"):  # no lock at all
        session.put(keys.WAKE_CONFIG, {"next_wake_after": "x"})
    assert st.get(keys.WAKE_CONFIG) is None

    assert st.acquire_lease(keys.WAKE_LEASE, OWNER, 30_000)
    session.put(keys.WAKE_CONFIG, {"by": "a"})
    session.put(keys.SESSION_CURRENT, {"id": "1-a"})
    session.append(keys.SESSION_HISTORY, json.dumps({"id": "1-a"}))
    assert session.delete(keys.SESSION_CURRENT)

    # Another wake takes the lease over: every fenced write is refused, and nothing is changed.
    assert st.release_lease(keys.WAKE_LEASE, OWNER) and st.acquire_lease(keys.WAKE_LEASE, OTHER, 30_000)
    st.put(keys.SESSION_CURRENT, {"id": "2-b"})  # the new holder's breadcrumb (written unfenced here)
    before = _everything(st)
    for write in _every_write(session):
        with pytest.raises(LeaseLost):
            write()
    assert _everything(st) == before
    assert st.daily_spend("2026-01-01") == (0.0, 0.0)
    # The one write a session without its lease makes: through the plain store under its view, by name.
    session.unfenced.append(keys.karma("1-a"), json.dumps({"event": "lease_lost"}))
    assert st.read_log(keys.karma("1-a")) == [json.dumps({"event": "lease_lost"})]
    session.append(keys.WAKE_LOG, json.dumps({"fire": "lease_lost"}))  # the daemon's own log is not the session's
    # A write through the plain store (the operator's) is not fenced.
    st.put(keys.WAKE_CONFIG, {"by": "operator"})
    assert st.get(keys.WAKE_CONFIG, "json") == {"by": "operator"}


def test_a_write_the_fenced_view_refuses_goes_through_the_plain_store(st):
    """The fence is the view's, not the store's: with the lease gone, each write through the session's view
    is refused while the same write through the plain store is made."""
    session = FencedStore(st, keys.WAKE_LEASE, OWNER)
    assert st.acquire_lease(keys.WAKE_LEASE, OTHER, 30_000)
    st.put(keys.SESSION_CURRENT, {"id": "2-b"})
    st.append(keys.SESSION_HISTORY, json.dumps({"id": "2-b"}))
    for fenced, plain in zip(_every_write(session), _every_write(st), strict=True):
        before = _everything(st)
        with pytest.raises(LeaseLost):
            fenced()
        assert _everything(st) == before
        plain()
    assert st.get(keys.WAKE_CONFIG, "json") == {"by": "a again"} and st.get("notes") == "still mine"
    assert st.get(keys.SESSION_COUNTER, "json") == 1 and st.log_length(keys.SESSION_HISTORY) == 0
    assert st.daily_spend("2026-01-01") == (0.0, 0.01)


def test_reads_through_the_fenced_view_see_the_store(st):
    """Reads pass through the view as they are, held lease or not, and confined as the store is."""
    session = FencedStore(st, keys.WAKE_LEASE, OWNER)
    st.put("notes", "mine", metadata={"v": 1})
    st.append(keys.karma("1-a"), json.dumps({"event": "session_start"}))
    st.settle_spend("2026-01-01", None, 0.5)
    for holder in (None, OTHER):  # no lease held, then another wake's
        if holder is not None:
            assert st.acquire_lease(keys.WAKE_LEASE, holder, 30_000)
        assert session.get("notes") == st.get("notes") == "mine"
        assert session.get_with_metadata("notes") == st.get_with_metadata("notes") == ("mine", {"v": 1})
        assert session.get(keys.SOUL) == st.get(keys.SOUL) and session.get(keys.SOUL)
        assert _everything(session) == _everything(st)
        assert [k.name for k in session.list("karma:").keys] == [k.name for k in st.list("karma:").keys]
        assert session.read_log(keys.karma("1-a"), -1) == st.read_log(keys.karma("1-a"), -1)
        assert session.log_length(keys.karma("1-a")) == st.log_length(keys.karma("1-a")) == 1
        assert session.daily_spend("2026-01-01") == st.daily_spend("2026-01-01") == (0.5, 0.0)
        assert session.lease_owner(keys.WAKE_LEASE) == st.lease_owner(keys.WAKE_LEASE)
        assert session.usage()["keys"] == st.usage()["keys"]
    assert session.display_url == st.display_url and session.agent == st.agent
    # Confined as the store is: the store's internals are neither readable nor writable through the view.
    assert session.get("__agents__") is None
    with pytest.raises(ForeignAgentKey):
        session.put("__meta__:notes", "x")


def test_an_expired_lease_fences_too(st):
    session = FencedStore(st, keys.WAKE_LEASE, OWNER)
    assert st.acquire_lease(keys.WAKE_LEASE, OWNER, 150)
    session.put(keys.WAKE_CONFIG, {"n": 1})
    wait_for(lambda: st.lease_owner(keys.WAKE_LEASE) is None, 5, "the 150 ms lease to run out")
    with pytest.raises(LeaseLost):
        session.put(keys.WAKE_CONFIG, {"n": 2})
    assert st.get(keys.WAKE_CONFIG, "json") == {"n": 1}


def test_a_call_answered_after_the_lease_is_lost_is_booked_and_recorded_as_spend_settled(st, llm):
    """Another wake takes the agent over while a call is on the wire. What it cost goes into today's spend
    (it was billed) and, its llm_call refused with the lease, into a spend_settled entry of the session's
    own karma: no money spent without an entry that says so."""
    from brainstem.llm.chokepoint import LLM
    from brainstem.llm.providers import OpenRouterProvider
    from brainstem.state.budget import Budget, DailyLedger, daily_spent
    from brainstem.state.config import shipped_models

    session = FencedStore(st, keys.WAKE_LEASE, OWNER)
    assert st.acquire_lease(keys.WAKE_LEASE, OWNER, 30_000)

    def taken_over(req):
        assert st.release_lease(keys.WAKE_LEASE, OWNER) and st.acquire_lease(keys.WAKE_LEASE, OTHER, 30_000)
        return {"content": "done", "cost": 0.0021}

    llm.responder = taken_over
    recorder = karma.Karma(session, "1-a")
    budget = Budget(max_cost=1.0, max_steps=5, max_duration=60, daily=DailyLedger(session, 5.0))
    chokepoint = LLM(models=shipped_models(), budget=budget, record=recorder.record, soul="soul",
                     providers=[OpenRouterProvider(llm.base_url, "sk-test", max_attempts=1)])
    with pytest.raises(LeaseLost):
        chokepoint.call(purpose="think", model="haiku", prompt="hello", max_tokens=100)
    (settled,) = karma.read(st, "1-a")
    assert settled["event"] == events.SPEND_SETTLED and "lease was lost" in settled["reason"]
    assert settled["cost"] == 0.0021 and settled["model"] == "anthropic/claude-haiku-4.5"
    assert settled["purpose"] == "think" and settled["tier"] == "hardcoded"
    assert daily_spent(st) == pytest.approx(0.0021) and st.daily_spend(time.strftime("%Y-%m-%d", time.gmtime()))[1] == 0
    assert budget.spent == pytest.approx(0.0021)
