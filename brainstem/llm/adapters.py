"""The agent-editable tiers of the provider cascade, and of the balance checkers.

Tier 1 runs ``provider:llm:code`` (``call(request, ctx)``) in the sandbox;
after its first success in a session the runtime snapshots code and meta to
``provider:llm:last_working:*`` (a runtime-owned key the agent cannot write).
Tier 2 runs that snapshot. Tier 3 is the hard-coded client in
``openrouter.py``. Balance checkers (``provider:llm_balance``,
``provider:wallet_balance``, ``check(ctx)``) follow the same pattern with a
hard-coded fallback each.

Adapter code is hostile like any tool: it gets only the secrets its meta
names *and* the operator allows, and fetch obeys the egress policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import events, keys
from ..budget import BudgetExceeded
from ..kv.base import Store
from ..kv.guarded import AgentKV
from ..tools import ToolError, ToolMeta, ToolServices, parse_meta
from .openrouter import LLMResponse, ProviderError


def _meta(store: Store, key: str) -> ToolMeta:
    return parse_meta(key, store.get(key))


def _usage(raw: Any) -> dict:
    raw = raw if isinstance(raw, dict) else {}

    def n(name: str) -> int:
        v = raw.get(name)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else 0
    cost = raw.get("cost")
    return {"prompt_tokens": n("prompt_tokens"), "completion_tokens": n("completion_tokens"),
            "reasoning_tokens": n("reasoning_tokens"),
            "cost": float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0 else None}


class SandboxedAdapter:
    """A provider whose code lives in KV and runs in the sandbox."""

    def __init__(self, tier: str, name: str, code: str, meta: ToolMeta, services: ToolServices,
                 on_success: Callable[[], None] | None = None):
        self.tier = tier
        self.name = name
        self._code = code
        self._meta = meta
        self._services = services
        self._on_success = on_success

    def complete(self, request: dict, timeout: float) -> LLMResponse:
        from ..sandbox import Limits, run

        budget_ms = int(timeout * 1000)
        clipped = budget_ms < self._meta.timeout_ms
        out = run(self._code, "call", [request], services=self._services,
                  limits=Limits(timeout_ms=max(50, min(self._meta.timeout_ms, budget_ms))))
        if not out.ok:
            if clipped and "timed out" in (out.error or ""):
                # Out of session time is not the adapter's fault: trying the next tier cannot help.
                raise BudgetExceeded("time", f"{self.name} used the session's remaining time")
            raise ProviderError(f"{self.name}: {out.error}")
        value = out.value
        if not isinstance(value, dict) or not isinstance(value.get("content"), str):
            raise ProviderError(f"{self.name}: call() must return {{'content': str, 'usage': {{...}}}}, "
                                f"got {type(value).__name__}")
        finish = value.get("finish_reason") if isinstance(value.get("finish_reason"), str) else None
        resp = LLMResponse(content=value["content"], usage=_usage(value.get("usage")), finish_reason=finish,
                           truncated=finish == "length", model=request.get("model", ""), raw=value)
        if self._on_success is not None:
            self._on_success()
        return resp


def dynamic_providers(store: Store, agent_kv: AgentKV, record: Callable[..., Any], allowed_env_secrets: list[str],
                      fetch_allow: list[str], on_secrets: Callable[[dict], None] | None = None) -> list:
    """Tier 1 and tier 2, whichever exist and are valid (a broken one is recorded and left out)."""
    out = []
    code = store.get(keys.PROVIDER_LLM_CODE)
    snap_code = store.get(keys.PROVIDER_LLM_LAST_WORKING_CODE)
    snapshotted = {"done": False}

    def services(name: str, meta: ToolMeta) -> ToolServices:
        s = ToolServices(name, meta, store, agent_kv, record, allowed_env_secrets, fetch_allow)
        if on_secrets is not None:
            on_secrets(s.secrets)
        return s

    if code is not None:
        try:
            meta = _meta(store, keys.PROVIDER_LLM_META)

            def snapshot() -> None:
                # Only the runtime writes the snapshot, once per session, and only when it changed.
                if snapshotted["done"]:
                    return
                snapshotted["done"] = True
                meta_now = store.get(keys.PROVIDER_LLM_META) or "{}"
                if (store.get(keys.PROVIDER_LLM_LAST_WORKING_CODE) != code
                        or store.get(keys.PROVIDER_LLM_LAST_WORKING_META) != meta_now):
                    store.put(keys.PROVIDER_LLM_LAST_WORKING_CODE, code)
                    store.put(keys.PROVIDER_LLM_LAST_WORKING_META, meta_now)
                    record(events.KV_WRITE, op="put", key=keys.PROVIDER_LLM_LAST_WORKING_CODE, source="runtime",
                           reason="tier-1 adapter worked; snapshotted as last working")
            out.append(SandboxedAdapter("dynamic", "provider:llm", code, meta, services("provider:llm", meta),
                                        on_success=snapshot))
        except ToolError as exc:
            record(events.PROVIDER_FALLBACK, tier="dynamic", error=str(exc))
    if snap_code is not None and snap_code != code:
        try:
            meta = _meta(store, keys.PROVIDER_LLM_LAST_WORKING_META)
            out.append(SandboxedAdapter("last_working", "provider:llm:last_working", snap_code, meta,
                                        services("provider:llm:last_working", meta)))
        except ToolError as exc:
            record(events.PROVIDER_FALLBACK, tier="last_working", error=str(exc))
    return out


def checked_number(store: Store, name: str, fallback: Callable[[], float | None], agent_kv: AgentKV,
                   record: Callable[..., Any], allowed_env_secrets: list[str], fetch_allow: list[str],
                   timeout: float, on_secrets: Callable[[dict], None] | None = None) -> float | None:
    """A balance from ``provider:{name}:code`` (``check(ctx)``), else from the hard-coded ``fallback``.

    What the checker is granted is redacted from what is recorded here (its ``ctx.log`` lines and its
    error), whether or not the caller's recorder knows those values; ``on_secrets`` is told them too.
    """
    code = store.get(f"provider:{name}:code")
    if code is not None:
        from ..karma import Redactor
        from ..sandbox import Limits, run

        granted = Redactor()

        def record_redacted(event: str, **fields: Any) -> Any:
            return record(event, **granted(fields))

        t0 = time.monotonic()
        try:
            meta = _meta(store, f"provider:{name}:meta")
            services = ToolServices(f"provider:{name}", meta, store, agent_kv, record_redacted,
                                    allowed_env_secrets, fetch_allow)
            for secret_name, value in services.secrets.items():
                granted.add(secret_name, value)
            if on_secrets is not None:
                on_secrets(services.secrets)
            out = run(code, "check", [], services=services,
                      limits=Limits(timeout_ms=max(50, min(meta.timeout_ms, int(timeout * 1000)))))
            if out.ok and (out.value is None or (isinstance(out.value, (int, float))
                                                 and not isinstance(out.value, bool))):
                if out.value is not None:
                    return float(out.value)
                error = "check() returned None"
            else:
                error = out.error or f"check() returned {type(out.value).__name__}, not a number"
        except ToolError as exc:
            error = str(exc)
        record_redacted(events.PROVIDER_FALLBACK, tier="dynamic", checker=name, error=error,
                        duration_ms=int((time.monotonic() - t0) * 1000))
    return fallback()
