"""MCP tools in whole sessions: ``brainstem wake`` with the operator's ``BRAINSTEM_MCP_CONFIG``, the real
``mcp-server-time`` from PyPI, an HTTP server on the SDK (tests/doubles/mcp_server.py) and the loopback
LLM double scripted to call them. Modes, dry runs, replay, the review inbox, a hanging server and the
secrets of the operator's file, which reach no prompt, karma entry or dashboard page."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brainstem.state import review
from brainstem.store import karma as karma_mod
from tests.helpers import free_port, one_line, run_cli
from tests.wake_helpers import answers, events_of, finished, plan, run_wake, seeded, wake_env

DOUBLE = str(Path(__file__).resolve().parent.parent / "doubles" / "mcp_server.py")
ENV_SECRET = "sk-mcp-env-secret-7c1e9a3f5b"
HEADER_SECRET = "hdr-secret-2b8d4f6a0c9e1357"
TIME = {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        "env": {"TIME_API_TOKEN": ENV_SECRET}}


def agent(tools, prompt: str = "What time is it in Paris?") -> dict:
    return {"type": "agent", "id": "a1", "prompt": prompt, "tools": list(tools), "store_result_as": "answer"}


def call(name: str, arguments: dict, call_id: str) -> dict:
    return {"name": name, "arguments": arguments, "id": call_id}


def action(tool: str, input: dict, sid: str = "act") -> dict:
    return {"type": "action", "id": sid, "tool": tool, "input": input, "store_result_as": "out"}


@pytest.fixture
def store(tmp_path):
    st = seeded(f"sqlite:///{tmp_path / 'store.db'}")
    yield st
    st.close()


@pytest.fixture
def mcp_file(tmp_path):
    """``write(**servers)`` writes the operator's MCP file and returns its path."""
    path = tmp_path / "mcp.json"

    def write(**servers) -> str:
        path.write_text(json.dumps({"mcpServers": servers}))
        return str(path)
    return write


@pytest.fixture
def web_server():
    """The SDK's streamable HTTP server on loopback (the double's ``http`` mode), once it answers."""
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, DOUBLE, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def url_of(store) -> str:
    return store.url if hasattr(store, "url") else store.display_url


@pytest.mark.slow
def test_an_agent_step_calls_real_mcp_servers_and_their_secrets_reach_nothing(store, tmp_path, llm, mcp_file,
                                                                              web_server, monkeypatch):
    config = mcp_file(time=TIME, web={"url": web_server, "headers": {"Authorization": f"Bearer {HEADER_SECRET}"}})
    llm.queue(plan(agent(["mcp__time__get_current_time", "mcp__web__header"])),
              {"tool_calls": [call("mcp__time__get_current_time", {"timezone": "Europe/Paris"}, "c1"),
                              call("mcp__web__header", {}, "c2")]},
              "It is afternoon in Paris.")
    llm.responder = answers()
    env = wake_env(f"sqlite:///{tmp_path / 'store.db'}", llm, BRAINSTEM_MCP_CONFIG=config)
    sid, entries = finished(run_wake(env, "--force"), store)

    # Orient was shown the servers' tools beside the agent's own, as the servers' (untrusted) text.
    orient = llm.requests[0]["messages"][-1]["content"]
    assert "mcp__time__get_current_time" in orient and "mcp__web__header" in orient
    # The agent step offered each with the schema its server lists, and the model's calls ran.
    offered = {t["function"]["name"]: t["function"] for t in llm.requests[1]["tools"]}
    assert offered["mcp__time__get_current_time"]["parameters"]["required"] == ["timezone"]
    replies = {m["tool_call_id"]: m["content"] for m in llm.requests[2]["messages"] if m.get("role") == "tool"}
    assert "Europe/Paris" in replies["c1"] and "UNTRUSTED CONTENT" in replies["c1"]
    assert "you sent [REDACTED:mcp:web:header" in replies["c2"]  # the server echoed its credential: redacted
    done = [e for e in events_of(entries, "step_complete") if e["step_id"] == "a1"]
    assert done and done[0]["result"] == "It is afternoon in Paris."

    # Karma: a tool_start/tool_complete pair with source mcp for each call, and what each server listed.
    completes = {e["tool"]: e for e in events_of(entries, "tool_complete") if e.get("source") == "mcp"}
    assert set(completes) == {"mcp__time__get_current_time", "mcp__web__header"}
    assert all(e["ok"] for e in completes.values())
    assert completes["mcp__time__get_current_time"]["result"]["timezone"] == "Europe/Paris"
    assert len([e for e in events_of(entries, "tool_start") if e.get("source") == "mcp"]) == 2
    listed = {e["server"]: e for e in events_of(entries, "mcp_tools")}
    assert set(listed) == {"time", "web"} and "mcp__time__get_current_time" in listed["time"]["offered"]

    # The secrets of the operator's file: in no karma entry, no request the LLM was sent, no dashboard page.
    everything = json.dumps(entries) + json.dumps(llm.requests)
    assert ENV_SECRET not in everything and HEADER_SECRET not in everything
    from tests.dashboard_client import app_for, client, dashboard_settings

    settings = dashboard_settings(monkeypatch, BRAINSTEM_KV=f"sqlite:///{tmp_path / 'store.db'}",
                                  BRAINSTEM_MCP_CONFIG=config)
    c = client(app_for(settings, store))
    for page in ("/", "/sessions", f"/sessions/{sid}", f"/api/karma?session={sid}", "/store", "/review"):
        body = c.get(page).text
        assert ENV_SECRET not in body and HEADER_SECRET not in body, page
    assert "mcp__time__get_current_time" in c.get(f"/sessions/{sid}").text

    # Replay answers from the recording: no server is asked, and it behaves the same.
    out = run_cli("replay", sid, env=env)
    assert out.returncode == 0 and "same behaviour" in out.stdout, (out.stdout, out.stderr)


@pytest.mark.slow
def test_modes_apply_by_name_and_a_dry_run_calls_none(store, tmp_path, llm, mcp_file):
    marker = tmp_path / "called.txt"
    config = mcp_file(probe={"command": sys.executable, "args": [DOUBLE, "probe"]})
    url = f"sqlite:///{tmp_path / 'store.db'}"
    touch = action("mcp__probe__touch", {"path": str(marker)})
    llm.responder = answers(lambda req: plan(touch))

    # manual: not called, and karma says what it would have done
    env = wake_env(url, llm, BRAINSTEM_MCP_CONFIG=config, BRAINSTEM_TOOL_MODES="mcp__probe__touch=manual")
    sid, entries = finished(run_wake(env, "--force"), store)
    would = events_of(entries, "tool_would_do")
    assert [(e["tool"], e["reason"], e["source"]) for e in would] == [("mcp__probe__touch", "manual", "mcp")]
    assert not [e for e in events_of(entries, "tool_start") if e.get("source") == "mcp"] and not marker.exists()

    # a dry run: none is called (* makes every tool manual otherwise; the dry run holds back even automated)
    env = wake_env(url, llm, BRAINSTEM_MCP_CONFIG=config)
    dry = run_wake(env, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    dry_entries = karma_mod.read(store, karma_mod.latest_session_id(store))
    assert [e["reason"] for e in events_of(dry_entries, "tool_would_do")] == ["dry_run"] and not marker.exists()

    # * applies to MCP tools too: supervised runs it and queues it for review
    env = wake_env(url, llm, BRAINSTEM_MCP_CONFIG=config, BRAINSTEM_TOOL_MODES="*=supervised")
    sid, entries = finished(run_wake(env, "--force"), store)
    assert marker.read_text() == "called\n"
    queued = [i for i in review.items(store) if i["tool"] == "mcp__probe__touch"]
    assert len(queued) == 1 and queued[0]["session_id"] == sid and events_of(entries, "review_queued")


@pytest.mark.slow
def test_a_hanging_server_ends_honestly_within_the_sessions_time(store, tmp_path, llm, mcp_file):
    config = mcp_file(hang={"command": sys.executable, "args": [DOUBLE, "hang"]})
    llm.responder = answers(lambda req: plan(action("mcp__hang__wait", {})))
    env = wake_env(f"sqlite:///{tmp_path / 'store.db'}", llm, BRAINSTEM_MCP_CONFIG=config,
                   BRAINSTEM_MAX_SESSION_SECONDS="8")
    t0 = time.monotonic()
    sid, entries = finished(run_wake(env, "--force"), store)
    assert time.monotonic() - t0 < 8 + 8  # the session's time, and the server's bounded shutdown
    done = [e for e in events_of(entries, "tool_complete") if e.get("source") == "mcp"]
    assert done and all(not e["ok"] for e in done) and "no answer" in done[0]["error"], [e["error"] for e in done]
    failed = [e for e in events_of(entries, "step_failed") if e.get("step_id") == "act"]
    assert failed and "mcp__hang__wait" in failed[0]["error"]


@pytest.mark.slow
def test_a_bad_mcp_file_is_one_line_and_a_karma_event_once_the_wake_runs(store, tmp_path, llm, mcp_file):
    path = Path(mcp_file(time=TIME))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    path.write_text('{"mcpServers": {"time": {"comand": "mcp-server-time"}}}')
    r = run_wake(wake_env(url, llm, BRAINSTEM_MCP_CONFIG=str(path)), "--force")
    assert r.returncode == 2 and "BRAINSTEM_MCP_CONFIG" in one_line(r.stderr)

    # Good at startup, bad by the time the session reads it (a daemon's later session): recorded, and the
    # step that names an MCP tool fails saying why; the session goes on.
    from brainstem.core.settings import load_settings
    from brainstem.session.wake import wake

    path.write_text(json.dumps({"mcpServers": {"time": TIME}}))
    settings = load_settings(kv=url, openrouter_base_url=llm.base_url, openrouter_api_key="sk-or-test",
                             mcp_config=str(path), llm_backoff=0.01)
    path.write_text("{not json")
    llm.responder = answers(lambda req: plan(agent(["mcp__time__get_current_time"])))
    wake(settings, store, force=True)
    sid = karma_mod.latest_session_id(store)
    entries = karma_mod.read(store, sid)
    invalid = events_of(entries, "mcp_config_invalid")
    assert len(invalid) == 1 and "not valid JSON" in invalid[0]["error"]
    failed = [e for e in events_of(entries, "step_failed") if e.get("step_id") == "a1"]
    assert failed and "cannot be offered" in failed[0]["error"] and "not valid JSON" in failed[0]["error"]
    assert entries[-1]["event"] == "session_end"


@pytest.mark.slow
def test_a_schedule_runs_an_mcp_tool_and_the_operator_adds_it_checked_against_its_schema(store, tmp_path, llm,
                                                                                       mcp_file):
    from brainstem.core.settings import load_settings
    from brainstem.session.schedule_run import run_due
    from brainstem.state import inbox

    config = mcp_file(time=TIME)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {"BRAINSTEM_KV": url, "BRAINSTEM_MCP_CONFIG": config}
    bad = run_cli("schedule", "add", "mcp__time__get_current_time", "--input", '{"zone": "UTC"}', "--every", "1h",
                  env=env)
    assert bad.returncode == 2 and "timezone" in one_line(bad.stderr)
    missing = run_cli("schedule", "add", "mcp__time__nope", "--input", "{}", "--every", "1h", env=env)
    assert missing.returncode == 2 and "offers no tool 'nope'" in one_line(missing.stderr)
    added = run_cli("schedule", "add", "mcp__time__get_current_time", "--input", '{"timezone": "Asia/Tokyo"}',
                    "--every", "1h", "--notify", "inbox", "--id", "tokyo", env=env)
    assert added.returncode == 0, added.stderr
    from brainstem.state.schedules import load

    schedule = load(store, "tokyo")
    store.put(f"schedule:{schedule.id}", {**json.loads(store.get(f"schedule:{schedule.id}")),
                                          "next_run": "2000-01-01T00:00:00Z"})
    [result] = run_due(load_settings(kv=url, mcp_config=config), store)
    entries = karma_mod.read(store, result.run_id)
    assert result.outcome == "ok", entries
    done = events_of(entries, "tool_complete")
    assert done[0]["source"] == "mcp" and done[0]["result"]["timezone"] == "Asia/Tokyo"
    assert "Asia/Tokyo" in inbox.messages(store)[-1]["text"] and ENV_SECRET not in json.dumps(entries)
