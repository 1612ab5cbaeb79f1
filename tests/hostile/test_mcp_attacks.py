"""The operator's MCP servers against what a hostile server, or an agent steering one, could try: tools
that were never offered, answers past the write quotas, a child that leaves its group, its environment and
its parent, credentials inside longer values or echoed as numbers, and a server that never finishes its
handshake. Each runs a real server (tests/doubles/mcp_server.py, ``hostile`` mode) and asserts the property,
not one exploit's bytes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from brainstem.core.mcp_config import parse, secret_values
from brainstem.store import karma as karma_mod
from brainstem.store.karma import Redactor
from brainstem.tools.mcp_client import MCPServers
from tests.wake_helpers import answers, events_of, finished, plan, run_wake, seeded, wake_env

DOUBLE = str(Path(__file__).resolve().parent.parent / "doubles" / "mcp_server.py")


def hostile(**extra) -> dict:
    return {"command": sys.executable, "args": [DOUBLE, "hostile"], **extra}


def servers(**config) -> MCPServers:
    cfg = parse(json.dumps({"mcpServers": config}))
    return MCPServers(cfg, redact=Redactor(secret_values(cfg)))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def store(tmp_path):
    st = seeded(f"sqlite:///{tmp_path / 'store.db'}")
    yield st
    st.close()


def action(tool: str, input: dict, sid: str) -> dict:
    return {"type": "action", "id": sid, "tool": tool, "input": input}


@pytest.mark.slow
def test_only_tools_the_server_offered_run_from_an_action_step(store, tmp_path, llm):
    """A tool the server answers but does not list, one listed under a name no function call carries, and
    one whose schema is too large to offer: an action step naming any of them fails, and none ran."""
    marker = tmp_path / "called.txt"
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"h": hostile()}}))
    steps = [action(f"mcp__h__{t}", {"path": str(marker)}, f"s{i}")
             for i, t in enumerate(["hidden_touch", "bad.name", "big_schema"])]
    llm.responder = answers(lambda req: plan(*steps))
    sid, entries = finished(run_wake(wake_env(f"sqlite:///{tmp_path / 'store.db'}", llm,
                                              BRAINSTEM_MCP_CONFIG=str(config)), "--force"), store)
    assert not marker.exists()
    done = [e for e in events_of(entries, "tool_complete") if e.get("source") == "mcp"]
    assert len(done) >= 3 and all(not e["ok"] and "not offered" in e["error"] for e in done), done
    [listing] = events_of(entries, "mcp_tools")
    assert set(listing["skipped"]) == {"mcp__h__bad.name", "mcp__h__big_schema"}
    assert "mcp__h__hidden_touch" not in json.dumps(listing)


@pytest.mark.slow
def test_an_mcp_answer_counts_against_the_session_write_quota(store, tmp_path, llm):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"big": {"command": sys.executable, "args": [DOUBLE, "huge"]}}}))
    llm.responder = answers(lambda req: plan(action("mcp__big__big", {"n": 1}, "b1")))
    env = wake_env(f"sqlite:///{tmp_path / 'store.db'}", llm, BRAINSTEM_MCP_CONFIG=str(config),
                   BRAINSTEM_SESSION_WRITE_QUOTA="20000")
    sid, entries = finished(run_wake(env, "--force"), store)
    [done] = [e for e in events_of(entries, "tool_complete") if e.get("source") == "mcp"][:1]
    assert not done["ok"] and "quota_exceeded" in done["error"] and "BRAINSTEM_SESSION_WRITE_QUOTA" in done["error"]
    assert events_of(entries, "quota_exceeded")
    assert len(json.dumps(entries)) < 100_000  # the answer itself was not recorded


@pytest.mark.slow
def test_what_a_server_starts_ends_with_the_session_though_it_left_group_env_and_parent():
    s = servers(h=hostile())
    try:
        out = s.call_tool("h", "escape", {}, 30)
        assert out.ok, out
        pid = out.value["result"]
        assert alive(pid)  # the escape itself worked: a new session, an empty environment, init's child
    finally:
        s.close()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


CREDENTIALS = [  # (env, what the server is asked to echo): credentials inside longer values, or digits
    ({"DB_URL": "postgres://app:{v}@db.internal:5432/app"}, "DB_URL"),
    ({"DSN": "host=db user=app password={v} dbname=app"}, "DSN"),
    ({"PIN": "{n}"}, "PIN"),
]


@pytest.mark.slow
@pytest.mark.parametrize("env,name", CREDENTIALS)
def test_a_credential_echoed_back_is_recorded_the_same_whatever_its_value(env, name):
    """The same server, the same call, two different credentials: what the runtime keeps of the answer is
    the same, and holds neither."""
    seen = []
    for value, digits in (("Hunter2-a8f3k", "48213977150"), ("Tiger9-q7w2z", "90517733418")):
        given = {k: v.format(v=value, n=digits) for k, v in env.items()}
        s = servers(h=hostile(env=given))
        try:
            text = s.call_tool("h", "echo", {"name": name}, 30)
            number = s.call_tool("h", "number", {"name": name}, 30) if name == "PIN" else None
        finally:
            s.close()
        assert text.ok, text
        kept = json.dumps([text.value, number.value if number else None])
        assert value not in kept and digits not in kept
        seen.append(kept)
    assert seen[0] == seen[1]


@pytest.mark.slow
def test_listing_tools_takes_no_longer_than_the_servers_own_timeout():
    s = servers(deaf={"command": sys.executable, "args": [DOUBLE, "no-start"], "timeout": 1})
    try:
        t0 = time.monotonic()
        listed = s.list_all(30)
        assert listed["deaf"].error and time.monotonic() - t0 < 5
    finally:
        s.close()


def test_a_numeric_secret_is_redacted_as_a_number_too():
    redact = Redactor({"PIN": "48213977150"})
    entry = redact({"result": 48213977150, "list": [1, 48213977150.0], "ok": True, "n": 7})
    assert "48213977150" not in json.dumps(entry) and entry["n"] == 7 and entry["ok"] is True
    assert karma_mod.Redactor()({"n": 48213977150}) == {"n": 48213977150}
