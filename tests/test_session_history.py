"""session_history: one write per session, trimming and karma retention counted from the session's end."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from brainstem import keys, session_history


def _session(store, sid: str, ended: datetime) -> dict:
    store.append(keys.karma(sid), '{"event": "session_start"}')
    return {"id": sid, "outcome": "clean", "ended_at": ended.strftime("%Y-%m-%dT%H:%M:%SZ")}


def test_retention_counts_back_from_the_given_time_not_the_wall_clock(store):
    start = datetime(2020, 1, 1, tzinfo=timezone.utc)  # long ago by the wall clock
    for i in range(5):
        session_history.append(store, _session(store, f"s{i}", start + timedelta(days=i)), retention_days=2,
                       now=start + timedelta(days=i))
    kept = [h["id"] for h in session_history.read(store) if not h.get("karma_expired")]
    assert kept == ["s2", "s3", "s4"]  # within two days of the last session's end
    assert [store.log_length(keys.karma(f"s{i}")) for i in range(5)] == [0, 0, 1, 1, 1]
    assert len(session_history.read(store)) == 5  # summaries stay


def test_sessions_leaving_the_history_take_their_karma(store, monkeypatch):
    monkeypatch.setattr(session_history, "HISTORY_MAX", 3)
    now = datetime.now(timezone.utc)
    for i in range(5):
        session_history.append(store, _session(store, f"s{i}", now))
    assert [h["id"] for h in session_history.read(store)] == ["s2", "s3", "s4"]
    assert [store.log_length(keys.karma(f"s{i}")) for i in range(5)] == [0, 0, 1, 1, 1]


def test_a_dead_session_is_closed_in_history_and_its_own_karma(store):
    store.append(keys.karma("7-dead"), '{"event": "step_start"}')
    session_history.close_dead_session(store, {"id": "7-dead", "started_at": "2026-01-01T00:00:00Z"}, "crashed",
                               detected_by="8-new")
    (entry,) = session_history.read(store)
    assert entry == {"id": "7-dead", "outcome": "crashed", "started_at": "2026-01-01T00:00:00Z",
                     "detected_by": "8-new"}
    from brainstem import karma

    assert karma.read(store, "7-dead")[-1]["outcome"] == "crashed"


def test_unreadable_history_reads_as_empty(store):
    store.put(keys.SESSION_HISTORY, "{not json")
    assert session_history.read(store) == []
    store.put(keys.SESSION_HISTORY, {"not": "a list"})
    assert session_history.read(store) == []


def test_a_history_that_is_an_object_keeps_the_entries_inside_it(store):
    store.put(keys.SESSION_HISTORY, {"sessions": [{"id": "1-aaaaaa", "outcome": "clean"},
                                                  {"id": "2-bbbbbb", "outcome": "crashed"}]})
    entries, problem = session_history.read_checked(store)
    assert [e["id"] for e in entries] == ["1-aaaaaa", "2-bbbbbb"]
    assert "not a list" in problem and "recovered 2" in problem
    reasons = []
    session_history.append(store, {"id": "3-cccccc", "outcome": "clean"}, on_reject=reasons.append)
    assert [e["id"] for e in session_history.read(store)] == ["1-aaaaaa", "2-bbbbbb", "3-cccccc"]
    assert reasons and store.get_json(keys.REJECTED_SESSION_HISTORY)["raw"].startswith('{"sessions"')
