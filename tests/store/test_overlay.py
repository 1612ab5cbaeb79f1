"""The throwaway overlay replay and dry run write to: reads fall through, writes never reach the store."""

from __future__ import annotations

import pytest

from brainstem.core import keys
from brainstem.core.errors import ForeignAgentKey, LeaseLost
from brainstem.store import open_store
from brainstem.store.fenced import FencedStore
from brainstem.store.overlay import OverlayStore


@pytest.fixture
def base(real_store_url):
    store = open_store(real_store_url)
    store.put("a", "base-a")
    store.put("b", {"n": 1})
    store.append("karma:s1", "e1")
    store.append("karma:s1", "e2")
    yield store
    store.close()


def test_reads_fall_through_and_writes_stay_in_the_overlay(base):
    ov = OverlayStore(base)
    assert ov.get("a") == "base-a" and ov.get("b", "json") == {"n": 1}
    ov.put("a", "new-a")
    ov.put("c", "only-here")
    assert ov.delete("b") is True
    assert ov.get("a") == "new-a" and ov.get("c") == "only-here" and ov.get("b") is None
    assert base.get("a") == "base-a" and base.get("c") is None and base.get("b") == '{"n":1}'
    names = [k.name for k in ov.list_all()]
    assert "c" in names and "b" not in names and "a" in names
    assert ov.written == [("put", "a"), ("put", "c"), ("delete", "b")]
    assert ov.incr("counter") == 1 and base.get("counter") is None


def test_logs_are_copied_on_write_and_a_fresh_log_starts_empty(base):
    ov = OverlayStore(base)
    assert ov.read_log("karma:s1") == ["e1", "e2"]
    ov.append("karma:s1", "e3")
    assert ov.read_log("karma:s1") == ["e1", "e2", "e3"] and ov.read_log("karma:s1", -1) == ["e3"]
    assert base.read_log("karma:s1") == ["e1", "e2"]
    ov.fresh_log("karma:s1")
    assert ov.read_log("karma:s1") == [] and ov.log_length("karma:s1") == 0
    ov.append("karma:s1", "x")
    ov.trim_log("karma:s1", 0)
    assert ov.read_log("karma:s1") == [] and base.log_length("karma:s1") == 2
    assert ov.delete_log("karma:s1") is False and base.log_length("karma:s1") == 2


def test_passthrough_keys_reach_the_store(base):
    ov = OverlayStore(base, passthrough={"karma:dry-1", "stats:daily_cost"}.__contains__)
    ov.append("karma:dry-1", "kept")
    ov.put("stats:daily_cost", "1")
    ov.put("wake_config", "thrown away")
    assert base.read_log("karma:dry-1") == ["kept"] and base.get("stats:daily_cost") == "1"
    assert base.get("wake_config") is None


def test_over_a_fenced_view_only_the_passthrough_writes_are_fenced(base):
    """An overlay over a session's fenced view: what it keeps needs no lease, and what reaches the store
    goes through the view's fence."""
    session = FencedStore(base, keys.WAKE_LEASE, "host:1:me")
    ov = OverlayStore(session, passthrough={"karma:dry-1"}.__contains__)
    assert base.acquire_lease(keys.WAKE_LEASE, "host:1:me", 30_000)
    ov.append("karma:dry-1", "kept")
    assert base.release_lease(keys.WAKE_LEASE, "host:1:me") and base.acquire_lease(keys.WAKE_LEASE, "other", 30_000)
    with pytest.raises(LeaseLost):
        ov.append("karma:dry-1", "refused")
    ov.put("wake_config", "kept here")
    assert ov.get("wake_config") == "kept here" and ov.get("a") == "base-a"
    assert base.read_log("karma:dry-1") == ["kept"] and base.get("wake_config") is None


def test_leases_are_held_in_the_overlay_only(base):
    ov = OverlayStore(base)
    assert ov.acquire_lease("wake", "me", 1000) and not ov.acquire_lease("wake", "other", 1000)
    assert base.lease_owner("wake") is None
    assert ov.release_lease("wake", "me") and ov.lease_owner("wake") is None


def test_the_overlay_is_confined_as_its_store(tmp_path):
    """Over the default agent's view, another agent's keys are absent and unwritable through the overlay."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    other = open_store(url, prefix="other")
    other.put("notes:x", "theirs")
    default = open_store(url, prefix="")
    ov = OverlayStore(default)
    assert ov.get("other:notes:x") is None
    with pytest.raises(ForeignAgentKey):
        ov.put("other:notes:x", "mine now")
    assert other.get("notes:x") == "theirs"
