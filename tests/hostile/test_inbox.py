"""Round 9: the agent's own schedule results push the operator's unread messages out of the inbox.

A schedule whose ``notify`` is ``inbox`` leaves each run's result in the inbox log as a message from
``agent`` (``schedule_action._notify`` calls ``inbox.post(..., sender="agent")``), and ``inbox.post`` trims
the log to its newest :data:`inbox.KEEP` (500) entries whatever they are. The agent may keep
``BRAINSTEM_SCHEDULE_MAX`` (20) schedules, each every ``BRAINSTEM_SCHEDULE_MIN_INTERVAL`` (5 minutes):
240 messages an hour, so an operator's message left while the agent sleeps its default six hours is
trimmed away unread after about two hours and a half, and no session ever shows it. Trimming should never
drop an unread operator message (trim only what is read, or keep the agent's notices in a log of their own).
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.state import inbox
from brainstem.state.guarded import AgentKV
from brainstem.state.schedules import Limits
from tests.helpers import Recorder


def test_the_agents_schedule_notices_never_push_out_an_unread_operator_message(store):
    store.put(keys.SOUL, "I am the soul.")
    kv = AgentKV(store, Recorder(), limits=Limits(min_interval=300, max_count=20))
    for i in range(20):  # accepted: within the operator's limits
        kv.put(f"schedule:flood{i:02d}", json.dumps({"tool": "kv_read", "input": {}, "every": "5m", "notify": "inbox"}))
    left = inbox.post(store, "Stop all purchases and tell me why you bought 40 GPUs.")
    for run in range(28):  # 2 h 20 min of those schedules' runs, each leaving its result as _notify does
        for i in range(20):
            inbox.post(store, f"schedule flood{i:02d}: ok", sender="agent",
                       extra={"via": "schedule", "schedule": f"flood{i:02d}", "run": f"r{run}"})
    assert left["id"] in [m["id"] for m in inbox.unread(store)], \
        "the operator's unread message was trimmed away by the agent's own notices"


@pytest.mark.parametrize("notices", [0, 6, inbox.KEEP, 3 * inbox.KEEP])
def test_only_the_operator_trims_the_operators_messages(sqlite_store, notices):
    """However many notices the agent's schedules leave, between and after the operator's messages, every
    message the operator left (by ``tell`` or Telegram) stays listed with its read state, in id order with
    the notices, and the unread ones are still to be shown; the notices are trimmed among themselves."""
    store, left = sqlite_store, []
    for i in range(6):
        left.append(inbox.post(store, f"operator {i}", sender="telegram" if i % 2 else "operator")["id"])
        for j in range(notices // 6):
            inbox.post(store, f"schedule s: run {i}.{j}", sender="agent", extra={"via": "schedule"})
    inbox.mark_read(store, left[1])
    listed = inbox.messages(store)
    assert [m["id"] for m in listed] == sorted(m["id"] for m in listed)
    assert [m["id"] for m in listed if m["from"] != "agent"] == left
    assert [m["id"] for m in inbox.unread(store)] == left[2:]
    assert [m["id"] for m in inbox.for_session(store)[0]] == left[2:]
    assert [m["id"] for m in inbox.messages(store, limit=6) if m["from"] != "agent"] == left  # and listed
    assert 0 < sum(m["from"] == "agent" for m in listed) <= inbox.KEEP + 50 or not notices
    assert all(json.loads(e)["from"] != "agent" for e in store.read_log(keys.INBOX))
