"""The agent's own config, as the runtime reads it: ``config:defaults`` and ``config:models``.

These live in KV and the agent may rewrite them, so every read is validated.
A missing field takes the built-in default; a value that is not JSON, or is
the wrong shape, falls back to the built-in defaults whole and the reason is
recorded, so a broken config never stops the agent from waking (or makes it
wake every tick). Operator ceilings are applied elsewhere (``budget.py``):
nothing here can raise them.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import keys
from .kv.base import Store

Effort = Literal["low", "medium", "high", "max"]
EFFORT_ORDER = ("low", "medium", "high", "max")


class _Loose(BaseModel):
    # The agent may add its own fields; the runtime ignores what it does not know.
    model_config = ConfigDict(extra="allow")


class CallDefaults(_Loose):
    model: str = "haiku"
    effort: Effort = "low"
    max_output_tokens: int = Field(2000, ge=16, le=200_000)


class DeepReflectDefaults(CallDefaults):
    model: str = "sonnet"
    effort: Effort = "high"
    max_output_tokens: int = Field(8000, ge=16, le=200_000)
    default_interval_sessions: int = Field(20, ge=1)
    default_interval_days: float = Field(7, gt=0)
    # Before a proposed orient prompt or config applies, replay this many recent clean sessions against it
    # (recorded answers only); 0 turns the check off.
    replay_gate_sessions: int = Field(5, ge=0, le=50)


class SessionBudget(_Loose):
    max_cost: float = Field(0.10, ge=0)
    max_steps: int = Field(12, ge=0)
    max_duration_seconds: float = Field(600, gt=0)


class FailureHandling(_Loose):
    retries: int = Field(1, ge=0, le=10)
    on_fail: Literal["skip_and_cascade", "stop_session"] = "skip_and_cascade"


class WakeDefaults(_Loose):
    sleep_seconds: float = Field(21600, gt=0)
    default_effort: Effort = "low"


class MemoryDefaults(_Loose):
    default_load_keys: list[str] = Field(default_factory=lambda: ["wisdom"])
    max_load_key_bytes: int = Field(4000, ge=100, le=200_000)
    max_load_keys: int = Field(20, ge=0, le=200)
    kv_index_max_keys: int = Field(200, ge=10, le=5000)


class ExecutionDefaults(_Loose):
    max_subplan_depth: int = Field(3, ge=0, le=10)
    fallback_model: str | None = "haiku"
    think_max_tokens: int = Field(1500, ge=16, le=200_000)
    reflect_reserve_fraction: float = Field(0.2, ge=0, le=0.9)
    max_result_chars: int = Field(20_000, ge=100, le=1_000_000)


class Tripwire(_Loose):
    field: str
    op: Literal["<", "<=", ">", ">=", "==", "!="]
    value: float
    effort: Effort


class Defaults(_Loose):
    orient: CallDefaults = Field(default_factory=lambda: CallDefaults(model="sonnet", effort="medium",
                                                                       max_output_tokens=4000))
    reflect: CallDefaults = Field(default_factory=CallDefaults)
    deep_reflect: DeepReflectDefaults = Field(default_factory=DeepReflectDefaults)
    session_budget: SessionBudget = Field(default_factory=SessionBudget)
    failure_handling: FailureHandling = Field(default_factory=FailureHandling)
    wake: WakeDefaults = Field(default_factory=WakeDefaults)
    memory: MemoryDefaults = Field(default_factory=MemoryDefaults)
    execution: ExecutionDefaults = Field(default_factory=ExecutionDefaults)
    tripwires: list[Tripwire] = Field(default_factory=list)


class ModelInfo(_Loose):
    id: str
    alias: str | None = None
    input_cost_per_mtok: float | None = Field(None, ge=0)
    output_cost_per_mtok: float | None = Field(None, ge=0)
    max_output_tokens: int | None = Field(None, ge=1)
    supports_reasoning: bool = False


class Models(_Loose):
    models: list[ModelInfo] = Field(default_factory=list)
    alias_map: dict[str, str] = Field(default_factory=dict)
    fallback_model: str | None = None

    @field_validator("models")
    @classmethod
    def _unique_ids(cls, v: list[ModelInfo]) -> list[ModelInfo]:
        ids = [m.id for m in v]
        if len(ids) != len(set(ids)):
            raise ValueError("model ids must be unique")
        return v

    def resolve(self, name: str) -> str | None:
        """The model id for an alias or id; None when unknown."""
        if name in self.alias_map:
            return self.alias_map[name]
        for m in self.models:
            if m.alias == name or m.id == name:
                return m.id
        return None

    def info(self, model_id: str) -> ModelInfo | None:
        return next((m for m in self.models if m.id == model_id), None)

    def highest_prices(self) -> tuple[float, float]:
        """The most expensive known input and output prices (USD per Mtok): the price of the unknown."""
        ins = [m.input_cost_per_mtok for m in self.models if m.input_cost_per_mtok is not None]
        outs = [m.output_cost_per_mtok for m in self.models if m.output_cost_per_mtok is not None]
        # With no price known at all, assume a frontier model's list price rather than free.
        return (max(ins) if ins else 15.0, max(outs) if outs else 75.0)

    def prices(self, model_id: str) -> tuple[float, float]:
        m = self.info(model_id)
        hi_in, hi_out = self.highest_prices()
        if m is None:
            return hi_in, hi_out
        return (m.input_cost_per_mtok if m.input_cost_per_mtok is not None else hi_in,
                m.output_cost_per_mtok if m.output_cost_per_mtok is not None else hi_out)


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
    return str(exc)


def load_model(store: Store, key: str, model: type[BaseModel], problems: list[str]) -> Any:
    """Validate a JSON config key; on any problem, note it and return the built-in default."""
    try:
        raw = store.get(key, "json")
        if raw is None:
            problems.append(f"{key} is missing; using built-in defaults")
            return model()
        value = model.model_validate(raw)
        if isinstance(raw, dict):
            missing = sorted(set(model.model_fields) - set(raw))
            if missing:
                problems.append(f"{key} lacks {', '.join(missing)}; built-in defaults used for them")
        return value
    except Exception as exc:  # MalformedValue or ValidationError: the last valid version, else the defaults
        why = _problem(exc)
        found = _last_valid_version(store, key, model)
        if found is not None:
            number, value = found
            problems.append(f"{key} is invalid ({why}); using version {number}, the last valid one "
                            f"(`brainstem diff {key}` shows what changed, `brainstem rollback {key}` restores it)")
            return value
        problems.append(f"{key} is invalid ({why}); using built-in defaults")
        return model()


def _last_valid_version(store: Store, key: str, model: type[BaseModel]) -> tuple[int, Any] | None:
    """(version, value) of the newest recorded version of ``key`` that validates, if any."""
    from .versions import versions

    for v in reversed(versions(store, key)):
        text = v.get("value")
        if not isinstance(text, str):
            continue
        try:
            return v["version"], model.model_validate(json.loads(text))
        except Exception:  # noqa: BLE001 - not valid either: try an older one
            continue
    return None


def load_defaults(store: Store, problems: list[str]) -> Defaults:
    return load_model(store, keys.CONFIG_DEFAULTS, Defaults, problems)


def load_models(store: Store, problems: list[str]) -> Models:
    return load_model(store, keys.CONFIG_MODELS, Models, problems)


def max_effort(*efforts: str | None) -> str:
    known = [e for e in efforts if e in EFFORT_ORDER]
    return max(known, key=EFFORT_ORDER.index) if known else "low"
