"""Reflexes: JSON rules that handle routine wakes for zero tokens.

``config:reflexes`` is a list of rules, checked after ground truth and before
orient::

    {"name": "low-credit", "when": {"fact": "balances.openrouter", "lt": 1},
     "do": {"tools": [{"tool": "send_telegram", "input": {"text": "credit low"}}], "sleep_seconds": 21600},
     "cooldown_seconds": 86400}

A condition is data, never code: ``{"fact": PATH, OP: VALUE}`` with one of
``lt lte gt gte eq ne exists``, or ``{"all": [...]}``, ``{"any": [...]}``,
``{"not": C}``. Facts are ground truth (``balances.*``, ``kvUsage.*``), the
session's ``effort``, ``last_outcome``, ``failing_streak``, and the UTC
``hour`` (0-23) and ``weekday`` (0 Monday .. 6 Sunday). An unknown value
(a balance that could not be read) satisfies no comparison, only
``{"exists": false}``.

An action runs fixed tool calls in order (through the same budgets, modes
and sandbox as a plan's), may set the effort, and with ``sleep_seconds``
ends the wake there: no orient, no reflection, no LLM call. A rule that fired
within its cooldown is held back. The whole list is validated when written;
one bad rule rejects the write, and a list that is invalid in the store (set
around Brainstem) is ignored whole and recorded, never half-applied.
"""

from __future__ import annotations

import json
import operator
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.core.errors import BrainstemError, NotText
from brainstem.state.versions import failing_streak

MAX_RULES = 50
MAX_TOOLS_PER_RULE = 5
FACT_ROOTS = ("balances", "kvUsage", "effort", "last_outcome", "failing_streak", "hour", "weekday")
_COMPARE = {"lt": operator.lt, "lte": operator.le, "gt": operator.gt, "gte": operator.ge}
_OPS = (*_COMPARE, "eq", "ne", "exists")
_MIN_SLEEP, _MAX_SLEEP = 60, 30 * 86400


class ReflexError(BrainstemError):
    """``config:reflexes`` is not a valid list of rules; the message names the rule and the field."""

    exit_code = 2


def _check_condition(c: Any, where: str, depth: int = 0) -> None:
    if depth > 10:
        raise ValueError(f"{where}: conditions nest more than 10 deep")
    if not isinstance(c, dict):
        raise ValueError(f"{where}: a condition is an object, got {type(c).__name__}")
    if "fact" in c:
        fact = c["fact"]
        if not isinstance(fact, str) or fact.split(".")[0] not in FACT_ROOTS:
            raise ValueError(f"{where}: unknown fact {fact!r}; facts are {', '.join(FACT_ROOTS)} "
                             "(balances.openrouter, kvUsage.bytes ...)")
        ops = [k for k in c if k != "fact"]
        if len(ops) != 1 or ops[0] not in _OPS:
            raise ValueError(f"{where}: give exactly one of {', '.join(_OPS)} beside fact, got {ops or 'none'}")
        op, value = ops[0], c[ops[0]]
        if op in _COMPARE and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{where}: {op} compares numbers, got {json.dumps(value)}")
        if op == "exists" and not isinstance(value, bool):
            raise ValueError(f"{where}: exists takes true or false")
        return
    if len(c) != 1:
        raise ValueError(f"{where}: a condition is {{\"fact\": ...}}, {{\"all\": [...]}}, {{\"any\": [...]}} "
                         f"or {{\"not\": ...}}, got keys {sorted(c)}")
    (kind, inner), = c.items()
    if kind in ("all", "any"):
        if not isinstance(inner, list) or not inner:
            raise ValueError(f"{where}.{kind}: a non-empty list of conditions")
        for i, sub in enumerate(inner):
            _check_condition(sub, f"{where}.{kind}[{i}]", depth + 1)
    elif kind == "not":
        _check_condition(inner, f"{where}.not", depth + 1)
    else:
        raise ValueError(f"{where}: unknown condition {kind!r} (fact, all, any, not)")


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str = Field(min_length=1, max_length=128, pattern=r"^[^:\s]+$")
    input: dict[str, Any] = Field(default_factory=dict)


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tools: list[ToolCall] = Field(default_factory=list, max_length=MAX_TOOLS_PER_RULE)
    effort: Literal["low", "medium", "high", "max"] | None = None
    sleep_seconds: float | None = Field(None, ge=_MIN_SLEEP, le=_MAX_SLEEP)

    @model_validator(mode="after")
    def _does_something(self):
        if not self.tools and self.effort is None and self.sleep_seconds is None:
            raise ValueError("do nothing: give tools, effort or sleep_seconds")
        return self


class Reflex(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    when: dict[str, Any]
    do: Action
    cooldown_seconds: float = Field(ge=0, le=365 * 86400)

    @field_validator("when")
    @classmethod
    def _condition(cls, v):
        _check_condition(v, "when")
        return v


def parse(raw: Any) -> list[Reflex]:
    """The rules in ``raw`` (the parsed JSON), or :class:`ReflexError` with a one-line reason."""
    if not isinstance(raw, list):
        raise ReflexError(f"config:reflexes must be a JSON list of rules, got {type(raw).__name__}")
    if len(raw) > MAX_RULES:
        raise ReflexError(f"config:reflexes has {len(raw)} rules; the limit is {MAX_RULES}")
    rules, names = [], set()
    for i, item in enumerate(raw):
        label = f"config:reflexes[{i}]" + (f" ({item['name']})" if isinstance(item, dict)
                                            and isinstance(item.get("name"), str) else "")
        try:
            rule = Reflex.model_validate(item)
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(p) for p in e["loc"]) or "the rule"
            msg = e["msg"].removeprefix("Value error, ")
            if not msg.startswith((f"{where}:", f"{where}.")):  # a condition's own message names its place
                msg = f"{where}: {msg}"
            raise ReflexError(f"{label}: {msg}") from None
        if rule.name in names:
            raise ReflexError(f"{label}: the name {rule.name!r} is used twice")
        names.add(rule.name)
        rules.append(rule)
    return rules


def parse_text(text: str) -> list[Reflex]:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ReflexError(f"config:reflexes is not valid JSON: {exc}") from None
    return parse(raw)


def load(store) -> tuple[list[Reflex], dict[str, str]]:
    """The stored rules and when each last fired; :class:`ReflexError` when the stored list is invalid
    (written around Brainstem, or not even text): then it is ignored whole, never half-applied."""
    try:
        raw = store.get(keys.CONFIG_REFLEXES)
    except NotText as exc:
        raise ReflexError(str(exc)) from None
    rules = parse_text(raw) if raw is not None else []
    fired = store.get_json(keys.REFLEX_STATE, default={}) if rules else {}
    return rules, fired if isinstance(fired, dict) else {}


def facts(balances: dict | None, kv_usage: Any, effort: str, history: list, now: datetime) -> dict[str, Any]:
    """What conditions range over; ``history`` is the session history, oldest first."""
    last = next((h for h in reversed(history) if isinstance(h, dict)), None)
    return {"balances": dict(balances or {}), "kvUsage": kv_usage, "effort": effort,
            "last_outcome": last.get("outcome") if last else None,
            "failing_streak": len(failing_streak(history)), "hour": now.hour, "weekday": now.weekday()}


_ABSENT = object()


def _lookup(fs: dict, path: str) -> Any:
    value: Any = fs
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def holds(c: dict, fs: dict) -> bool:
    """Whether condition ``c`` (already validated) holds for facts ``fs``."""
    if "all" in c:
        return all(holds(x, fs) for x in c["all"])
    if "any" in c:
        return any(holds(x, fs) for x in c["any"])
    if "not" in c:
        return not holds(c["not"], fs)
    value = _lookup(fs, c["fact"])
    known = value is not _ABSENT and value is not None
    op = next(k for k in c if k != "fact")
    if op == "exists":
        return known is c["exists"]
    if not known:
        return False
    if op in _COMPARE:
        return (not isinstance(value, bool) and isinstance(value, (int, float))
                and _COMPARE[op](value, c[op]))
    return (value == c[op]) if op == "eq" else (value != c[op])


def cooling(rule: Reflex, fired_at: dict, now: datetime) -> str | None:
    """When ``rule`` last fired, if that is within its cooldown (so it is held back); else None."""
    last = parse_iso(fired_at.get(rule.name)) if isinstance(fired_at, dict) else None
    if last is not None and now - last < timedelta(seconds=rule.cooldown_seconds):
        return fired_at[rule.name]
    return None
