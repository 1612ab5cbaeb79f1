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
the agent), and so is a credential inside one of them, an argument or the URL (a URL's password, a
``password=...`` pair, a query's ``token``: :func:`credentials_in`).
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

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
MIN_PIECE_CHARS = 6  # a credential named as one (a URL's password, password=...) counts from here
# The names under which a value inside a longer one (a DSN's pairs, a URL's query) is a credential.
CREDENTIAL_NAME = re.compile(r"(?i)(pass(word|wd|phrase)?|pwd|secret|token|key|auth\w*|credentials?|sig(nature)?)\Z")
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
PAIR_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9_.-]*)\s*[=:]\s*(?:'([^']*)'|\"([^\"]*)\"|([^\s;&,'\"]+))")


def secret_values(config: MCPConfig) -> dict[str, str]:
    """The operator's file's secrets, by a label naming where each sits: every value of every server's
    ``env`` and ``headers`` (values under :data:`MIN_SECRET_CHARS` left out), and the credentials held
    inside those values, the ``args`` and the ``url`` (:func:`credentials_in`)."""
    out: dict[str, str] = {}
    for name, server in config.servers.items():
        if isinstance(server, StdioServer):
            kind, found, plain = "env", server.env, {f"arg{i}": a for i, a in enumerate(server.args)}
        else:
            kind, found, plain = "header", server.headers, {"url": server.url}
        for key, value in found.items():
            label = f"mcp:{name}:{kind}:{key}"
            if len(value) >= MIN_SECRET_CHARS:
                out[label] = value
            out.update({f"{label}:{piece}": v for piece, v in credentials_in(value)})
        for key, value in plain.items():
            out.update({f"mcp:{name}:{key}:{piece}": v for piece, v in credentials_in(value)})
        if isinstance(server, StdioServer):  # --token VALUE: the argument after a credential's flag
            for i, (flag, value) in enumerate(zip(server.args, server.args[1:], strict=False)):
                named = re.fullmatch(r"-{1,2}([A-Za-z][A-Za-z0-9_.-]*)", flag)
                if named and CREDENTIAL_NAME.search(re.split(r"[_.-]", named.group(1))[-1]) \
                        and len(value) >= MIN_PIECE_CHARS:
                    out[f"mcp:{name}:arg{i + 1}"] = value
    return out


def credentials_in(text: str) -> list[tuple[str, str]]:
    """The credentials inside ``text``, (what, value): the password and ``user:password`` of a URL's
    userinfo, a URL query's or a ``key=value`` / ``key: value`` pair's value under a credential's name
    (:data:`CREDENTIAL_NAME`), and the credentials of an ``Authorization``-style ``SCHEME CREDENTIALS``
    value (decoded, for ``Basic``). Values under :data:`MIN_PIECE_CHARS` are left out."""
    found: list[tuple[str, str]] = []
    for m in URL_IN_TEXT.finditer(text):
        try:
            parts = urlsplit(m.group(0))
            password, user = parts.password, parts.username
        except ValueError:
            continue
        if password:
            found += [("password", unquote(password)), ("password_quoted", password),
                      ("userinfo", f"{unquote(user or '')}:{unquote(password)}")]
        found += [(k, v) for k, v in parse_qsl(parts.query) if CREDENTIAL_NAME.search(k.split("_")[-1])]
    for m in PAIR_IN_TEXT.finditer(text):
        key, value = m.group(1), next(g for g in m.groups()[1:] if g is not None)
        if CREDENTIAL_NAME.search(re.split(r"[_.-]", key)[-1]) and not value.startswith("//"):
            found.append((key, value))
    scheme, _, given = text.strip().partition(" ")
    if given.strip() and scheme.isalpha() and " " not in given.strip():
        found.append(("credentials", given.strip()))
        if scheme.lower() == "basic":
            try:
                pair = base64.b64decode(given.strip(), validate=True).decode("utf-8")
            except (ValueError, UnicodeError):
                pair = ""
            if ":" in pair:
                found += [("userinfo", pair), ("password", pair.partition(":")[2])]
    return [(what, value) for what, value in found if len(value) >= MIN_PIECE_CHARS]


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
