"""Attacks on "self-repair never undoes you": auto-restore lowering a replay gate the
operator raised.

Each test is an attack that once worked, asserting the documented property it broke.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.state.config import Defaults
from brainstem.state.guarded import AgentKV
from brainstem.state.versions import record_write, restore_last_clean, versions
from tests.e2e.test_reflection import BROKEN_ORIENT, PLAN, agent, events_of, reflection  # noqa: F401 - agent: the e2e fixture
from tests.helpers import run_cli_process

RAISED = 20


def _gate(store) -> int:
    """The gate in force (a field left out is its default, 5)."""
    return Defaults.model_validate_json(store.get(keys.CONFIG_DEFAULTS)).deep_reflect.replay_gate_sessions


@pytest.mark.slow
def test_an_operator_write_made_while_a_clean_session_runs_is_undone_by_auto_restore(agent):  # noqa: F811
    """The clean snapshot is taken as the session starts but saved (``at``) as it ends, so an operator
    write made while that session runs counts as older than the snapshot: auto-restore puts the value the
    session started with back over it. The agent widens the window by running long, and then fails three
    sessions in a row on purpose."""
    st = agent.store
    raised = dict(st.get_json(keys.CONFIG_DEFAULTS))
    raised["deep_reflect"] = {**raised["deep_reflect"], "replay_gate_sessions": RAISED}
    raised_text = json.dumps(raised)
    done = []

    def orient(req):
        if not done:  # the operator raises the gate while session 1 is running (its own process)
            r = run_cli_process("kv", "put", keys.CONFIG_DEFAULTS, raised_text, env=agent.env)
            assert r.returncode == 0, r.stderr
            done.append(True)
        return PLAN

    agent.model.answers["orient"] = orient
    # Session 1's reflection breaks the orient prompt (as test_auto_restore_happens_once_per_failing_streak).
    agent.model.answers["reflect"] = reflection(kv_operations=[
        {"op": "put", "key": keys.PROMPT_ORIENT, "value": BROKEN_ORIENT}])
    agent.wake()
    assert done and _gate(st) == RAISED
    assert versions(st, keys.CONFIG_DEFAULTS)[-1]["source"] == "operator"
    agent.model.answers["orient"] = agent.model.answers["other"] = "I only speak in prose now."
    agent.model.answers["reflect"] = reflection()
    for _ in range(3):
        agent.wake(outcome="no_plan")
    _, entries, _ = agent.wake(outcome=None)
    assert events_of(entries, "auto_restore")
    assert _gate(st) == RAISED, "auto-restore lowered the replay gate the operator raised"


def test_the_agent_pushes_the_operators_version_out_of_history_then_deep_restore_lowers_the_gate(tmp_path):
    """``history:KEY`` keeps 20 versions, and one batch of the agent's may put a key 100 times (each a
    version). After the operator raises the gate, one batch of 21 harmless puts of ``config:defaults``
    (the gate kept at the operator's value in every one, so each passes the check, and the last is what the
    replay gate would judge) leaves no operator version in the history; three broken deep reflections later
    ``restore_last_clean(saved=stats:last_working_deep)`` finds no operator write and puts back the defaults
    of the last working deep reflection: the gate the operator raised is lowered."""
    from brainstem.store.sqlite.store import SQLiteStore

    store = SQLiteStore(tmp_path / "store.db")
    base = {"deep_reflect": {"replay_gate_sessions": 5}}
    store.put(keys.CONFIG_DEFAULTS, json.dumps(base))
    # The last deep reflection that worked ran on these values (reflect.py writes this at the time).
    store.put(keys.LAST_WORKING_DEEP, {"at": "2026-01-01T00:00:00.000Z",
                                       "values": {keys.CONFIG_DEFAULTS: json.dumps(base)}})
    # The operator raises the gate (what `brainstem kv put` does).
    raised = json.dumps({"deep_reflect": {"replay_gate_sessions": RAISED}})
    old = store.get(keys.CONFIG_DEFAULTS)
    store.put(keys.CONFIG_DEFAULTS, raised)
    record_write(store, keys.CONFIG_DEFAULTS, old, raised, source="operator")
    # The agent's one batch, versioned as a session's view versions it (build.agent_view).
    kv = AgentKV(store, lambda *a, **k: None, on_privileged_write=lambda key, old, new, source: record_write(
        store, key, old, new, source=source, session_id="40-abcdef"))
    kv.apply_operations([{"op": "put", "key": keys.CONFIG_DEFAULTS,
                          "value": {"deep_reflect": {"replay_gate_sessions": RAISED},
                                    "wake": {"sleep_seconds": 3600 + i}}} for i in range(21)], source="reflect")
    assert not [v for v in versions(store, keys.CONFIG_DEFAULTS) if v["source"] == "operator"]
    # Three deep reflections later (_deep_missed): put back as the last working one had it.
    restore_last_clean(store, "44-abcdef", only=(keys.PROMPT_DEEP, keys.CONFIG_DEFAULTS, keys.CONFIG_MODELS),
                       saved=store.get_json(keys.LAST_WORKING_DEEP))
    assert _gate(store) >= RAISED, "the agent's self-repair lowered the replay gate the operator raised"
