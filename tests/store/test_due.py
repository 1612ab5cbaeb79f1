"""The due index (:mod:`brainstem.store.due`): each write of a schedule sets its entry, an agent's entries are
its own, and only the operator's view reads the index across agents. On a real Redis, fakeredis and SQLite."""

from __future__ import annotations

import time

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.errors import ForeignAgentKey
from brainstem.store.due import LOOK, due_of
from brainstem.store.fenced import FencedStore
from brainstem.store.overlay import OverlayStore

LATER = "2031-01-01T00:00:00Z"
LATER_TS = 1924992000.0


def view(store, name: str):
    """Another view of ``store``'s backend: agent ``name`` ('' the operator's, the default agent's)."""
    cls = type(store)
    if hasattr(store, "_r"):
        return cls("redis://fake/0" if "fake" in store.display_url else store._url, prefix=name, client=store._r)
    return cls(store.path, prefix=name)


def schedule(**fields) -> dict:
    return {"tool": "noop", "every": "1h", "next_run": LATER, "created_by": "operator", **fields}


def test_a_schedule_written_sets_its_entry_and_a_delete_removes_it(store):
    store.put(keys.schedule("a"), schedule())
    assert store.due_at(keys.schedule("a")) == LATER_TS
    assert store.due_at(LOOK) is not None  # never looked at: its next look is a full one, due at once
    store.put(keys.schedule("a"), schedule(enabled=False))
    assert store.due_at(keys.schedule("a")) is None
    store.put(keys.schedule("a"), schedule(next_run="2030-01-01T00:00:00Z"))
    assert (keys.schedule("a"), 1893456000.0) in store.due_keys(until=LATER_TS)
    store.delete(keys.schedule("a"))
    assert store.due_at(keys.schedule("a")) is None and [k for k, _ in store.due_keys()] == [LOOK]
    store.put("notes", "x")  # not a schedule: no entry
    assert store.due_at("notes") is None


def test_entries_are_sorted_and_limited(store):
    for i, t in enumerate((300.0, 100.0, 200.0)):
        store.set_due(f"schedule:s{i}", t)
    assert store.due_keys(until=250.0) == [("schedule:s1", 100.0), ("schedule:s2", 200.0)]
    assert store.due_keys(limit=1) == [("schedule:s1", 100.0)] and store.due_first() == ("schedule:s1", 100.0)
    store.set_due("schedule:s1", None)
    assert store.due_first() == ("schedule:s2", 200.0)


def test_the_index_across_agents_holds_each_agents_earliest_entry(store):
    operator, alice, bob = view(store, ""), view(store, "alice:"), view(store, "bob:")
    alice.set_due("schedule:x", 50.0)
    alice.set_due("schedule:y", 10.0)
    bob.set_due("schedule:z", 30.0)
    assert [a for a in operator.due_agents(40.0) if a[0] in ("alice", "bob")] == [("alice", 10.0), ("bob", 30.0)]
    alice.set_due("schedule:y", None)
    assert ("alice", 50.0) in operator.due_agents(60.0) and ("alice", 50.0) not in operator.due_agents(40.0)
    bob.set_due("schedule:z", None)
    assert all(a[0] != "bob" for a in operator.due_agents(float("inf")))


def test_an_agents_entries_are_its_own(store):
    operator, alice, bob = view(store, ""), view(store, "alice:"), view(store, "bob:")
    alice.set_due("schedule:x", 5.0)
    assert bob.due_at("schedule:x") is None and bob.due_keys() == []  # bob's index is bob's
    assert operator.due_at("alice:schedule:x") is None  # the operator's view does not reach alice's keys
    with pytest.raises(ForeignAgentKey):
        operator.set_due("alice:schedule:x", 1.0)
    with pytest.raises(ForeignAgentKey):
        alice.set_due("__due__", 1.0)  # the internals
    with pytest.raises(ForeignAgentKey):
        alice.due_agents(10.0)  # the index across agents is the operator's
    assert alice.due_keys() == [("schedule:x", 5.0)]


def test_an_agent_with_only_index_entries_can_be_unregistered(store):
    operator, carol = view(store, ""), view(store, "carol:")
    carol.set_due("schedule:x", 5.0)
    assert operator.unregister_agent("carol") == 0  # a hint is not something the agent holds
    assert all(a[0] != "carol" for a in operator.due_agents(float("inf")))


def test_a_fenced_write_sets_the_entry_and_a_dry_runs_stays_in_the_overlay(store):
    assert store.acquire_lease("wake", "me", 60_000)
    FencedStore(store, "wake", "me").put(keys.schedule("f"), schedule())
    assert store.due_at(keys.schedule("f")) == LATER_TS
    overlay = OverlayStore(store)
    overlay.put(keys.schedule("f"), schedule(enabled=False))
    assert overlay.due_at(keys.schedule("f")) is None and store.due_at(keys.schedule("f")) == LATER_TS


@pytest.mark.parametrize(("text", "expected"), [
    (None, None),
    ("not json", 1000.0),  # the runner reports it
    ('{"next_run": "2031-01-01T00:00:00Z"}', LATER_TS),
    ('{"next_run": "2031-01-01T00:00:00Z", "enabled": false}', None),
    ('{"tool": "x"}', 1000.0),  # no next_run yet: the runner fills it in
    ('{"next_run": "2031-01-01T00:00:00Z", "last_run": "2030-01-01T00:00:00Z"}', 1000.0),  # a run under way
])
def test_due_of(text, expected):
    assert due_of(text, 1000.0) == expected


def test_now_is_the_runtimes_clock():
    from brainstem.store import due

    assert abs(due.now() - now_utc().timestamp()) < 5 and iso(now_utc())


def test_an_agent_whose_acl_user_reaches_only_its_own_keys_keeps_its_own_index(redis_url):
    import uuid

    import redis

    from brainstem.store.redis.store import RedisStore

    name = f"acl{uuid.uuid4().hex[:6]}"
    admin = redis.Redis.from_url(redis_url)
    admin.sadd("__agents__", name)
    admin.execute_command("ACL", "SETUSER", name, "on", f">{name}pw", "resetkeys", f"~{name}:*", "%R~__agents__",
                          "+@all")
    try:
        host = redis_url.split("//", 1)[1]
        own = RedisStore(f"redis://{name}:{name}pw@{host}", prefix=f"{name}:")
        assert own.acquire_lease(keys.WAKE_LEASE, "me", 5_000)  # its session: the wake index, its own part only
        assert own.due_at(keys.WAKE_LEASE, "wake") == pytest.approx(time.time() + 5, abs=2)
        own.put(keys.schedule("x"), schedule())
        assert own.due_at(keys.schedule("x")) == LATER_TS and own.due_first() is not None
        own.close()
    finally:
        admin.execute_command("ACL", "DELUSER", name)
        for k in admin.scan_iter(match=f"{name}:*"):
            admin.delete(k)
        admin.srem("__agents__", name)
        admin.close()


# --- the wake index: urgent messages and wake leases, for the daemon's watch -----------------------------

def test_an_urgent_message_and_the_wake_lease_set_their_wake_entries(store):
    from brainstem.state import inbox
    from brainstem.store.due import LEASE, URGENT, WAKES

    inbox.post(store, "no hurry")
    assert store.due_at(URGENT, WAKES) is None  # a plain message waits for the agent's own tick
    inbox.post(store, "now", urgent=True)
    assert store.due_at(URGENT, WAKES) == pytest.approx(time.time(), abs=5)
    assert store.acquire_lease(keys.WAKE_LEASE, "me", 5_000)
    assert store.due_at(LEASE, WAKES) == pytest.approx(time.time() + 5, abs=2)  # when it would run out
    assert store.renew_lease(keys.WAKE_LEASE, "me", 60_000)
    assert store.due_at(LEASE, WAKES) == pytest.approx(time.time() + 60, abs=2)
    assert not store.renew_lease(keys.WAKE_LEASE, "not me", 600_000)  # refused: the entry stays
    assert store.due_at(LEASE, WAKES) == pytest.approx(time.time() + 60, abs=2)
    assert store.acquire_lease("schedule_claim:x", "me", 5_000)
    assert [k for k, _ in store.due_keys(index=WAKES)] == [URGENT, LEASE]  # no other lease has an entry
    assert store.due_first() is None  # the schedules' index knows nothing of them
    store.delete(keys.INBOX_URGENT)
    assert store.due_at(URGENT, WAKES) is None


def test_the_wake_index_is_confined_as_the_schedules_is(store):
    import uuid

    from brainstem.store.due import URGENT, WAKES

    a, b, c = (f"{n}{uuid.uuid4().hex[:6]}" for n in ("alice", "bob", "carol"))  # the Redis server is shared
    operator, alice, bob, carol = view(store, ""), view(store, a + ":"), view(store, b + ":"), view(store, c + ":")
    alice.set_due(URGENT, 5.0, WAKES)
    assert (a, 5.0) in operator.due_agents(10.0, WAKES)
    assert all(x[0] != a for x in operator.due_agents(10.0))  # each index is its own
    assert bob.due_keys(index=WAKES) == [] and operator.due_at(f"{a}:{URGENT}", WAKES) is None
    with pytest.raises(ForeignAgentKey):
        alice.due_agents(10.0, WAKES)
    with pytest.raises(ForeignAgentKey):
        operator.set_due(f"{a}:{URGENT}", 1.0, WAKES)
    with pytest.raises(ValueError, match="no due index"):
        alice.set_due(URGENT, 1.0, "elsewhere")
    carol.set_due(URGENT, 5.0, WAKES)
    assert operator.unregister_agent(c) == 0  # a hint is not something the agent holds
    assert all(x[0] != c for x in operator.due_agents(float("inf"), WAKES))
    alice.set_due(URGENT, None, WAKES)
    assert all(x[0] != a for x in operator.due_agents(float("inf"), WAKES))
