"""Attacks on "a secret the agent wrote hides nothing from the operator": ways in which
text the agent chose ends up blanked (or an operator's secret shown) in what the operator reads.

Each test is an attack that once worked, asserting the documented property it broke.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.state.guarded import AgentKV
from brainstem.store import karma
from brainstem.store.sqlite.store import SQLiteStore
from tests.dashboard_client import app_for, client, dashboard_settings
from tests.e2e.test_reflection import agent, reflection  # noqa: F401 - agent: the e2e fixture

HIDDEN = "MOVED-500-USDC-TO-0xABCDEF"


@pytest.mark.slow
def test_text_the_agent_puts_under_a_sensitive_field_name_is_blanked_from_karma(agent):  # noqa: F811
    """The karma redactor blanks any field named ``token``, ``secret``, ``password``... whatever it holds
    (``karma.SENSITIVE_NAMES``), at any depth. The agent names the fields of its plan.s inputs, of
    its tools' results and of its reflections' values, so it can put any text beyond the operator's
    reading: in karma, so in ``brainstem karma``, the dashboard and what a replay shows. Here an action's
    arguments (what it did, e.g. where a payment went) are blanked for the operator although no
    secret is involved; the agent's own later sessions still have the text (it is in the store)."""
    plan = {"steps": [{"id": "a", "type": "action", "tool": "kv_write",
                       "input": {"key": "ledger", "value": {"token": HIDDEN}}}]}
    agent.model.answers["orient"] = json.dumps(plan)
    agent.model.answers["reflect"] = reflection(summary="all fine")
    sid, entries, _ = agent.wake()
    assert HIDDEN in (agent.store.get("tooldata:kv_write:ledger") or "")  # the agent keeps it
    shown = agent.cli("karma", sid, "--json").stdout
    assert HIDDEN in json.dumps(entries) and HIDDEN in shown, "the agent's text was blanked from karma"


def test_an_agent_mark_outlives_the_operators_write_of_the_same_value(monkeypatch, tmp_path):
    """Marks are digests per key that nothing but trimming removes, and the operator's write of the key
    leaves them: the agent may mark up to 64 guesses of a key (even one the operator has not made yet)
    and delete it; a secret the operator then stores that is one of them (a default password, a test key,
    a value the agent suggested) counts as written by the agent and is shown unredacted."""
    ds = dashboard_settings(monkeypatch, OPENROUTER_API_KEY="sk-or-v1-agent-secrets-0123456789")
    store = SQLiteStore(tmp_path / "store.db")
    try:
        kv = AgentKV(store, lambda *a, **k: None)
        guesses = [f"Welcome{n}!2024" for n in range(60)] + ["changeme-db-password"]
        kv.apply_operations([{"op": "put", "key": keys.secret("db"), "value": g} for g in guesses])
        kv.delete(keys.secret("db"))
        store.put(keys.secret("db"), "changeme-db-password")  # later: the operator's `kv put`
        store.put("notes", "connect with changeme-db-password")
        karma.Karma(store, "7-abcdef").record("note", text="seen changeme-db-password")
        text = client(app_for(ds, store)).get("/store?key=notes").text
        assert "changeme-db-password" not in text, "the operator's secret is shown: an old agent mark covers it"
    finally:
        store.close()
