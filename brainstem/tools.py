"""Running one KV tool: its meta validated, its grants enforced, its code in the sandbox.

Scope is enforced here, on the runtime side of the sandbox channel, where
tool code cannot reach: ``ctx.kv`` under ``own`` reads and writes only
``tooldata:{name}:``; under ``read_all`` it reads anything but ``secret:*``
and still writes only under its own prefix; every write goes through the
agent's guarded view. ``ctx.secrets`` holds only what the meta asks for *and*
the operator allows (``BRAINSTEM_TOOL_SECRETS``), plus ``secret:{name}`` keys
named in ``kv_secrets``; an omission is noted in karma and the tool still runs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import events, keys
from .kv.base import Store
from .kv.guarded import AgentKV

MAX_TIMEOUT_MS = 300_000


class ToolMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    description: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    kv_secrets: list[str] = Field(default_factory=list)
    kv_access: Literal["none", "own", "read_all"] = "none"
    timeout_ms: int = Field(10_000, ge=50, le=MAX_TIMEOUT_MS)
    mode: Literal["automated", "supervised", "manual"] = "automated"


@dataclass
class ToolOutcome:
    ok: bool
    value: Any = None
    error: str | None = None
    duration_ms: float = 0.0
    retryable: bool = True  # False when trying again cannot help (no such tool, invalid meta)


class ToolError(Exception):
    """The tool cannot run at all (missing, meta invalid); a failed tool step, never a failed runtime."""


def load_tool(store: Store, name: str) -> tuple[str, ToolMeta]:
    if not isinstance(name, str) or not name or ":" in name:
        raise ToolError(f"invalid tool name {name!r}")
    code = store.get(keys.tool_code(name))
    if code is None:
        raise ToolError(f"no tool named {name!r} (tool:{name}:code is missing)")
    return code, parse_meta(keys.tool_meta(name), store.get(keys.tool_meta(name)))


def parse_meta(key: str, raw: str | None) -> ToolMeta:
    """The meta stored at ``key`` (defaults when absent); a bad one is a one-line :class:`ToolError`
    naming the field, the same for tools, adapters and checkers."""
    if raw is None:
        return ToolMeta()
    try:
        return ToolMeta.model_validate(json.loads(raw))
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(map(str, e["loc"])) or "the value"
        raise ToolError(f"{key} is invalid: {where}: {e['msg']}") from None
    except ValueError:
        raise ToolError(f"{key} is not valid JSON") from None


class ToolServices:
    """The runtime side of ``ctx`` for one tool execution."""

    def __init__(self, name: str, meta: ToolMeta, store: Store, agent_kv: AgentKV, record: Callable[..., Any],
                 allowed_env_secrets: list[str], fetch_allow: list[str], env: dict[str, str] | None = None,
                 on_read: Callable[[list[str]], None] | None = None):
        self.name = name
        self.kv_access = meta.kv_access
        self._store = store
        self._kv = agent_kv
        self._record = record
        self._prefix = keys.tooldata_prefix(name)
        self._fetch_allow = list(fetch_allow)
        self._on_read = on_read
        env = os.environ if env is None else env
        secrets: dict[str, str] = {}
        for s in meta.secrets:
            if s in allowed_env_secrets and env.get(s):
                secrets[s] = env[s]
            else:
                # The field is `secret_name`: karma blanks a field called `secret` whatever it holds.
                record(events.SECRET_NOT_GRANTED, tool=name, secret_name=s,
                       reason="not in BRAINSTEM_TOOL_SECRETS" if s not in allowed_env_secrets else "not set")
        for s in meta.kv_secrets:
            value = store.get(keys.secret(s))
            if value is not None:
                secrets.setdefault(s, value)
            else:
                record(events.SECRET_NOT_GRANTED, tool=name, secret_name=f"secret:{s}", reason="no such key")
        self.secrets = secrets

    # --- ctx.kv ---
    def _read_key(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        if self.kv_access == "own":
            return self._prefix + key
        if self.kv_access == "read_all":
            if key.startswith("secret:"):
                raise PermissionError("secret:* keys are not readable by tools")
            return key
        raise PermissionError("this tool has no KV access")

    def _write_key(self, key: str) -> str:
        if self.kv_access not in ("own", "read_all"):
            raise PermissionError("this tool has no KV access")
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        # Under read_all (reads take full keys) a full key naming our own prefix is accepted as such;
        # under own every key is relative, exactly as kv_get and kv_list treat it, so a write reads back.
        if self.kv_access == "read_all" and key.startswith(self._prefix):
            return key
        return self._prefix + key

    def kv_get(self, key: str) -> str | None:
        full = self._read_key(key)
        if self._on_read is not None:
            self._on_read([full])
        return self._store.get(full)

    def kv_put(self, key: str, value: str) -> None:
        self._kv.put(self._write_key(key), value, source=f"tool:{self.name}")

    def kv_delete(self, key: str) -> bool:
        return self._kv.delete(self._write_key(key), source=f"tool:{self.name}")

    def kv_list(self, prefix: str = "") -> list[str]:
        if self.kv_access == "own":
            return [k.name[len(self._prefix):] for k in self._store.list_all(self._prefix + (prefix or ""), limit=1000)]
        if self.kv_access == "read_all":
            return [k.name for k in self._store.list_all(prefix or "", limit=1000)
                    if not k.name.startswith("secret:") and not k.is_log]
        raise PermissionError("this tool has no KV access")

    # --- ctx.fetch / ctx.log ---
    def fetch(self, url, method="GET", headers=None, json=None, data=None, timeout=None) -> dict:
        from .sandbox.egress import fetch

        return fetch(url, method=method, headers=headers, json=json, data=data, timeout=timeout,
                     allow=self._fetch_allow)

    def log(self, message: str) -> None:
        self._record(events.TOOL_LOG, tool=self.name, message=str(message)[:2000])


def run_tool(name: str, args: Any, *, store: Store, agent_kv: AgentKV, record: Callable[..., Any],
             allowed_env_secrets: list[str], fetch_allow: list[str], attempt: int = 1,
             step_id: str | None = None, max_timeout_ms: int | None = None,
             on_secrets: Callable[[dict[str, str]], None] | None = None,
             on_read: Callable[[list[str]], None] | None = None) -> ToolOutcome:
    """Run tool ``name`` once with ``args``; records ``tool_start`` and ``tool_complete``.

    ``on_secrets`` is told the secret values granted, so karma can redact them.
    """
    from .sandbox import Limits, run

    record(events.TOOL_START, tool=name, step_id=step_id, attempt=attempt, input=args)
    t0 = time.monotonic()
    try:
        code, meta = load_tool(store, name)
        services = ToolServices(name, meta, store, agent_kv, record, allowed_env_secrets, fetch_allow,
                                on_read=on_read)
        if on_secrets is not None:
            on_secrets(services.secrets)
        timeout_ms = meta.timeout_ms if max_timeout_ms is None else max(50, min(meta.timeout_ms, max_timeout_ms))
        out = run(code, "execute", [args], services=services, limits=Limits(timeout_ms=timeout_ms))
        outcome = ToolOutcome(ok=out.ok, value=out.value, error=out.error, duration_ms=out.duration_ms)
    except ToolError as exc:
        outcome = ToolOutcome(ok=False, error=str(exc), duration_ms=(time.monotonic() - t0) * 1000,
                              retryable=False)
    record(events.TOOL_COMPLETE, tool=name, step_id=step_id, attempt=attempt, ok=outcome.ok,
           duration_ms=round(outcome.duration_ms, 1), result=outcome.value if outcome.ok else None,
           error=outcome.error)
    return outcome
