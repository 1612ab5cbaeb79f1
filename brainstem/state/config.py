"""The agent's own config, as the runtime reads it: ``config:defaults`` and ``config:models``.

These live in KV and the agent may rewrite them, so every read is validated.
A missing field takes the built-in default; a value that is not JSON, or is
the wrong shape, falls back to the built-in defaults whole and the reason is
recorded, so a broken config never stops the agent from waking (or makes it
wake every tick). Operator ceilings are applied elsewhere (``budget.py``):
nothing here can raise them. Prices are read for metering through
:func:`effective_models`, which never lets the agent's ``config:models`` price a
call below the operator's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from brainstem.core import keys
from brainstem.core.errors import BrainstemError
from brainstem.state.shipped import seed_dirs
from brainstem.state.versions import versions
from brainstem.store.base import Store

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


DEFAULT_SLEEP_SECONDS = 21600.0  # six hours: the sleep of an agent that asks for none


class WakeDefaults(_Loose):
    sleep_seconds: float = Field(DEFAULT_SLEEP_SECONDS, gt=0)
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
    # USD per content part that is not text (an image, audio, a file); None: such parts are refused.
    input_cost_per_part: float | None = Field(None, ge=0)
    # USD per million prompt tokens read from the provider's prompt cache, and written to it (a 5-minute
    # entry; a 1-hour one at its own price). Without both read and write prices no call is marked for caching.
    cache_read_cost_per_mtok: float | None = Field(None, ge=0)
    cache_write_cost_per_mtok: float | None = Field(None, ge=0)
    cache_write_1h_cost_per_mtok: float | None = Field(None, ge=0)
    max_output_tokens: int | None = Field(None, ge=1)
    supports_reasoning: bool = False


@dataclass(frozen=True)
class CachePrices:
    """A model's prompt-cache prices, USD per million tokens: ``write`` by cache lifetime (``5m``, ``1h``)."""

    input: float
    read: float
    write: dict[str, float]


class Models(_Loose):
    models: list[ModelInfo] = Field(default_factory=list)
    alias_map: dict[str, str] = Field(default_factory=dict)
    fallback_model: str | None = None
    # The dearest prices of the operator's list (see effective_models): a model unknown here costs no less.
    _floor: tuple[float, float] = PrivateAttr(default=(0.0, 0.0))

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
        return (max([*ins, self._floor[0]]) if ins else max(15.0, self._floor[0]),
                max([*outs, self._floor[1]]) if outs else max(75.0, self._floor[1]))

    def prices(self, model_id: str) -> tuple[float, float]:
        m = self.info(model_id)
        hi_in, hi_out = self.highest_prices()
        if m is None:
            return hi_in, hi_out
        return (m.input_cost_per_mtok if m.input_cost_per_mtok is not None else hi_in,
                m.output_cost_per_mtok if m.output_cost_per_mtok is not None else hi_out)

    def cache_prices(self, model_id: str) -> CachePrices | None:
        """The model's prompt-cache prices (USD per Mtok), None when the list gives no read and write price."""
        m = self.info(model_id)
        if m is None or m.cache_read_cost_per_mtok is None or m.cache_write_cost_per_mtok is None:
            return None
        return CachePrices(input=self.prices(model_id)[0], read=m.cache_read_cost_per_mtok,
                           write={"5m": m.cache_write_cost_per_mtok, **({"1h": m.cache_write_1h_cost_per_mtok}
                                                                       if m.cache_write_1h_cost_per_mtok is not None
                                                                       else {})})

    def part_price(self, model_id: str) -> float | None:
        """USD per content part that is not text; None when the list gives none (such parts are refused)."""
        m = self.info(model_id)
        return None if m is None else m.input_cost_per_part


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
    """``config:models`` as the agent wrote it; what calls are priced at is :func:`effective_models`."""
    return load_model(store, keys.CONFIG_MODELS, Models, problems)


# The operator's newest price list, once seen in the history: the floor stays the operator's even after
# the agent's own writes have pushed that version out of the (bounded) history.
OPERATOR_MODELS = keys.OPERATOR_MODELS


def effective_models(store: Store, problems: list[str]) -> Models:
    """The price list every call is metered by: the agent's ``config:models``, with each model priced at
    no less than the operator's list prices it, and capped at no more output tokens than it allows.

    The agent may raise a price, never lower one: a model the operator's list does not know costs at
    least that list's dearest price, as an unknown model does; content parts that are not text
    (``input_cost_per_part``) are priced only for a model the operator's list gives a part price.
    The operator's list is the ``config:models`` the operator last wrote (``kv put``, ``rollback``,
    ``seed``; or the value it had before anything was recorded), else the shipped
    ``prompts_seed/config/models.json``."""
    return floor_models(load_models(store, problems), operator_models(store), problems)


def floor_models(agent: Models, floor: Models, problems: list[str] | None = None) -> Models:
    priced = []
    lowered = []
    for m in agent.models:
        a_in, a_out = agent.prices(m.id)
        f_in, f_out = floor.prices(m.id)
        known = floor.info(m.id)
        cap = known.max_output_tokens if known is not None else None
        limit = m.max_output_tokens if cap is None else min(m.max_output_tokens or cap, cap)
        # Parts are priced only where the operator's list prices them: a price the agent gives alone
        # would lower "refused" to whatever it wrote.
        f_part = floor.part_price(m.id)
        part = None if f_part is None else max(m.input_cost_per_part or 0.0, f_part)
        unpriced = m.input_cost_per_part is not None and part != m.input_cost_per_part
        # Cache prices likewise: only where the operator's list gives them, never below it. A cache price the
        # agent gives alone would have calls marked (and billed for writes) at a price the operator never set.
        cache = {name: _floored(getattr(m, name), getattr(known, name, None) if known is not None else None)
                 for name in CACHE_PRICE_FIELDS}
        uncached = any(getattr(m, name) is not None and cache[name] != getattr(m, name) for name in cache)
        if a_in < f_in or a_out < f_out or limit != m.max_output_tokens or unpriced or uncached:
            lowered.append(m.id)
        priced.append(m.model_copy(update={"input_cost_per_mtok": max(a_in, f_in), "output_cost_per_mtok":
                                           max(a_out, f_out), "max_output_tokens": limit, "input_cost_per_part": part,
                                           **cache}))
    out = agent.model_copy(update={"models": priced})
    out._floor = floor.highest_prices()
    if lowered and problems is not None:
        problems.append(f"{keys.CONFIG_MODELS} prices {', '.join(lowered[:5])}{' ...' if len(lowered) > 5 else ''} "
                        f"below the operator's list (or lets more output tokens, or prices parts or caching it does "
                        f"not); the operator's prices and limits are used")
    return out


CACHE_PRICE_FIELDS = ("cache_read_cost_per_mtok", "cache_write_cost_per_mtok", "cache_write_1h_cost_per_mtok")


def _floored(agent: float | None, operator: float | None) -> float | None:
    """A price the operator's list gives, raised to the agent's when the agent's is higher; None without it."""
    return None if operator is None else max(agent or 0.0, operator)


def operator_models(store: Store) -> Models:
    """The operator's price list (see :func:`effective_models`)."""
    history = versions(store, keys.CONFIG_MODELS)
    if not history:  # every agent write is recorded, so with none recorded the value is the operator's
        try:
            mark: dict | None = {"version": 0, "value": store.get_text(keys.CONFIG_MODELS)}
        except BrainstemError:
            mark = None
    else:
        mine = next((v for v in reversed(history) if _by_operator(v)), None)
        mark = None if mine is None else {"version": mine["version"], "at": mine.get("at"), "value": mine.get("value")}
    if mark is None:
        pinned = store.get_json(OPERATOR_MODELS, default=None)
        mark = pinned if isinstance(pinned, dict) else None
    elif store.get_json(OPERATOR_MODELS, default=None) != mark:
        try:
            store.put(OPERATOR_MODELS, mark)
        except BrainstemError:  # a read-only store: what the history says still holds this time
            pass
    found = _models_or_none(mark.get("value")) if mark is not None else None
    return found if found is not None else shipped_models()


def _by_operator(version: dict) -> bool:
    source = str(version.get("source") or "")
    return not version.get("session_id") and (source == "initial" or source.startswith(("operator", "seed")))


def _models_or_none(text: Any) -> Models | None:
    if not isinstance(text, str):
        return None
    try:
        return Models.model_validate(json.loads(text))
    except Exception:  # noqa: BLE001 - not a valid list: the shipped one is the floor
        return None


@functools.lru_cache(maxsize=1)
def _shipped_text() -> str | None:
    try:
        return (seed_dirs()[0] / "config" / "models.json").read_text()
    except Exception:  # noqa: BLE001 - no seed files: every model is priced as the unknown are
        return None


def shipped_models() -> Models:
    """The price list that ships in ``prompts_seed/config/models.json``."""
    return _models_or_none(_shipped_text()) or Models()


def max_effort(*efforts: str | None) -> str:
    known = [e for e in efforts if e in EFFORT_ORDER]
    return max(known, key=EFFORT_ORDER.index) if known else "low"
