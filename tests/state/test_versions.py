"""Unit tests of brainstem/state/versions.py on the three stores (real Redis, fakeredis, SQLite).

Versions of self-modified keys (``history:{key}``), rollback and diff, and
auto-restore after a failing streak.
"""

from __future__ import annotations

import pytest

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.state.versions import (
    MAX_VERSIONS,
    WATCHED,
    auto_restore,
    diff,
    failing_streak,
    find,
    history_key,
    record_write,
    restore_last_clean,
    rollback,
    save_clean_snapshot,
    snapshot,
    versions,
)

K = keys.PROMPT_ORIENT


def write(store, key, value, source="agent", session_id=None):
    """What the guarded view and `kv put` do: record, then write."""
    old = store.get(key)
    n = record_write(store, key, old, value, source=source, session_id=session_id)
    if value is None:
        store.delete(key)
    else:
        store.put(key, value)
    return n


# --- record_write ---------------------------------------------------------------------------

def test_first_write_records_the_existing_value_as_version_one(store):
    store.put(K, "SEED PROMPT")
    assert write(store, K, "AGENT PROMPT", session_id="3-abc") == 2
    vs = versions(store, K)
    assert [v["version"] for v in vs] == [1, 2]
    assert vs[0] == {"version": 1, "value": "SEED PROMPT", "at": None, "session_id": None, "source": "initial"}
    assert vs[1]["value"] == "AGENT PROMPT" and vs[1]["source"] == "agent" and vs[1]["session_id"] == "3-abc"
    assert vs[1]["at"].endswith("Z")
    assert store.get_json(history_key(K)) == vs


def test_first_write_of_a_new_key_is_version_one(store):
    assert write(store, keys.WISDOM, "be brief", source="operator") == 1
    vs = versions(store, keys.WISDOM)
    assert len(vs) == 1 and vs[0]["value"] == "be brief" and vs[0]["source"] == "operator"


def test_unprivileged_keys_are_not_versioned(store):
    assert record_write(store, "notes:x", None, "v", source="agent") is None
    assert record_write(store, keys.LAST_REFLECT, "{}", "{}", source="agent") is None
    assert store.get(history_key("notes:x")) is None
    assert versions(store, "notes:x") == []


def test_same_value_twice_is_one_version(store):
    store.put(K, "A")
    assert write(store, K, "B") == 2
    assert write(store, K, "B") == 2
    assert [v["value"] for v in versions(store, K)] == ["A", "B"]
    assert write(store, K, "C") == 3


def test_cap_keeps_numbering_monotonic(store):
    store.put(K, "v0")
    numbers = [write(store, K, f"v{i}") for i in range(1, MAX_VERSIONS + 6)]
    assert numbers == list(range(2, MAX_VERSIONS + 7))
    vs = versions(store, K)
    assert len(vs) == MAX_VERSIONS
    assert [v["version"] for v in vs] == list(range(7, MAX_VERSIONS + 7))
    assert vs[-1]["value"] == store.get(K) == f"v{MAX_VERSIONS + 5}"
    # after dropping the oldest, the next number still grows (never reuses a dropped one)
    assert write(store, K, "again") == MAX_VERSIONS + 7
    assert len(versions(store, K)) == MAX_VERSIONS
    # a rollback into the capped window works, and numbering keeps growing
    oldest = versions(store, K)[0]
    assert oldest["version"] == 8 and oldest["value"] == "v7"
    with pytest.raises(BrainstemError, match="no version 7"):
        rollback(store, K, 7)  # dropped by the cap
    out = rollback(store, K, 8)
    assert out == {"key": K, "restored_version": 8, "new_version": MAX_VERSIONS + 8}
    assert store.get(K) == "v7"


def test_a_delete_is_a_version_with_no_value(store):
    store.put(keys.WISDOM, "old wisdom")
    assert write(store, keys.WISDOM, None) == 2
    assert versions(store, keys.WISDOM)[-1]["value"] is None


# --- rollback, find, diff -------------------------------------------------------------------

def test_rollback_default_restores_the_previous_version(store):
    store.put(K, "A")
    write(store, K, "B", session_id="1-x")
    out = rollback(store, K)
    assert out == {"key": K, "restored_version": 1, "new_version": 3}
    assert store.get(K) == "A"
    last = versions(store, K)[-1]
    assert last["value"] == "A" and last["source"] == "operator:rollback"
    # the rollback itself can be undone
    rollback(store, K)
    assert store.get(K) == "B"
    assert [v["value"] for v in versions(store, K)] == ["A", "B", "A", "B"]


def test_rollback_to_a_version(store):
    store.put(K, "A")
    for v in ("B", "C", "D"):
        write(store, K, v)
    out = rollback(store, K, 2, source="runtime:test", session_id="9-z")
    assert out["restored_version"] == 2 and out["new_version"] == 5
    assert store.get(K) == "B"
    assert versions(store, K)[-1]["source"] == "runtime:test" and versions(store, K)[-1]["session_id"] == "9-z"


def test_rollback_to_a_deleted_version_deletes_the_key(store):
    write(store, keys.WISDOM, "first")
    write(store, keys.WISDOM, None)
    write(store, keys.WISDOM, "third")
    rollback(store, keys.WISDOM, 2)
    assert store.get(keys.WISDOM) is None


def test_rollback_errors(store):
    with pytest.raises(BrainstemError, match="no versions recorded"):
        rollback(store, K)
    write(store, K, "only")
    with pytest.raises(BrainstemError, match="only one version"):
        rollback(store, K)
    write(store, K, "second")
    with pytest.raises(BrainstemError, match=r"no version 7 \(kept: 1, 2\)"):
        rollback(store, K, 7)
    assert store.get(K) == "second"
    assert find(store, K, 1)[0]["value"] == "only"


def test_diff_shows_the_change_since_a_version(store):
    store.put(K, "line one\nline two\n")
    write(store, K, "line one\nline 2\nline three")
    text = diff(store, K)
    lines = text.splitlines()
    assert lines[0] == f"--- {K} (version 1)" and lines[1] == f"+++ {K} (current)"
    assert "-line two" in lines and "+line 2" in lines and "+line three" in lines
    assert " line one" in lines
    write(store, K, "something else")
    assert "-line one" in diff(store, K, 1).splitlines() and "+something else" in diff(store, K, 1).splitlines()
    assert diff(store, K, 3) == ""  # version 3 is the current value


# --- failing streaks and auto-restore ------------------------------------------------------------

def test_failing_streak():
    h = [{"id": "1", "outcome": "no_plan"}, {"id": "2", "outcome": "clean"}, {"id": "3", "outcome": "crashed"},
         "junk", {"id": "4", "outcome": "no_plan"}, {"id": "5", "outcome": "error"}]
    assert failing_streak(h) == ["3", "4", "5"]
    assert failing_streak(h + [{"id": "6", "outcome": "clean"}]) == []
    assert failing_streak(h + [{"id": "6", "outcome": "budget_exhausted"}]) == []
    assert failing_streak([]) == []
    assert failing_streak([{"id": "1", "outcome": "error"}]) == ["1"]


def _history(store, outcomes: list[str]):
    store.put(keys.SESSION_HISTORY, [{"id": f"{i + 1}-s", "outcome": o} for i, o in enumerate(outcomes)])


def _clean_snapshot(store, **overrides):
    snap = snapshot(store)
    snap.update(overrides)
    save_clean_snapshot(store, snap, "1-s")
    return snap


def test_auto_restore_after_three_failures_once_per_streak(store):
    store.put(K, "GOOD")
    store.put(keys.CONFIG_DEFAULTS, '{"wake": {"sleep_seconds": 600}}')
    _clean_snapshot(store)
    write(store, K, "BROKEN")
    _history(store, ["clean", "no_plan", "crashed"])
    assert auto_restore(store, "4-s") is None  # two failures: not yet
    assert store.get(K) == "BROKEN"
    _history(store, ["clean", "no_plan", "crashed", "error"])
    out = auto_restore(store, "5-s")
    assert out == {"failed_sessions": ["2-s", "3-s", "4-s"], "restored": [K]}
    assert store.get(K) == "GOOD"
    assert store.get(keys.CONFIG_DEFAULTS) == '{"wake": {"sleep_seconds": 600}}'
    last = versions(store, K)[-1]
    assert last["value"] == "GOOD" and last["source"] == "runtime:auto_restore" and last["session_id"] == "5-s"
    assert store.get_json(keys.AUTO_RESTORE_MARK)["streak_start"] == "2-s"
    # the same streak goes on failing: no second restore, even if the key was broken again
    write(store, K, "BROKEN AGAIN")
    _history(store, ["clean", "no_plan", "crashed", "error", "no_plan"])
    assert auto_restore(store, "6-s") is None
    assert store.get(K) == "BROKEN AGAIN"
    # a new streak (after a clean session) restores again
    _history(store, ["clean", "no_plan", "crashed", "error", "no_plan", "clean", "error", "error", "error"])
    out = auto_restore(store, "10-s")
    assert out == {"failed_sessions": ["7-s", "8-s", "9-s"], "restored": [K]}
    assert store.get(K) == "GOOD"


def test_auto_restore_without_a_clean_snapshot_restores_nothing_once(store):
    store.put(K, "WHATEVER")
    _history(store, ["no_plan", "no_plan", "no_plan"])
    assert auto_restore(store, "4-s") == {"failed_sessions": ["1-s", "2-s", "3-s"], "restored": []}
    assert store.get(K) == "WHATEVER"
    assert auto_restore(store, "5-s") is None


def test_restore_last_clean_deletes_a_key_that_was_absent(store):
    store.put(K, "GOOD")
    assert store.get(keys.PROVIDER_LLM_CODE) is None
    _clean_snapshot(store, **{"not:watched": "ignored"})
    write(store, keys.PROVIDER_LLM_CODE, "def call(request, ctx): return 1/0")
    write(store, K, "BROKEN")
    store.put("not:watched", "changed")
    restored = restore_last_clean(store, "7-s")
    assert sorted(restored) == sorted([K, keys.PROVIDER_LLM_CODE])
    assert store.get(keys.PROVIDER_LLM_CODE) is None
    assert store.get(K) == "GOOD"
    assert store.get("not:watched") == "changed"
    assert versions(store, keys.PROVIDER_LLM_CODE)[-1]["value"] is None
    # nothing differs any more: a second restore touches nothing
    assert restore_last_clean(store, "8-s") == []


def test_snapshot_covers_the_watched_keys(store):
    store.put(K, "P")
    snap = snapshot(store)
    assert set(snap) == set(WATCHED) and snap[K] == "P" and snap[keys.CONFIG_MODELS] is None
