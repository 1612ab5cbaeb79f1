"""session_history: a log, one append per session, trimming and karma retention counted from the session's end."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from brainstem.core import keys
from brainstem.core.clock import now_utc
from brainstem.state import history as session_history
from brainstem.store import open_store


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
    monkeypatch.setattr(session_history, "TRIM_SLACK", 2)
    now = datetime.now(timezone.utc)
    for i in range(5):
        session_history.append(store, _session(store, f"s{i}", now))
    # Trimmed in batches: five entries are within HISTORY_MAX + TRIM_SLACK, so all are kept for now.
    assert [h["id"] for h in session_history.read(store)] == ["s0", "s1", "s2", "s3", "s4"]
    session_history.append(store, _session(store, "s5", now))
    assert [h["id"] for h in session_history.read(store)] == ["s3", "s4", "s5"]
    assert [store.log_length(keys.karma(f"s{i}")) for i in range(6)] == [0, 0, 0, 1, 1, 1]


def test_trimming_and_retention_together_keep_the_cursor_right(store, monkeypatch):
    monkeypatch.setattr(session_history, "HISTORY_MAX", 4)
    monkeypatch.setattr(session_history, "TRIM_SLACK", 1)
    start = datetime(2020, 1, 1, tzinfo=timezone.utc)
    for i in range(12):
        session_history.append(store, _session(store, f"s{i}", start + timedelta(days=i)), retention_days=1.5,
                               now=start + timedelta(days=i))
    got = session_history.read(store)
    ids = [h["id"] for h in got]
    assert ids == ids[-len(ids):] and ids[-1] == "s11" and 4 <= len(ids) <= 5
    assert [h["id"] for h in got if not h.get("karma_expired")] == ["s10", "s11"]
    assert [i for i in range(12) if store.log_length(keys.karma(f"s{i}"))] == [10, 11]


def test_an_append_costs_the_same_after_many_sessions(store, monkeypatch):
    """O(1): what one append reads from the store does not grow with the history (counted, not timed)."""
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    read = {"entries": 0, "calls": 0}
    real_read_log = store.read_log

    def counting(log_key, start=0, stop=None):
        out = real_read_log(log_key, start, stop)
        read["calls"] += 1
        read["entries"] += len(out)
        return out
    monkeypatch.setattr(store, "read_log", counting)

    def one(i: int) -> tuple[int, int]:
        read["entries"] = read["calls"] = 0
        session_history.append(store, _session(store, f"s{i}", now + timedelta(hours=i)), retention_days=3,
                               now=now + timedelta(hours=i))
        return read["entries"], read["calls"]
    early = [one(i) for i in range(30)][10:]
    for i in range(30, 400):
        one(i)
    late = [one(i) for i in range(400, 420)]
    # At most the dedupe window and one retention batch, whatever the history's length.
    assert max(e for e, _ in early + late) <= session_history.DEDUPE_WINDOW + 16
    assert max(c for _, c in late) <= max(c for _, c in early) + 1


def test_a_session_is_recorded_once(store):
    session_history.append(store, {"id": "1-a", "outcome": "clean"})
    session_history.append(store, {"id": "2-b", "outcome": "clean"})
    session_history.append(store, {"id": "1-a", "outcome": "crashed"})  # a second word on it: the first stands
    assert [(h["id"], h["outcome"]) for h in session_history.read(store)] == [("1-a", "clean"), ("2-b", "clean")]
    assert store.log_length(keys.SESSION_HISTORY) == 2


def test_a_history_kept_as_one_json_list_moves_into_the_log(store):
    old = [{"id": f"{i}-old", "outcome": "clean", "ended_at": "2026-01-01T00:00:00Z"} for i in range(1, 5)]
    old[0]["karma_expired"] = old[1]["karma_expired"] = True
    store.append(keys.karma("3-old"), '{"event": "session_start"}')
    store.put(keys.SESSION_HISTORY, old)
    assert [h["id"] for h in session_history.read(store)] == ["1-old", "2-old", "3-old", "4-old"]  # read as it is
    session_history.append(store, {"id": "5-new", "outcome": "clean", "ended_at": "2026-01-02T00:00:00Z"})
    assert store.log_length(keys.SESSION_HISTORY) == 5
    assert store.get_text(session_history.MIGRATING) is None
    got = session_history.read(store)
    assert [h["id"] for h in got] == ["1-old", "2-old", "3-old", "4-old", "5-new"]
    assert [bool(h.get("karma_expired")) for h in got] == [True, True, False, False, False]
    assert store.log_length(keys.karma("3-old")) == 1
    assert [h["id"] for h in session_history.recent(store, 2)] == ["4-old", "5-new"]


def test_a_move_into_the_log_cut_off_halfway_is_finished_by_the_next_append(store):
    old = [{"id": f"{i}-old", "outcome": "clean"} for i in range(1, 4)]
    store.put(session_history.MIGRATING, old)  # the copy was made, the value deleted, one entry moved: then a kill
    store.append(keys.SESSION_HISTORY, old[0])
    assert [h["id"] for h in session_history.read(store)] == ["1-old", "2-old", "3-old"]  # readers see it whole
    session_history.append(store, {"id": "4-new", "outcome": "clean"})
    assert [h["id"] for h in session_history.read(store)] == ["1-old", "2-old", "3-old", "4-new"]
    assert store.get_text(session_history.MIGRATING) is None


def test_an_unreadable_log_entry_is_listed_as_damaged_and_reported(store):
    session_history.append(store, {"id": "1-a", "outcome": "clean"})
    store.append(keys.SESSION_HISTORY, "{not json")
    store.append(keys.SESSION_HISTORY, "[1, 2]")
    session_history.append(store, {"id": "2-b", "outcome": "clean"})
    entries, problem = session_history.read_checked(store)
    assert [e["id"] for e in entries] == ["1-a", None, None, "2-b"]
    assert [e.get("damaged") for e in entries] == [None, True, True, None]
    assert "2 damaged entries" in problem


def test_a_truncated_entry_keeps_its_session_and_karma_reachable(store):
    """An entry cut off in place: the session stays listed (damaged), counted, and `karma 3` finds it."""
    from brainstem.core.settings import load_settings
    from brainstem.operator.status import status

    for n, sid in ((1, "1-aaaaaa"), (2, "2-bbbbbb")):
        session_history.append(store, {"id": sid, "number": n, "outcome": "clean"})
    store.append(keys.karma("3-cccccc"), '{"event": "session_start"}')
    whole = '{"id": "3-cccccc", "number": 3, "outcome": "clean", "cost": 0.01}'
    store.append(keys.SESSION_HISTORY, whole[:40])
    entries = session_history.read(store)
    assert [e["id"] for e in entries] == ["1-aaaaaa", "2-bbbbbb", "3-cccccc"]
    assert entries[-1]["damaged"] is True and entries[-1]["number"] == 3
    assert session_history.resolve_session(store, "3") == "3-cccccc"
    report = status(store, load_settings())
    assert report["history_damaged"] == [{"position": 2, "id": "3-cccccc"}] and report["sessions"] is not None


def test_a_dead_session_is_closed_in_history_and_its_own_karma(store):
    store.append(keys.karma("7-dead"), '{"event": "step_start"}')
    session_history.close_dead_session(store, {"id": "7-dead", "started_at": "2026-01-01T00:00:00Z"}, "crashed",
                               detected_by="8-new")
    (entry,) = session_history.read(store)
    assert entry == {"id": "7-dead", "outcome": "crashed", "started_at": "2026-01-01T00:00:00Z",
                     "detected_by": "8-new"}
    from brainstem.store import karma

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


def test_damage_is_reported_once_by_the_next_session_to_find_it(store):
    session_history.append(store, {"id": "1-aaaaaa", "number": 1, "outcome": "clean"})
    store.append(keys.SESSION_HISTORY, '{"id": "2-bbbbbb", "numb')
    first = session_history.unreported_damage(store)
    assert [(d["position"], d["id"]) for d in first] == [(1, "2-bbbbbb")]
    assert session_history.unreported_damage(store) == []
    store.append(keys.SESSION_HISTORY, "\x00garbage")
    assert [d["position"] for d in session_history.unreported_damage(store)] == [2]


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
