"""Secret bindings: parsing the operator's list, what a tool is granted, and substitution on the wire."""

from __future__ import annotations

import base64
import json

import pytest

from brainstem.errors import ConfigError
from brainstem.kv.guarded import AgentKV
from brainstem.kv.sqlite_store import SQLiteStore
from brainstem.secrets import grant, parse_bindings, placeholder_for
from brainstem.tools import ToolMeta, ToolPolicy, ToolServices

from .sandbox.hostile import Host

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
                                ToolPolicy(bindings=parse_bindings(["TOKEN@127.0.0.1"], LLM), fetch_allow=["127.0.0.1"]))
        ph = services.secrets["TOKEN"]
        basic = base64.b64encode(f"user:{ph}".encode()).decode()
        services.fetch(host.base + "/p/" + ph + "?q=" + ph, method="POST", json={"k": ph, "n": [ph]},
                       headers={"X-Key": ph, "Authorization": "Basic " + basic})
        services.fetch(host.base + "/form", method="POST", data={"k": ph})
        (first, second) = host.seen
        head, _, body = first.partition(b"\n\n\r\n")
        assert json.loads(body) == {"k": value, "n": [value]}  # JSON-escaped, so the body stays JSON
        assert f"X-Key: {value}".encode() in head
        assert base64.b64encode(f"user:{value}".encode()) in head  # inside Basic auth too
        assert b"/p/tok%22en%2Fwith:odd&chars-0123?q=" in head  # quoted as a path segment
        assert b"k=tok%22en%2Fwith%3Aodd%26chars-0123" in second  # form-encoded
        assert ph.encode() not in first + second
        fetches = [f for e, f in events if e == "fetch"]
        assert [f["secrets"] for f in fetches] == [["TOKEN"], ["TOKEN"]]
        assert value not in json.dumps(fetches)
        store.close()
    finally:
        host.close()
