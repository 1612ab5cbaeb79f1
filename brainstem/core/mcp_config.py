"""The operator's MCP servers: the file ``BRAINSTEM_MCP_CONFIG`` names, in the shape MCP clients share.

::

    {"mcpServers": {
        "time":  {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"]},
        "notes": {"command": "notes-mcp", "env": {"NOTES_TOKEN": "..."}},
        "docs":  {"url": "https://mcp.example.org/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A server with ``command`` runs on this host over stdio; one with ``url`` is reached over streamable
HTTP. Its tools are offered to the agent as ``mcp__SERVER__TOOL``. The file is the operator's, never
the store's: nothing the agent writes adds, changes or lists a server. Every value of a server's
``env`` and ``headers`` is treated as a secret (redacted wherever the runtime redacts, never shown to
the agent); what is not secret belongs in ``args`` or the URL.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from brainstem.core.errors import ConfigError

PREFIX = "mcp__"
SEP = "__"
# A server's name: letters, digits and '-' in runs joined by single '_', so mcp__SERVER__TOOL splits one way.
SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*\Z")
MAX_SERVER_NAME = 32
DEFAULT_TIMEOUT = 60.0  # seconds one call (connecting included) may take, never past the session's time left
MAX_FILE_BYTES = 1024 * 1024


class _Server(BaseModel):
    model_config = ConfigDict(extra="forbid")
    disabled: bool = False
    timeout: float = Field(DEFAULT_TIMEOUT, gt=0, le=3600)
    description: str = ""


class StdioServer(_Server):
    """A server the runtime starts on this host and talks to over its stdin and stdout."""
    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None


class HTTPServer(_Server):
    """A server reached over streamable HTTP at ``url``."""
    type: Literal["http", "streamable-http", "streamableHttp"] = "http"
    url: str = Field(min_length=1)
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.match(r"https?://[^/\s]+", v):
            raise ValueError("must be an http(s) URL")
        return v


class MCPConfig(BaseModel):
    """The servers by name (``mcpServers`` in the file)."""
    servers: dict[str, StdioServer | HTTPServer] = Field(default_factory=dict)

    @property
    def enabled(self) -> dict[str, StdioServer | HTTPServer]:
        return {name: s for name, s in self.servers.items() if not s.disabled}


NO_SERVERS = MCPConfig()


def parse(text: str, where: str = "BRAINSTEM_MCP_CONFIG") -> MCPConfig:
    """The configuration in ``text``; a bad one is a one-line :class:`ConfigError` naming what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict) or set(data) - {"mcpServers"}:
        raise ConfigError(f'{where}: must be a JSON object {{"mcpServers": {{NAME: {{...}}, ...}}}}')
    servers: dict[str, StdioServer | HTTPServer] = {}
    for name, body in data.get("mcpServers", {}).items():
        if len(name) > MAX_SERVER_NAME or not SERVER_NAME.match(name):
            raise ConfigError(f"{where}: server name {name[:40]!r} must be letters, digits, '-' and single '_' "
                              f"(at most {MAX_SERVER_NAME}), so mcp__NAME__TOOL reads one way")
        if not isinstance(body, dict) or ("command" in body) == ("url" in body):
            raise ConfigError(f"{where}: mcpServers.{name}: give either command (a stdio server) or url "
                              "(an HTTP server)")
        kind: type[StdioServer] | type[HTTPServer] = StdioServer if "command" in body else HTTPServer
        try:
            servers[name] = kind.model_validate(body)
        except ValidationError as exc:
            e = exc.errors()[0]
            field = ".".join(str(p) for p in e["loc"])
            msg = str(e["msg"]).removeprefix("Value error, ")
            raise ConfigError(f"{where}: mcpServers.{name}.{field}: {msg}"[:300]) from None
    return MCPConfig(servers=servers)


def load_servers(path: str) -> MCPConfig:
    """The configuration in the file at ``path`` (:func:`parse`)."""
    where = f"BRAINSTEM_MCP_CONFIG ({path})"
    try:
        p = Path(path).expanduser()
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except ConfigError:
        raise
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"{where}: cannot be read ({type(exc).__name__}: {exc.args[-1] if exc.args else exc})") \
            from None
    return parse(text, where)


MIN_SECRET_CHARS = 8  # shorter values ("1", "info") would be found in ordinary text


def secret_values(config: MCPConfig) -> dict[str, str]:
    """Every value of every server's ``env`` and ``headers`` (and the credentials of an ``Authorization:
    Bearer ...`` value on their own), by a label naming where it sits; values under
    :data:`MIN_SECRET_CHARS` are left out."""
    out: dict[str, str] = {}
    for name, server in config.servers.items():
        kind = "env" if isinstance(server, StdioServer) else "header"
        found = server.env if isinstance(server, StdioServer) else server.headers
        for key, value in found.items():
            label = f"mcp:{name}:{kind}:{key}"
            scheme, _, credentials = value.strip().partition(" ")
            if credentials.strip() and scheme.isalpha() and len(credentials.strip()) >= MIN_SECRET_CHARS:
                out[label + ":credentials"] = credentials.strip()
            if len(value) >= MIN_SECRET_CHARS:
                out[label] = value
    return out


# --- the names the agent sees ---

def is_mcp(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def tool_name(server: str, tool: str) -> str:
    return f"{PREFIX}{server}{SEP}{tool}"


def split(name: str) -> tuple[str, str] | None:
    """(server, tool) of ``mcp__SERVER__TOOL``; None when it is not such a name."""
    if not is_mcp(name):
        return None
    server, sep, tool = name[len(PREFIX):].partition(SEP)
    if not sep or not tool or not SERVER_NAME.match(server):
        return None
    return server, tool
