"""A ``secret:*`` value the agent wrote hides nothing from the operator.

The agent may write secret keys (never read them). Karma, the dashboard and ``brainstem tool run`` redact
the secrets they know, so if every stored secret counted, the agent could store an ordinary word as a
secret and have it blanked from everything the operator reads. The property: what the operator sees of
the agent's text is the same whatever the agent wrote as a secret, while a value the operator stored (or
one nobody marked) stays hidden.
"""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brainstem.core import keys
from brainstem.state import secret_marks
from brainstem.state.guarded import AgentKV
from brainstem.store import karma
from brainstem.store.sqlite.store import SQLiteStore
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import run_tool
from tests.dashboard_client import app_for, client, dashboard_settings

SID = "7-abcdef"
# What differs between two renderings of one store anyway: a form's CSRF token, a time, the store's path.
_VOLATILE = re.compile(r'name="csrf" value="[^"]*"|\d{4}-\d\d-\d\dT[\d:.]+Z?|sqlite:///[^<"]*')
WORDS = st.text(string.ascii_lowercase, min_size=6, max_size=12)


def _kv(store) -> AgentKV:
    return AgentKV(store, lambda event, **fields: None)


@pytest.fixture
def ds(monkeypatch):
    return dashboard_settings(monkeypatch, OPENROUTER_API_KEY="sk-or-v1-agent-secrets-0123456789")


def _pages(settings_, store, word: str) -> dict[str, str]:
    c = client(app_for(settings_, store))
    out = {}
    for path in ("/store?key=notes", f"/sessions/{SID}", "/"):
        r = c.get(path)
        assert r.status_code == 200, path
        out[path] = _VOLATILE.sub("~", r.text.replace(word, "WORD"))
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(WORDS, min_size=2, max_size=2, unique=True))
def test_the_dashboard_shows_the_same_text_whatever_the_agent_wrote_as_a_secret(ds, tmp_path_factory, words):
    pages = []
    for word in words:
        store = SQLiteStore(tmp_path_factory.mktemp("s") / "store.db")
        try:
            _kv(store).put(keys.secret("chosen"), word)
            store.put("notes", f"the refund of {word} is due")
            karma.Karma(store, SID).record("note", text=f"checked {word}")
            seen = _pages(ds, store, word)
            assert "the refund of WORD is due" in seen["/store?key=notes"]
            assert "[REDACTED:secret:chosen]" not in "".join(seen.values())
            pages.append(seen)
        finally:
            store.close()
    assert pages[0] == pages[1]


def test_a_secret_the_operator_stored_stays_hidden_even_after_the_agent_wrote_the_key_before(ds, tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        _kv(store).put(keys.secret("vault"), "agent-guess-1")
        store.put(keys.secret("vault"), "operator-value-77")  # the operator's `kv put` (or any write of theirs)
        store.put(keys.secret("other"), "never-marked-value")
        store.put("notes", "operator-value-77 never-marked-value agent-guess-1")
        text = client(app_for(ds, store)).get("/store?key=notes").text
        assert "operator-value-77" not in text and "never-marked-value" not in text
        assert "[REDACTED:secret:vault]" in text and "agent-guess-1" in text
    finally:
        store.close()


def test_every_way_the_agent_writes_a_secret_marks_it(tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        kv = _kv(store)
        kv.put(keys.secret("a"), "value-by-put")
        kv.apply_operations([{"op": "put", "key": keys.secret("b"), "value": "value-by-batch"}])
        assert secret_marks.agent_wrote(store, keys.secret("a"), "value-by-put")
        assert secret_marks.agent_wrote(store, keys.secret("b"), "value-by-batch")
        assert not secret_marks.agent_wrote(store, keys.secret("a"), "value-by-batch")  # per key
        # The marks are the runtime's: the agent cannot forge or clear one.
        for op in ({"op": "put", "key": keys.agent_secret_log(keys.secret("c")), "value": "x"},
                   {"op": "delete", "key": keys.agent_secret_log(keys.secret("a"))}):
            with pytest.raises(Exception, match="runtime|may not|cannot|refused"):
                kv.apply_operations([op])
        assert secret_marks.agent_wrote(store, keys.secret("a"), "value-by-put")
    finally:
        store.close()


def test_a_tool_granted_a_secret_the_agent_wrote_leaves_it_readable_in_karma(monkeypatch, tmp_path):
    """The grant still goes out (to the bound host only); the session's karma is not taught to redact it."""
    for name in ("BRAINSTEM_TOOL_SECRETS", "BRAINSTEM_ENV_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BRAINSTEM_TOOL_SECRETS", "secret:vault@127.0.0.1")
    from brainstem.core.settings import load_settings

    s = load_settings()
    store = SQLiteStore(tmp_path / "store.db")
    try:
        store.put(keys.tool_code("show"), "def execute(args, ctx):\n    return sorted(ctx.secrets)\n")
        store.put(keys.tool_meta("show"), json.dumps({"description": "x", "timeout_ms": 20000,
                                                      "kv_secrets": ["vault"]}))
        taught: list[dict] = []
        for writer in ("agent", "operator"):
            value = f"{writer}-wrote-this"
            if writer == "agent":
                _kv(store).put(keys.secret("vault"), value)
            else:
                store.put(keys.secret("vault"), value)
            got: dict = {}
            policy = ToolPolicy.from_settings(s, on_secrets=got.update)
            out = run_tool("show", {}, store=store, agent_kv=_kv(store), record=lambda e, **f: None, policy=policy)
            assert out.ok and out.value == ["vault"], out.error
            taught.append(got)
        assert taught == [{}, {"secret:vault": "operator-wrote-this"}]
    finally:
        store.close()
