"""Bookkeeping shared by sessions and what runs beside them (dry runs, live replays, tool runs):
today's spend never loses an update, and karma with no history entry is bounded like the rest."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from brainstem.core import keys
from brainstem.core.clock import now_utc
from brainstem.state import history as session_history
from brainstem.state.budget import add_daily, daily_spent
from brainstem.store import open_store


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


def test_unlisted_karma_is_dropped_past_retention_and_past_the_cap(real_store_url, monkeypatch):
    store = open_store(real_store_url)
    now = now_utc()
    for i in range(3):
        store.append(keys.karma(f"dry-{i}"), "{}")
    session_history.note_unlisted(store, "dry-0", 30, now=now - timedelta(days=40))
    session_history.note_unlisted(store, "dry-1", 30, now=now - timedelta(days=1))
    session_history.note_unlisted(store, "dry-2", 30, now=now)
    assert [k["id"] for k in store.get_json(keys.UNLISTED_KARMA)] == ["dry-1", "dry-2"]
    assert store.log_length(keys.karma("dry-0")) == 0 and store.log_length(keys.karma("dry-1")) == 1
    monkeypatch.setattr(session_history, "UNLISTED_MAX", 2)
    store.append(keys.karma("dry-3"), "{}")
    session_history.note_unlisted(store, "dry-3", 30, now=now)
    assert [k["id"] for k in store.get_json(keys.UNLISTED_KARMA)] == ["dry-2", "dry-3"]
    assert store.log_length(keys.karma("dry-1")) == 0 and store.log_length(keys.karma("dry-3")) == 1
