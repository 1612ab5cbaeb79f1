"""A tool as the store holds it: its code at ``tool:NAME:code``, its meta (what it asks for) at
``tool:NAME:meta``, read and validated here. The same meta describes adapters and checkers.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.store.base import Store

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


def list_tools(store: Store) -> list[dict[str, Any]]:
    """Every tool in the store (a ``tool:NAME:code`` or a ``tool:NAME:meta``), by name, with what its
    meta declares. A tool that cannot run as stored has ``error`` (its meta is invalid, or its code
    is missing) and the meta's fields are then None."""
    names: set[str] = set()
    for info in store.list_all("tool:"):
        parts = info.name.split(":")
        if len(parts) == 3 and parts[2] in ("code", "meta") and parts[1]:
            names.add(parts[1])
    out = []
    for name in sorted(names):
        row: dict[str, Any] = {"name": name, "description": None, "mode": None, "kv_access": None,
                               "secrets": None, "kv_secrets": None, "timeout_ms": None, "error": None}
        try:
            meta = parse_meta(keys.tool_meta(name), store.get(keys.tool_meta(name)))
        except ToolError as exc:
            row["error"] = str(exc)
        except BrainstemError as exc:  # a meta that is not text
            row["error"] = str(exc)
        else:
            row.update(description=meta.description, mode=meta.mode, kv_access=meta.kv_access,
                       secrets=list(meta.secrets), kv_secrets=list(meta.kv_secrets), timeout_ms=meta.timeout_ms)
        if row["error"] is None:
            try:
                if store.get_text(keys.tool_code(name)) is None:
                    row["error"] = f"{keys.tool_code(name)} is missing"
            except BrainstemError as exc:
                row["error"] = str(exc)
        out.append(row)
    return out
