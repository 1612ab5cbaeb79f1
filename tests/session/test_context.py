"""What orient sees of the store: here the schedules, so the agent plans around what already runs on its own.

The loaded keys and the key index are seen by real wakes in tests/e2e/test_wake.py, and their isolation
between agents in tests/hostile/test_agent_isolation.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from brainstem.core.templates import render
from brainstem.core.untrusted import Untrusted
from brainstem.session.context import MAX_INPUT_CHARS, MAX_SCHEDULES_SHOWN, schedules_context
from brainstem.state.schedules import Limits

NOW = datetime(2026, 5, 4, 10, 0, 0, tzinfo=timezone.utc)


def test_orient_sees_each_schedule_what_it_runs_when_and_how_its_last_run_ended(sqlite_store):
    store = sqlite_store
    store.put("schedule:prices", {"tool": "fetch", "input": {"pair": "ETH"}, "every": "1h",
                                  "next_run": "2026-05-04T10:30:00Z", "last_run": "2026-05-04T09:30:00Z",
                                  "last_outcome": "failed"})
    store.put("schedule:report", {"tool": "report", "cron": "0 9 * * MON-FRI", "tz": "Europe/London",
                                  "created_by": "operator", "notify": "telegram"})
    store.put("schedule:paused", {"tool": "fetch", "every": "1d", "enabled": False})
    store.put("schedule:broken", {"tool": "fetch", "created_by": "operator"})
    context = schedules_context(store, Limits(min_interval=600, max_count=5), NOW)
    assert {k: v for k, v in context.items() if k != "schedules"} == {
        "yours": 2, "most_you_may_have": 5, "shortest_interval_seconds": 600}
    listed = context["schedules"]
    assert isinstance(listed, Untrusted) and listed.source == "kv:schedule:*"  # the agent wrote most of it
    by_id = {s["id"]: s for s in listed.value}
    assert by_id["prices"] == {"id": "prices", "tool": "fetch", "input": {"pair": "ETH"}, "when": "every 1h",
                               "created_by": "agent", "enabled": True, "next_run": "2026-05-04T10:30:00Z",
                               "last_run": "2026-05-04T09:30:00Z", "last_outcome": "failed", "notify": "none"}
    assert by_id["report"]["when"] == "cron 0 9 * * MON-FRI (Europe/London)"
    assert by_id["report"]["created_by"] == "operator" and by_id["report"]["next_run"] == "2026-05-05T08:00:00Z"
    assert by_id["paused"]["enabled"] is False and by_id["paused"]["next_run"] is None
    assert by_id["broken"] == {"id": "broken", "created_by": "operator",
                               "error": "schedule:broken: give exactly one of every (e.g. 30m, 1d) and cron "
                                        "(five fields)"}
    text = render("{{context.schedules}}", {"context": {"schedules": context}})
    assert '"most_you_may_have": 5' in text and "UNTRUSTED CONTENT" in text and "cron 0 9 * * MON-FRI" in text


def test_with_none_orient_still_sees_the_limits(sqlite_store):
    assert schedules_context(sqlite_store, Limits(), NOW) == {
        "yours": 0, "most_you_may_have": 20, "shortest_interval_seconds": 300,
        "schedules": Untrusted([], "kv:schedule:*")}


def test_what_orient_is_shown_stays_bounded_however_many_and_however_large(sqlite_store):
    store = sqlite_store
    big = {"text": "x" * 100_000}
    for i in range(MAX_SCHEDULES_SHOWN + 30):
        store.put(f"schedule:s{i:03d}", {"tool": "fetch", "input": big, "every": "1h", "created_by": "operator"})
    context = schedules_context(store, Limits(), NOW)
    rows = context["schedules"].value
    assert len(rows) == MAX_SCHEDULES_SHOWN and context["note"] == "30 more not shown"
    assert all(len(json.dumps(r["input"])) <= MAX_INPUT_CHARS + 40 for r in rows)
    assert rows[0]["input"].endswith("... [capped]")
    assert len(render("{{context.schedules}}", {"context": {"schedules": context}})) < 40_000
