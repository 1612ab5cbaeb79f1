"""``brainstem mcp`` driven by the MCP SDK's own stdio client: the server is the real command, started as an
assistant would start it, over a seeded store."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import anyio
import pytest

from brainstem.core import keys
from brainstem.state import review
from brainstem.state.seed import example_soul_path, seed
from brainstem.store import karma, open_store

pytestmark = pytest.mark.slow

LLM_KEY = "sk-or-v1-mcp-view-5d0e91c7a3f24b86"
STORED = "operator-stored-token-77f1"


@pytest.fixture
def store_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url) as st:
        seed(st, soul_file=example_soul_path())
        st.put(keys.secret("vault"), STORED)
        # A session whose karma quotes the LLM key and the stored secret (a leak the view must not repeat).
        karma.Karma(st, "1-abcdef").record("note", text=f"saw {LLM_KEY} and {STORED}")
        review.add(st, tool="send", session_id="1-abcdef", step_id="a", input={"to": "x"}, ok=True, result="sent",
                   error=None)
    return url


def _session(url: str, *args: str):
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), "BRAINSTEM_KV": url,
           "OPENROUTER_API_KEY": LLM_KEY}
    params = StdioServerParameters(command=sys.executable, args=["-m", "brainstem", "mcp", *args], env=env)
    # Its stderr to a file: under pytest's capture sys.stderr has no file descriptor to hand the server.
    return stdio_client(params, errlog=tempfile.TemporaryFile("w+")), ClientSession  # noqa: SIM115


def _run(url: str, calls, *args: str) -> dict:
    """Start the server, list its tools, make ``calls`` ((name, arguments) each); their texts by name."""
    async def go():
        transport, ClientSession = _session(url, *args)
        with anyio.fail_after(60):
            return await talk(transport, ClientSession)

    async def talk(transport, ClientSession):
        async with transport as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            listed = sorted(t.name for t in (await s.list_tools()).tools)
            out = {"tools": listed}
            for name, arguments in calls:
                r = await s.call_tool(name, arguments)
                out[name] = ("error" if r.is_error else "ok",
                             "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text"))
            return out
    return anyio.run(go)


def test_tools_list_and_status_from_the_sdk_client(store_url):
    out = _run(store_url, [("status", {}), ("karma", {"session": "1-abcdef"}), ("pending_review", {})])
    assert out["tools"] == ["inbox_messages", "karma", "pending_review", "sessions", "status", "tell"]
    ok, text = out["status"]
    assert ok == "ok" and json.loads(text)["soul_present"]
    ok, text = out["karma"]
    assert ok == "ok" and "1-abcdef" in text
    assert LLM_KEY not in text and STORED not in text  # redacted as on the dashboard
    assert "[REDACTED:OPENROUTER_API_KEY]" in text and "[REDACTED:secret:vault]" in text
    assert '"tool": "send"' in out["pending_review"][1] or '"send"' in out["pending_review"][1]


def test_an_unknown_session_is_a_one_line_error_for_the_assistant(store_url):
    out = _run(store_url, [("karma", {"session": "99"})])
    assert out["karma"][0] == "error" and "no session '99'" in out["karma"][1]


def test_tell_reaches_the_agents_inbox(store_url):
    out = _run(store_url, [("tell", {"text": "check the wallet", "urgent": True}), ("inbox_messages", {})])
    assert out["tell"][0] == "ok" and "check the wallet" in out["inbox_messages"][1]
    with open_store(store_url) as st:
        from brainstem.state import inbox

        (msg,) = inbox.messages(st)
        assert msg["text"] == "check the wallet" and msg["from"] == "operator" and msg["urgent"] is True


def test_settling_a_review_item_needs_the_flag(store_url):
    out = _run(store_url, [("settle_review", {"item_id": "1", "confirm": True})])
    assert "settle_review" not in out["tools"] and out["settle_review"][0] == "error"
    with open_store(store_url) as st:
        assert review.get(st, "1")["status"] == "pending"
    out = _run(store_url, [("settle_review", {"item_id": "1", "confirm": True})], "--allow-settle")
    assert "settle_review" in out["tools"] and out["settle_review"][0] == "ok"
    with open_store(store_url) as st:
        assert review.get(st, "1")["status"] == "confirmed"
