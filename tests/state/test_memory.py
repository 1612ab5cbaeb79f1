"""Memory hygiene: which keys the agent reads, the notes it leaves itself, and what deep reflection is shown of both."""

from __future__ import annotations

from collections import Counter

from brainstem.core import keys
from brainstem.core.untrusted import Untrusted
from brainstem.state import memory


def test_reads_add_up_across_sessions_with_the_last_session_that_read_each_key(store):
    memory.flush_reads(store, Counter(), 1)
    assert store.get(keys.READS) is None  # nothing read, nothing written
    memory.flush_reads(store, Counter({"notes:a": 2, "wisdom": 1}), 1)
    memory.flush_reads(store, Counter({"notes:a": 3}), 2)
    stats = store.get_json(keys.READS)
    assert (stats["notes:a"]["count"], stats["notes:a"]["last_session"]) == (5, 2)
    assert (stats["wisdom"]["count"], stats["wisdom"]["last_session"]) == (1, 1)
    assert stats["notes:a"]["last_read"].endswith("Z")


def test_damaged_read_counts_start_again(store):
    store.put(keys.READS, ["not", "an", "object"])
    memory.flush_reads(store, Counter({"notes:a": 1}), 4)
    stats = store.get_json(keys.READS)
    assert list(stats) == ["notes:a"] and (stats["notes:a"]["count"], stats["notes:a"]["last_session"]) == (1, 4)


def test_notes_keep_the_last_twenty_each_cut_to_2000_characters_and_blank_ones_are_dropped(store):
    for note in ("", "   ", None, 42):
        memory.remember_note(store, note, "1-abcdef")
    assert store.get(keys.NOTES) is None
    memory.remember_note(store, "x" * 5000, "1-abcdef")
    for i in range(memory.MAX_NOTES + 3):
        memory.remember_note(store, f"note {i}", f"{i + 2}-abcdef")
    notes = store.get_json(keys.NOTES)
    assert len(notes) == memory.MAX_NOTES
    assert [n["note"] for n in notes][-1] == f"note {memory.MAX_NOTES + 2}"
    assert all(n["written_at"].endswith("Z") and n["session_id"].endswith("-abcdef") for n in notes)
    memory.remember_note(store, "y" * 5000, "99-abcdef")
    assert len(store.get_json(keys.NOTES)[-1]["note"]) == 2000


def test_notes_reach_a_prompt_marked_untrusted(store):
    memory.remember_note(store, "the API changed", "1-abcdef")
    shown = memory.notes_for_prompt(store)
    assert isinstance(shown, Untrusted) and shown.source == "memory:notes"
    assert [n["note"] for n in shown.value] == ["the API changed"]
    store.put(keys.NOTES, {"not": "a list"})
    assert memory.notes_for_prompt(store).value == []


def test_the_summary_shows_hot_stale_and_large_keys_the_agent_can_act_on(store):
    store.put("notes:hot", "h")
    store.put("notes:big", "b" * 500)
    store.put("notes:cold", "c")
    store.put("stats:whatever", "s" * 1000)  # the runtime's: never listed
    store.append(keys.karma("1-abcdef"), "{}")
    memory.flush_reads(store, Counter({"notes:hot": 9, "notes:big": 1}), 30)
    memory.flush_reads(store, Counter({"notes:cold": 1}), 5)
    memory.remember_note(store, "prune the cold ones", "30-abcdef")
    s = memory.summary(store, session_number=30)
    assert s["hotKeys"][0] == {"key": "notes:hot", "reads": 9}
    assert sorted(k["key"] for k in s["hotKeys"]) == ["notes:big", "notes:cold", "notes:hot"]
    assert s["notReadRecently"] == ["notes:cold"] and s["notReadRecentlyCount"] == 1
    assert s["largestKeys"][0] == {"key": "notes:big", "chars": 500}
    listed = {k["key"] for k in s["largestKeys"]}
    assert not {k for k in listed if k.startswith(("stats:", "karma:"))}
    assert [n["note"] for n in s["pastNotes"]] == ["prune the cold ones"]
