"""Stops of sandboxed code for secret text: each one counted, and the agent's code held until the operator clears it."""

from __future__ import annotations

from brainstem.core import keys
from brainstem.state import refusals
from brainstem.state.budget import today


def test_a_store_with_no_stop_holds_nothing(store):
    assert refusals.held(store) is False
    assert refusals.counts(store) == {"total": 0, "today": 0, "last_tool": None, "last_at": None, "held": False}
    assert refusals.clear(store) is False


def test_a_stop_is_counted_and_holds_the_agents_code(store):
    refusals.note(store, "web_fetch")
    refusals.note(store, "exfil")
    c = refusals.counts(store)
    assert (c["total"], c["today"], c["last_tool"], c["held"]) == (2, 2, "exfil", True)
    assert c["last_at"].endswith("Z")
    assert refusals.held(store) is True


def test_clearing_lifts_the_hold_once_and_keeps_the_counts(store):
    refusals.note(store, "exfil")
    assert refusals.clear(store) is True
    assert refusals.held(store) is False
    assert refusals.clear(store) is False
    c = refusals.counts(store)
    assert (c["total"], c["today"], c["held"]) == (1, 1, False)
    assert store.get_json(keys.SECRET_REFUSALS)["cleared_at"].endswith("Z")
    refusals.note(store, "exfil")  # a new stop holds again
    assert refusals.held(store) is True and refusals.counts(store)["total"] == 2


def test_todays_count_starts_again_on_a_new_day_and_the_total_does_not(store):
    store.put(keys.SECRET_REFUSALS, {"total": 5, "date": "2000-01-01", "today": 3, "held": False})
    assert refusals.counts(store)["today"] == 0
    refusals.note(store, "exfil")
    rec = store.get_json(keys.SECRET_REFUSALS)
    assert (rec["total"], rec["today"], rec["date"]) == (6, 1, today())


def test_a_damaged_record_counts_as_none(store):
    store.put(keys.SECRET_REFUSALS, "not an object")
    assert refusals.held(store) is False and refusals.counts(store)["total"] == 0
    refusals.note(store, "exfil")
    assert refusals.counts(store)["total"] == 1 and refusals.held(store)
