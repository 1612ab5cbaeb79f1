"""The operator's MCP file: the shape MCP clients share, checked whole; a bad one is one line."""

from __future__ import annotations

import json

import pytest

from brainstem.core.errors import ConfigError
from brainstem.core.mcp_config import HTTPServer, StdioServer, load_servers, parse, secret_values, split, tool_name


def test_the_shared_shape_parses_stdio_and_http_servers():
    cfg = parse(json.dumps({"mcpServers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "env": {"TZ_TOKEN": "x" * 12}},
        "docs": {"type": "http", "url": "https://mcp.example.org/mcp",
                 "headers": {"Authorization": "Bearer abcdefgh12"}},
        "off": {"command": "never", "disabled": True}}}))
    assert isinstance(cfg.servers["time"], StdioServer) and cfg.servers["time"].args == ["--local-timezone", "UTC"]
    assert isinstance(cfg.servers["docs"], HTTPServer) and cfg.servers["docs"].timeout == 60
    assert sorted(cfg.enabled) == ["docs", "time"]
    # Every env and header value is a secret, and a Bearer's credentials on their own too.
    assert secret_values(cfg) == {"mcp:time:env:TZ_TOKEN": "x" * 12,
                                  "mcp:docs:header:Authorization": "Bearer abcdefgh12",
                                  "mcp:docs:header:Authorization:credentials": "abcdefgh12"}


@pytest.mark.parametrize("text, says", [
    ("{", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ('{"servers": {}}', "must be a JSON object"),
    ('{"mcpServers": {"a__b": {"command": "x"}}}', "server name 'a__b'"),
    ('{"mcpServers": {"a": {"command": "x", "evn": {}}}}', "mcpServers.a.evn: Extra inputs are not permitted"),
    ('{"mcpServers": {"a": {"url": "ftp://x"}}}', "mcpServers.a.url: must be an http(s) URL"),
    ('{"mcpServers": {"a": {"command": "x", "env": {"K": 3}}}}', "mcpServers.a.env.K"),
    ('{"mcpServers": {"a": {"command": "x", "url": "https://x"}}}', "give either command"),
    ('{"mcpServers": {"a": "mcp-server-time"}}', "give either command"),
])
def test_a_bad_file_is_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(ConfigError) as exc:
        parse(text)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_servers(str(tmp_path / "nope.json"))


def test_names_split_one_way():
    assert tool_name("time", "get_current_time") == "mcp__time__get_current_time"
    assert split("mcp__time__get_current_time") == ("time", "get_current_time")
    assert split("mcp__my_server__do__it") == ("my_server", "do__it")
    assert split("mcp__x") is None and split("kv_read") is None


def test_settings_read_the_file_again_when_it_changes_and_know_its_secrets(tmp_path, monkeypatch):
    from brainstem.core.settings import load_settings

    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "x", "env": {"A_TOKEN": "first-secret-1"}}}}))
    settings = load_settings(mcp_config=str(path))
    assert settings.known_secrets()["mcp:a:env:A_TOKEN"] == "first-secret-1"
    path.write_text(json.dumps({"mcpServers": {"b": {"url": "https://x/mcp", "headers": {"X-Key": "second-secret"}}}}))
    assert list(settings.mcp_servers().servers) == ["b"]
    assert settings.known_secrets()["mcp:b:header:X-Key"] == "second-secret"
    path.write_text("{")
    with pytest.raises(ConfigError):
        settings.mcp_servers()
    assert not any(k.startswith("mcp:") for k in settings.known_secrets())
    with pytest.raises(ConfigError, match="BRAINSTEM_MCP_CONFIG"):  # at startup: one line, as any setting
        load_settings(mcp_config=str(path))
