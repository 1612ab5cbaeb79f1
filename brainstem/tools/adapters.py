"""The agent-editable tiers of the provider cascade, and of the balance checkers.

Tier 1 runs ``provider:llm:code`` (``call(request, ctx)``) in the sandbox;
after its first success in a session the runtime snapshots code and meta to
``provider:llm:last_working:*`` (a runtime-owned key the agent cannot write).
Tier 2 runs that snapshot. Tier 3 is the hard-coded client in
``openrouter.py``. Balance checkers (``provider:llm_balance``,
``provider:wallet_balance``, ``check(ctx)``) follow the same pattern with a
hard-coded fallback each.

Adapter code is hostile like any tool: it holds placeholders for the secrets
its meta names *and* the operator bound, fetch obeys the egress policy, and
its requests to the LLM host are metered on the wire (:mod:`.meter`): the
session pays what the host bills, never what the adapter reports. Balance
checkers' answers are sanity-checked: a negative, non-finite or absurd number
counts as a failed check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from brainstem.core import events, keys
from brainstem.core.json_numbers import finite
from brainstem.llm.messages import parse_tool_calls
from brainstem.llm.openrouter import LLMResponse, ProviderError
from brainstem.sandbox import Limits, run
from brainstem.state import approval
from brainstem.state.budget import BudgetExceeded
from brainstem.state.guarded import AgentKV
from brainstem.store.base import Store
from brainstem.store.karma import Redactor
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import ToolServices
from brainstem.tools.tool import ToolError, ToolMeta, parse_meta


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
            "cost": (float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) and cost >= 0
                     else None)}


class SandboxedAdapter:
    """A provider whose code lives in KV and runs in the sandbox."""

    def __init__(self, tier: str, name: str, code: str, meta: ToolMeta, services: ToolServices,
                 on_success: Callable[[], None] | None = None, base_url: str | None = None):
        self.tier = tier
        self.name = name
        self._code = code
        self._meta = meta
        self._services = services
        self._on_success = on_success
        self._base_url = base_url

    def complete(self, request: dict, timeout: float, deadline: float | None = None) -> LLMResponse:
        budget_ms = int(timeout * 1000)
        clipped = budget_ms < self._meta.timeout_ms
        if self._base_url:
            request = {**request, "base_url": self._base_url}  # the operator's endpoint, not a secret
        out = run(self._code, "call", [request], services=self._services,
                  limits=Limits(timeout_ms=max(50, min(self._meta.timeout_ms, budget_ms))))
        if not out.ok:
            if clipped and "timed out" in (out.error or ""):
                # Out of session time is not the adapter's fault: trying the next tier cannot help.
                raise BudgetExceeded("time", f"{self.name} used the session's remaining time")
            raise ProviderError(f"{self.name}: {out.error}")
        value = out.value
        content = value.get("content") if isinstance(value, dict) else None
        calls = parse_tool_calls(value.get("tool_calls")) if isinstance(value, dict) else []
        if not isinstance(content, str) and not (content is None and calls):
            raise ProviderError(f"{self.name}: call() must return {{'content': str, 'usage': {{...}}}} (and "
                                f"'tool_calls' when it called tools), got {type(value).__name__}")
        if calls and not request.get("tools"):
            raise ProviderError(f"{self.name}: call() returned tool calls, but no tools were offered")
        finish = value.get("finish_reason") if isinstance(value.get("finish_reason"), str) else None
        resp = LLMResponse(content=content or "", usage=_usage(value.get("usage")), finish_reason=finish,
                           truncated=finish == "length", model=request.get("model", ""), raw=value,
                           tool_calls=calls)
        if self._on_success is not None:
            self._on_success()
        return resp


def dynamic_providers(store: Store, agent_kv: AgentKV, record: Callable[..., Any], policy: ToolPolicy,
                      base_url: str | None = None, floors: Mapping[str, str] | None = None,
                      dry_run: bool = False) -> list:
    """Tier 1 and tier 2, whichever exist and are valid (a broken one is recorded and left out). Adapter
    code is tool code: each tier is held back when ``manual`` for its own bytes (as ``provider:llm``) or in
    a dry run, as a balance checker is; then the hard-coded client answers."""
    out = []
    code = store.get(keys.PROVIDER_LLM_CODE)
    snap_code = store.get(keys.PROVIDER_LLM_LAST_WORKING_CODE)
    if snap_code == code:
        snap_code = None
    if code is not None and _held_back(store, "provider:llm", code, floors, dry_run, record, tier="dynamic"):
        code = None
    if snap_code is not None and _held_back(store, "provider:llm", snap_code, floors, dry_run, record,
                                            tier="last_working"):
        snap_code = None
    snapshotted = {"done": False}

    def services(name: str, meta: ToolMeta) -> ToolServices:
        return ToolServices(name, meta, store, agent_kv, record, policy)

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
                                        on_success=snapshot, base_url=base_url))
        except ToolError as exc:
            record(events.PROVIDER_FALLBACK, tier="dynamic", error=str(exc))
    if snap_code is not None:
        try:
            meta = _meta(store, keys.PROVIDER_LLM_LAST_WORKING_META)
            out.append(SandboxedAdapter("last_working", "provider:llm:last_working", snap_code, meta,
                                        services("provider:llm:last_working", meta), base_url=base_url))
        except ToolError as exc:
            record(events.PROVIDER_FALLBACK, tier="last_working", error=str(exc))
    return out


def _held_back(store: Store, name: str, code: str, floors: Mapping[str, str] | None, dry_run: bool,
               record: Callable[..., Any], tier: str | None = None) -> bool:
    """Whether provider ``code``, run as ``name``, must not run now: a ``tool_would_do`` entry says why, or
    for an adapter's ``tier`` a ``provider_fallback`` entry."""
    try:
        meta_mode = _meta(store, f"{name}:meta").mode
    except ToolError:
        meta_mode = "automated"  # a broken meta fails the code when it runs, as before
    mode_floor = approval.floor(store, name, code, floors)
    mode = approval.strictest(meta_mode, mode_floor)
    floored = mode != meta_mode
    # A provider's answer cannot wait for the operator's verdict: supervised code is held back as manual is.
    reason = "dry_run" if dry_run else (mode if mode in ("manual", "supervised") else None)
    if reason is not None:
        event, fields = ((events.TOOL_WOULD_DO, {"tool": name}) if tier is None else
                         (events.PROVIDER_FALLBACK, {"tier": tier, "error": f"{name} held back"}))
        record(event, **fields, reason=reason, mode_floor=mode_floor if floored else None)
    return reason is not None


MAX_SANE_BALANCE = 1e12  # USD; above it a checker's answer is nonsense, not a balance


def sane_balance(value: Any) -> tuple[float | None, str | None]:
    """(the balance, None) or (None, why it is not one): negative, non-finite or absurd values are unknown."""
    if value is None:
        return None, "check() returned None"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None, f"check() returned {type(value).__name__}, not a number"
    if finite(value) is None:
        return None, f"check() returned {value}, not a finite number"
    if value < 0:
        return None, f"check() returned {value}, a negative balance"
    if value > MAX_SANE_BALANCE:
        return None, f"check() returned {value:g}, beyond any plausible balance"
    return float(value), None


def checked_number(store: Store, name: str, fallback: Callable[[], float | None], agent_kv: AgentKV,
                   record: Callable[..., Any], policy: ToolPolicy, timeout: float, *,
                   floors: Mapping[str, str] | None = None, dry_run: bool = False) -> float | None:
    """A balance from ``provider:{name}:code`` (``check(ctx)``), else from the hard-coded ``fallback``.

    The checker is tool code: ``manual`` (its meta's mode or the operator's ``floors`` for its bytes) never runs it,
    and neither does a dry run (a ``tool_would_do`` entry each, and the fallback answers). What the
    checker is granted is redacted from what is recorded here (its ``ctx.log`` lines and its error),
    whether or not the caller's recorder knows those values.
    """
    code = store.get(f"provider:{name}:code")
    if code is not None and _held_back(store, f"provider:{name}", code, floors, dry_run, record):
        code = None
    if code is not None:
        granted = Redactor()

        def record_redacted(event: str, **fields: Any) -> Any:
            return record(event, **granted(fields))

        def learn(values: dict[str, str]) -> None:
            for secret_name, value in values.items():
                granted.add(secret_name, value)
            if policy.on_secrets is not None:
                policy.on_secrets(values)

        t0 = time.monotonic()
        try:
            meta = _meta(store, f"provider:{name}:meta")
            services = ToolServices(f"provider:{name}", meta, store, agent_kv, record_redacted,
                                    replace(policy, on_secrets=learn))
            out = run(code, "check", [], services=services,
                      limits=Limits(timeout_ms=max(50, min(meta.timeout_ms, int(timeout * 1000)))))
            if out.ok:
                value, error = sane_balance(out.value)
                if value is not None:
                    return value
            else:
                error = out.error or "check() failed"
        except ToolError as exc:
            error = str(exc)
        record_redacted(events.PROVIDER_FALLBACK, tier="dynamic", checker=name, error=error,
                        duration_ms=int((time.monotonic() - t0) * 1000))
    return fallback()
