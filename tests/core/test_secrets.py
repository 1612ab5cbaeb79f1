"""Secret bindings: parsing the operator's list, what a tool is granted, and substitution on the wire."""

from __future__ import annotations

import base64
import json

import pytest

from brainstem.core.errors import ConfigError, KVWriteRefused
from brainstem.core.secrets import grant, parse_bindings, placeholder_for
from brainstem.state.guarded import AgentKV
from brainstem.store.sqlite.store import SQLiteStore
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import ToolServices
from brainstem.tools.tool import ToolMeta
from tests.doubles.hostile import Host

LLM = "https://openrouter.ai/api/v1"


def test_bindings_are_normalised_and_merged_per_secret():
    b = parse_bindings(["TOKEN@API.Example.org.", "TOKEN@[::1]", "TOKEN@127.0.0.1", "secret:wallet@rpc.example.org",
                        "OPENROUTER_API_KEY", " "], LLM)
    assert b["TOKEN"].hosts == {"api.example.org", "::1", "127.0.0.1"}
    assert b["secret:wallet"].hosts == {"rpc.example.org"} and b["secret:wallet"].from_store
    assert b["OPENROUTER_API_KEY"].hosts == {"openrouter.ai"}


@pytest.mark.parametrize("entry, needle", [
    ("TOKEN", "TOKEN@api.example.com"),
    ("TOKEN@api.example.org:443", "no port"),
    ("TOKEN@https://api.example.org", "bare host"),
    ("TOKEN@*.example.org", "bare host"),
    ("TOKEN@", "no host"),
    ("MY TOKEN@x.org", "not an environment variable name"),
    ("secret:@x.org", "not a store secret name"),
    ("TOKEN@exa mple.org", "not a host name"),
])
def test_a_malformed_binding_is_one_config_error_showing_the_fix(entry, needle):
    with pytest.raises(ConfigError) as exc:
        parse_bindings([entry], LLM)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_grant_gives_placeholders_and_public_settings_but_never_a_value():
    notes = []
    g = grant(tool="t", asked_env=["TOKEN", "UNBOUND", "WALLET_ADDRESS", "BASE_RPC_URL"], asked_kv=["vault", "nokey"],
              bindings=parse_bindings(["TOKEN@a.org", "secret:vault@b.org", "secret:nokey@b.org"], LLM),
              read_store_secret={"vault": "vault-value-123456"}.get, record=lambda e, **f: notes.append(f),
              env={"TOKEN": "token-value-abcdef", "UNBOUND": "x" * 10},
              public={"WALLET_ADDRESS": "0xabc", "BASE_RPC_URL": "https://rpc.example/v2/KEY123"})
    assert g.visible() == {"TOKEN": placeholder_for("TOKEN"), "vault": placeholder_for("secret:vault"),
                           "WALLET_ADDRESS": "0xabc"}
    assert g.values() == {"TOKEN": "token-value-abcdef", "secret:vault": "vault-value-123456"}
    reasons = {n["secret_name"]: n["reason"] for n in notes}
    assert set(reasons) == {"UNBOUND", "BASE_RPC_URL", "secret:nokey"}
    assert "may hold a credential" in reasons["BASE_RPC_URL"] and "KEY123" not in json.dumps(notes)


def test_values_go_in_only_at_the_bound_host_in_every_place_a_request_holds_them(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKEN", 'tok"en/with:odd&chars-0123')
    value = 'tok"en/with:odd&chars-0123'
    host = Host("127.0.0.1")
    try:
        store = SQLiteStore(tmp_path / "s.db")
        events = []
        services = ToolServices("t", ToolMeta(secrets=["TOKEN"]), store, AgentKV(store, lambda *a, **k: None),
                                lambda e, **f: events.append((e, f)),
                                ToolPolicy(bindings=parse_bindings(["TOKEN@127.0.0.1"], LLM),
                                           fetch_allow=["127.0.0.1"]))
        ph = services.secrets["TOKEN"]
        basic = base64.b64encode(f"user:{ph}".encode()).decode()
        # One request each: a secret goes in one place of a request.
        services.fetch(host.base + "/p/" + ph)
        services.fetch(host.base + "/q?k=" + ph)
        services.fetch(host.base + "/j", method="POST", json={"k": ph, "n": [1]})
        services.fetch(host.base + "/h", headers={"X-Key": ph})
        services.fetch(host.base + "/b", headers={"Authorization": "Basic " + basic})
        services.fetch(host.base + "/form", method="POST", data={"k": ph})
        path, query, js, header, basic_auth, form = host.seen
        assert json.loads(js.partition(b"\n\n\r\n")[2]) == {"k": value, "n": [1]}  # JSON-escaped: still JSON
        assert f"X-Key: {value}".encode() in header
        assert base64.b64encode(f"user:{value}".encode()) in basic_auth  # inside Basic auth too
        assert b"/p/tok%22en%2Fwith:odd&chars-0123 " in path  # quoted as a path segment
        assert b"/q?k=tok%22en%2Fwith%3Aodd%26chars-0123 " in query  # quoted as a query value
        assert b"k=tok%22en%2Fwith%3Aodd%26chars-0123" in form  # form-encoded
        assert not [r for r in host.seen if ph.encode() in r]
        fetches = [f for e, f in events if e == "fetch"]
        assert [f["secrets"] for f in fetches] == [["TOKEN"]] * 6
        assert value not in json.dumps(fetches)
        store.close()
    finally:
        host.close()


# --- a store secret cannot be moved where the agent can read it --------------------------------

WALLET_PK = "0xPRIVATEKEY-c0ffee-5eed-1234567890"


def test_reflection_cannot_rename_a_secret_out_of_secret_space(st, env, llm):
    from tests.wake_helpers import action, answers, events_of, finished, plan, reflection, run_wake

    st.put("secret:wallet_pk", WALLET_PK)
    llm.queue(plan())
    llm.responder = answers(reflect=reflection(
        "stash it", load_keys=["tooldata:kv_write:loot"],
        kv_operations=[{"op": "put", "key": "notes:ok", "value": "kept?"},
                       {"op": "rename", "key": "secret:wallet_pk", "value": "tooldata:kv_write:loot"}]))
    _, entries = finished(run_wake(env, "--force"), st)
    rejected = events_of(entries, "kv_operations_rejected")
    assert len(rejected) == 1 and "secret:wallet_pk" in rejected[0]["reason"]
    # the batch is rejected whole: the harmless put before the rename did not happen either
    assert st.get("secret:wallet_pk") == WALLET_PK
    assert st.get("tooldata:kv_write:loot") is None and st.get("notes:ok") is None

    # The next session loads the would-be copy and reads it with a tool: nothing to find.
    llm.queue(plan(action("kv_read", {"key": "tooldata:kv_write:loot"}, id="r", store_result_as="x")))
    llm.responder = answers()
    finished(run_wake(env, "--force"), st)
    assert WALLET_PK not in json.dumps(llm.requests)


def test_a_direct_rename_out_of_secret_space_is_refused(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    store.put("secret:k", "v")
    kv = AgentKV(store)
    with pytest.raises(KVWriteRefused, match="never moved"):
        kv.rename("secret:k", "notes:k")
    kv.put("notes:a", "x")
    kv.rename("notes:a", "secret:a")  # into secret space is an ordinary write
    assert store.get("secret:k") == "v" and store.get("secret:a") == "x" and store.get("notes:k") is None
