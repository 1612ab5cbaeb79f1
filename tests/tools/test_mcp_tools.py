"""What is offered of the MCP servers' tools: names a model can carry, schemas that are schemas, the
listing recorded once per server, and why a tool is not offered, in one line."""

from __future__ import annotations

from brainstem.core.errors import ConfigError
from brainstem.core.untrusted import Untrusted
from brainstem.tools.mcp_client import Listing
from brainstem.tools.mcp_tools import call, catalog, prompt_entries
from brainstem.tools.policy import ToolPolicy

NO_RECORD = lambda *a, **k: None  # noqa: E731
GOOD = {"name": "get_time", "description": "The time.", "input": {"type": "object", "properties": {}}}


class Source:
    names = ["clock", "down"]

    def __init__(self):
        self.calls = []

    def list_all(self, timeout):
        return {"clock": Listing("clock", tools=[GOOD, {**GOOD, "name": "x" * 80},
                                                 {**GOOD, "name": "bad_schema", "input": {"type": "string"}},
                                                 {**GOOD, "name": "has space"}]),
                "down": Listing("down", error="could not be started: FileNotFoundError")}

    def list_tools(self, server, timeout):
        return self.list_all(timeout).get(server) or Listing(server, error="no such server")

    def timeout_of(self, server):
        return 5.0

    def call_tool(self, server, tool, args, timeout):
        self.calls.append((server, tool, args, timeout))
        from brainstem.tools.mcp_client import CallResult
        return CallResult(True, value="ok")


def test_only_what_a_model_can_carry_is_offered_and_the_listing_is_recorded_once():
    source, recorded = Source(), []
    policy = ToolPolicy(mcp_replay=source)
    found = catalog(policy, lambda event, **f: recorded.append((event, f)), timeout=5)
    assert list(found.tools) == ["mcp__clock__get_time"]
    assert found.tools["mcp__clock__get_time"].spec()["function"]["parameters"] == GOOD["input"]
    assert "64" in found.why_not("mcp__clock__" + "x" * 80)
    assert "not offered" in found.why_not("mcp__clock__bad_schema")
    assert "offers no tool 'nope'" in found.why_not("mcp__clock__nope")
    assert "unavailable" in found.why_not("mcp__down__anything")
    assert "no MCP server 'ghost'" in found.why_not("mcp__ghost__anything")
    catalog(policy, lambda event, **f: recorded.append((event, f)), timeout=5)
    assert sorted(f["server"] for _, f in recorded) == ["clock", "down"]  # once per server and session
    entry = prompt_entries(found)["mcp__clock__get_time"]
    assert isinstance(entry, Untrusted) and entry.source == "mcp:clock"  # the server's text, marked


def test_a_call_gets_no_more_time_than_its_server_allows():
    source = Source()
    policy = ToolPolicy(mcp_replay=source)
    assert call(policy, NO_RECORD, "mcp__clock__get_time", {}, 100.0).ok
    [(server, tool, args, timeout)] = source.calls
    assert (server, tool, args) == ("clock", "get_time", {}) and 4.9 < timeout <= 5.0
    assert not call(policy, NO_RECORD, "mcp__clock__get_time", [1], 1.0).ok  # an input that is not an object
    assert not call(policy, NO_RECORD, "kv_read", {}, 1.0).ok


def test_only_a_tool_offered_this_session_reaches_its_server():
    """Whatever names it (an action step, a reflex, a schedule): a tool its server did not list, listed
    under a name a function call cannot carry or with a schema that is not one, or of a server that is
    down or unknown, is refused, and the server is never asked."""
    source, recorded = Source(), []
    policy = ToolPolicy(mcp_replay=source)
    for name in ("mcp__clock__hidden", "mcp__clock__" + "x" * 80, "mcp__clock__bad_schema",
                 "mcp__clock__has space", "mcp__down__get_time", "mcp__nowhere__get_time"):
        out = call(policy, lambda event, **f: recorded.append(event), name, {}, 5.0)
        assert not out.ok and not out.retryable and "not offered" in out.error, (name, out)
    assert source.calls == []
    assert recorded.count("mcp_tools") == 3  # each server's listing once: clock, down and the unknown one


def test_a_bad_file_is_recorded_once_and_offers_nothing():
    def bad():
        raise ConfigError("BRAINSTEM_MCP_CONFIG: not valid JSON")

    recorded = []
    policy = ToolPolicy(mcp_config=bad)
    for _ in range(2):
        found = catalog(policy, lambda event, **f: recorded.append(event), timeout=5)
        assert not found.tools and "not valid JSON" in found.why_not("mcp__a__b")
    assert recorded == ["mcp_config_invalid"]
    assert "not valid JSON" in call(policy, NO_RECORD, "mcp__a__b", {}, 1.0).error
