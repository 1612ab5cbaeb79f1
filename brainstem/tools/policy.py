"""What the operator allows code from the store: the secrets it may be granted and where they may
go, the private hosts it may fetch, the LLM requests it may make, what it may write, and the chat
it may send to (through the runtime: the bot token is never code's).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from brainstem.core import events
from brainstem.core.errors import BrainstemError
from brainstem.core.mcp_config import secret_values
from brainstem.core.scrubber import Scrubber
from brainstem.core.secrets import NEVER_GRANTED, Binding, placeholder_for
from brainstem.llm.meter import WireMeter
from brainstem.sandbox.egress import one_form
from brainstem.state.budget import Budget, DailyLedger, daily_spent
from brainstem.state.config import effective_models, operator_models
from brainstem.store.base import Store
from brainstem.store.karma import Redactor
from brainstem.tools.bot_api import ClientConfig

_QUOTA_LOCK = threading.Lock()


class QuotaExceeded(Exception):
    """A tool write would pass the operator's write quota (message for the tool)."""


@dataclass
class ToolPolicy:
    """What the operator allows every run of code from the store, in one process or session.

    ``bindings`` decide which secrets a meta may be granted and where they may go, ``fetch_allow``
    which private hosts fetch may reach, ``meter`` (a :class:`~brainstem.llm.meter.WireMeter`)
    prices and charges requests to the LLM host, and the quotas bound what tools write.
    ``on_secrets`` is told the values granted (label -> value), so karma can redact them.
    ``telegram`` is how the runtime sends for ``ctx.send_telegram`` (the bot token and the operator's
    chat), or None when Telegram is not configured; code never holds it.
    """

    bindings: Mapping[str, Binding] = field(default_factory=dict)
    fetch_allow: list[str] = field(default_factory=list)
    public: Mapping[str, str | None] = field(default_factory=dict)
    meter: Any = None
    # Replay: answers each fetch from the recording (``answer(tool, method, url) -> dict``) instead of the world.
    fetch_replay: Any = None
    tool_write_quota: int = 10 * 1024 * 1024
    session_write_quota: int = 50 * 1024 * 1024
    # Shared by every copy of the policy (dataclasses.replace), so all code of one session counts once.
    session_written: list[int] = field(default_factory=lambda: [0])
    on_secrets: Callable[[dict[str, str]], None] | None = None
    # Every secret value this process holds (label -> value), granted or not: the scrubber knows them all.
    known_secrets: Mapping[str, str] = field(default_factory=dict)
    # The bound environment secrets' values by name (the LLM key under either of its names); None: read the
    # environment when a tool asks.
    secret_values: Mapping[str, str] | None = None
    # Set (shared, like session_written) at a secret_refused stop: no more code of this session runs, even
    # if the store could not take the hold that stops the agent's code for good (see brainstem.state.refusals).
    withdrawn: dict[str, Any] = field(default_factory=dict)
    # Shared like session_written: the addresses a secret was sent to in this session, and those of every
    # bound host (resolved once). An answer from them is sealed (brainstem.sandbox.fetch.Hop.sealed): the
    # server may hand back what it was sent, to any later request of any code, however the host is spelled.
    sealed_addresses: set[str] = field(default_factory=set)
    _bound_resolved: list[bool] = field(default_factory=lambda: [False])

    def sealed(self, host: str, ip: str) -> bool:
        """Whether an answer from ``host`` at ``ip`` is to be taken only as sealed."""
        if not self._bound_resolved[0]:
            self._bound_resolved[0] = True
            self.sealed_addresses.update(_addresses(h for b in self.bindings.values() for h in b.hosts))
        return one_form(ip) in self.sealed_addresses or any(host in b.hosts for b in self.bindings.values())

    def seal(self, ip: str) -> None:
        """``ip`` was sent a secret: its answers are sealed for the rest of the session."""
        self.sealed_addresses.add(one_form(ip))
    telegram: ClientConfig | None = None
    # The operator's MCP servers (read on first use: settings.mcp_servers), or, in a replay, the recording
    # answering in their place; ``_mcp`` is shared like session_written, so every copy uses one set of them.
    mcp_config: Callable[[], Any] | None = None
    mcp_replay: Any = None
    _mcp: dict[str, Any] = field(default_factory=dict)

    def charge(self, record: Callable[..., Any], tool: str, used: int, key: str, size: int) -> int:
        """Count ``size`` bytes that ``tool`` writes to ``key`` (or that karma records for it) against the
        write quotas, per call (``used`` so far) and per session; the call's new count, or
        :class:`QuotaExceeded` (recorded ``quota_exceeded``) when it would pass one."""
        with _QUOTA_LOCK:  # an agent step runs tools side by side: the session's count is checked and added at once
            if used + size > self.tool_write_quota:
                limit, written, which = self.tool_write_quota, used, "BRAINSTEM_TOOL_WRITE_QUOTA, per tool call"
            elif self.session_written[0] + size > self.session_write_quota:
                limit, written = self.session_write_quota, self.session_written[0]
                which = "BRAINSTEM_SESSION_WRITE_QUOTA, per session"
            else:
                self.session_written[0] += size
                return used + size
        record(events.QUOTA_EXCEEDED, tool=tool, key=key, bytes=size, written=written, quota=limit)
        raise QuotaExceeded(f"write quota exceeded: writing {size} bytes to {key} would pass {limit} bytes "
                            f"({which}; {written} written so far)")

    def mcp(self) -> Any:
        """The MCP servers of this session (:class:`~brainstem.tools.mcp_client.MCPServers`, started on first
        use), the replay's recording of them, or None when there are none; :class:`ConfigError` when the
        operator's file is bad."""
        if self.mcp_replay is not None:
            return self.mcp_replay
        if "servers" not in self._mcp:
            config = self.mcp_config() if self.mcp_config is not None else None
            if config is None or not config.enabled:
                self._mcp["servers"] = None
            else:
                from brainstem.tools.mcp_client import MCPServers  # noqa: PLC0415 -- only where servers are set

                redact = Redactor({**self.known_secrets, **secret_values(config)})
                self._mcp["servers"] = MCPServers(config, redact=redact)
        return self._mcp["servers"]

    def mcp_noted(self, key: str) -> bool:
        """True the first time ``key`` asks (per session): what is recorded once a session."""
        noted = self._mcp.setdefault("noted", set())
        if key in noted:
            return False
        noted.add(key)
        return True

    def close(self) -> None:
        """End what this session started outside the sandbox: its MCP servers."""
        servers = self._mcp.get("servers")
        if servers is not None:
            servers.close()

    @property
    def withheld(self) -> frozenset[str]:
        """Values no code is ever granted, whatever the bindings (a store secret holding the same bytes
        included): the bot token; code asks the runtime to send instead, with ``ctx.send_telegram``."""
        return frozenset(v for k, v in self.known_secrets.items() if k in NEVER_GRANTED and v)

    @classmethod
    def from_settings(cls, settings: Any, **kwargs: Any) -> ToolPolicy:
        return cls(bindings=settings.bindings(), fetch_allow=list(settings.fetch_allow),
                   public=settings.public_settings(), tool_write_quota=settings.tool_write_quota,
                   session_write_quota=settings.session_write_quota, known_secrets=settings.known_secrets(),
                   secret_values=settings.allowed_secret_values(),
                   telegram=ClientConfig.from_settings(settings), mcp_config=settings.mcp_servers, **kwargs)

    def scrubber(self, store: Store, granted: Mapping[str, str] | None = None) -> Scrubber:
        """The one scrubber of what passes between the runtime and the agent's text: every secret value
        this process holds (and ``granted``, label -> value), the placeholders never taken for a piece."""
        held = {**self.held_secrets(store), **(granted or {})}
        return Scrubber(held, opaque=map(placeholder_for, held))

    def held_secrets(self, store: Store) -> dict[str, str]:
        """Every secret value the runtime holds: the settings' and each bound ``secret:*`` key's."""
        out = dict(self.known_secrets)
        for label, binding in self.bindings.items():
            if binding.from_store and label not in out:
                try:
                    value = store.get(label)
                except BrainstemError:
                    continue  # not text: it cannot be granted either
                if isinstance(value, str) and value:
                    out[label] = value
        return out


def standalone_tool_policy(store: Store, settings: Any, record: Callable[..., Any],
                           on_secrets: Callable[[dict[str, str]], None] | None = None) -> ToolPolicy:
    """The policy of a tool run outside a session (``brainstem tool run``): the same grants, and LLM
    requests metered under one session's ceiling and today's (each held against today's in the store
    before it goes, so tool runs at once cannot pass it together), priced at no less than the operator's."""
    left_today = max(0.0, settings.max_daily_cost - daily_spent(store))
    budget = Budget(max_cost=min(settings.max_session_cost, left_today), max_steps=1,
                    max_duration=settings.max_session_seconds, reserve_fraction=0.0,
                    daily=DailyLedger(store, settings.max_daily_cost))
    meter = WireMeter(models=effective_models(store, []), budget=budget, record=record,
                      llm_base_url=settings.llm_base_url,
                      operator_ids=frozenset(m.id for m in operator_models(store).models))
    return ToolPolicy.from_settings(settings, meter=meter, on_secrets=on_secrets)


def _addresses(hosts: Any) -> set[str]:
    """Every address the host names resolve to (an IP literal is its own); a name that does not resolve
    adds none."""
    out: set[str] = set()
    for host in set(hosts):
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            out.update(one_form(str(info[4][0])) for info in infos)
        except (OSError, UnicodeError):
            continue
    return out

