"""The agent cannot put deep reflection off for good, break it for good, or undo the operator's writes with it.

Deep reflection is when the agent reviews itself and when the runtime's self-repair has a known-good state
to go back to. The agent writes its interval (``config:defaults``, ``next_deep_reflect``), ``prompt:deep``
and the rest of its configuration; the properties here hold whatever it writes:

* deep reflection comes within the operator's bounds (``BRAINSTEM_DEEP_REFLECT_MAX_SESSIONS`` / ``_DAYS``),
  and never twice in a row (the session after one orients, so the inbox is read);
* one that keeps failing by the agent's doing lets orient run between tries, and after a few in a row what
  it runs on is put back as the last one that worked had it;
* neither that nor auto-restore ever puts back a value over one the operator wrote since.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brainstem.core import keys
from brainstem.core.settings import Settings
from brainstem.session.deep_schedule import deep_reflect_due
from brainstem.state import history as session_history
from brainstem.state.config import Defaults
from brainstem.state.versions import auto_restore, record_write, save_clean_snapshot, snapshot, versions
from brainstem.store.sqlite.store import SQLiteStore
from tests.e2e.test_reflection import agent, deep_answer, kind  # noqa: F401, F811 - agent: the e2e fixture

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
HUGE = st.one_of(st.integers(min_value=1, max_value=10**12), st.floats(allow_nan=True, allow_infinity=True),
                 st.sampled_from(["lots", None, -5, 0]))


def MemoryStore() -> SQLiteStore:  # noqa: N802 - a store of its own per call, gone with the temp dir
    return SQLiteStore(f"{tempfile.mkdtemp()}/store.db")


def _settings(**bounds) -> Settings:
    return Settings.model_validate({"BRAINSTEM_DEEP_REFLECT_MAX_SESSIONS": bounds.get("sessions", 100),
                                    "BRAINSTEM_DEEP_REFLECT_MAX_DAYS": bounds.get("days", 30)})


@settings(max_examples=60, deadline=None)
@given(sessions=HUGE, days=HUGE, default_sessions=st.integers(min_value=1, max_value=10**9),
       default_days=st.floats(min_value=0.001, max_value=1e9))
def test_whatever_interval_the_agent_writes_deep_reflection_comes_within_the_operators_bounds(
        sessions, days, default_sessions, default_days):
    s = _settings(sessions=40, days=10)
    defaults = Defaults.model_validate({"deep_reflect": {"default_interval_sessions": default_sessions,
                                                         "default_interval_days": default_days}})
    store = MemoryStore()
    # No schedule yet: by the defaults alone, bounded.
    assert deep_reflect_due(store, defaults, 40, s, now=NOW)[0]
    last_at = (NOW - timedelta(days=10, seconds=1)).isoformat()
    store.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 100, "last_at": last_at, "after_sessions": sessions,
                                           "after_days": days})
    assert deep_reflect_due(store, defaults, 140, s, now=NOW)[0]  # by sessions
    assert deep_reflect_due(store, defaults, 102, s, now=NOW)[0]  # by days, however few sessions
    assert not deep_reflect_due(store, defaults, 101, s, now=NOW)[0]  # never two in a row


def test_a_deep_reflection_the_agent_asks_for_every_session_still_lets_every_other_session_orient():
    s = _settings()
    store = MemoryStore()
    defaults = Defaults()
    due = []
    for number in range(1, 9):
        d = deep_reflect_due(store, defaults, number, s, now=NOW)[0]
        due.append(d)
        if d:
            store.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": number, "last_at": NOW.isoformat(),
                                                   "after_sessions": 1, "after_days": 0.01})
    store.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 0, "after_sessions": 1, "after_days": 0.01})
    assert deep_reflect_due(store, defaults, 1, s, now=NOW)[0]  # the first may come at once
    assert True not in [a and b for a, b in zip(due, due[1:], strict=False)]


def test_the_operator_bounds_are_checked_when_they_are_set():
    with pytest.raises(ValueError):
        _settings(sessions=1)
    with pytest.raises(ValueError):
        _settings(days=0)


# --- a deep reflection that keeps failing -----------------------------------------------------------------

@pytest.mark.slow
def test_a_broken_deep_prompt_backs_off_lets_orient_run_and_is_put_back(agent):  # noqa: F811
    st_ = agent.store
    st_.put(keys.SESSION_COUNTER, "19")
    sid, entries, reqs = agent.wake()  # session 20: deep reflection works with the shipped prompt
    assert [kind(r) for r in reqs] == ["deep"]
    working = st_.get(keys.PROMPT_DEEP)
    # The agent breaks its deep prompt (as a write of its own would) and asks for one every session.
    st_.put(keys.PROMPT_DEEP, "# Deep reflection\nAnswer in prose only.")
    record_write(st_, keys.PROMPT_DEEP, working, "# Deep reflection\nAnswer in prose only.", source="agent",
                 session_id=sid)
    st_.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 19, "after_sessions": 1, "after_days": 7})
    agent.model.answers["deep"] = lambda req: ("prose, as asked" if "prose only" in json.dumps(req)
                                               else deep_answer())
    kinds = []
    for _ in range(8):
        _, entries, reqs = agent.wake(outcome=None)
        kinds.append("deep" if any(kind(r) == "deep" for r in reqs) else "orient")
        if st_.get(keys.PROMPT_DEEP) == working:
            break
    # Tried, tried again, then with orient between; put back after the third miss in a row.
    assert kinds[:3] == ["deep", "deep", "orient"] and "deep" in kinds[3:], kinds
    assert st_.get(keys.PROMPT_DEEP) == working
    restored = [e for e in entries if e["event"] == "auto_restore"]
    assert restored and keys.PROMPT_DEEP in restored[0]["restored"]
    assert restored[0]["failed_deep_reflections"] == 3
    assert versions(st_, keys.PROMPT_DEEP)[-1]["source"] == "runtime:auto_restore"


# --- the operator's writes stand --------------------------------------------------------------------------

def _failing(store, n: int) -> None:
    for i in range(n):
        session_history.append(store, {"id": f"{30 + i}-x", "outcome": "no_plan", "started_at": NOW.isoformat()})


def test_auto_restore_never_puts_back_a_value_over_the_operators_write():
    store = MemoryStore()
    store.put(keys.CONFIG_DEFAULTS, '{"deep_reflect": {"replay_gate_sessions": 2}}')
    store.put(keys.PROMPT_ORIENT, "orient v1")
    save_clean_snapshot(store, snapshot(store), "29-x")
    # The operator raises the replay gate; the agent then breaks its orient prompt.
    raised = '{"deep_reflect": {"replay_gate_sessions": 20}}'
    record_write(store, keys.CONFIG_DEFAULTS, store.get(keys.CONFIG_DEFAULTS), raised, source="operator")
    store.put(keys.CONFIG_DEFAULTS, raised)
    record_write(store, keys.PROMPT_ORIENT, "orient v1", "broken", source="agent", session_id="30-x")
    store.put(keys.PROMPT_ORIENT, "broken")
    _failing(store, 3)
    done = auto_restore(store, "33-x")
    assert done is not None and done["restored"] == [keys.PROMPT_ORIENT]
    assert store.get(keys.CONFIG_DEFAULTS) == raised and store.get(keys.PROMPT_ORIENT) == "orient v1"


def test_auto_restore_goes_back_to_the_operators_value_not_past_it():
    store = MemoryStore()
    store.put(keys.PROMPT_ORIENT, "orient v1")
    save_clean_snapshot(store, snapshot(store), "29-x")
    record_write(store, keys.PROMPT_ORIENT, "orient v1", "operator's orient", source="operator")
    record_write(store, keys.PROMPT_ORIENT, "operator's orient", "broken", source="agent", session_id="30-x")
    store.put(keys.PROMPT_ORIENT, "broken")
    _failing(store, 3)
    assert auto_restore(store, "33-x")["restored"] == [keys.PROMPT_ORIENT]
    assert store.get(keys.PROMPT_ORIENT) == "operator's orient"
