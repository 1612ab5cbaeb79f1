"""The plan orient returns, and reading one out of an LLM's answer.

Parsing is lenient about packaging (code fences, prose around the object:
the first balanced JSON object is taken) and strict about content (pydantic
validation). A truncated answer is a failure, not a plan. A step of a type
the runtime does not know parses as :class:`UnknownStep`, so the executor can
record it and go on with the rest.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

MAX_STEPS_PARSED = 1000  # beyond any sane budget; the step budget stops execution long before


class PlanError(ValueError):
    """The answer holds no usable plan; the message says why, for karma and the repair prompt."""


class FailurePolicy(BaseModel):
    model_config = ConfigDict(extra="allow")
    retries: int | None = Field(None, ge=0, le=10)
    on_fail: Literal["skip_and_cascade", "stop_session"] | None = None


class StepBase(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    store_result_as: str | None = Field(None, pattern=r"^[A-Za-z_][\w-]*$")
    depends_on: list[str] = Field(default_factory=list)
    failure: FailurePolicy | None = None

    @field_validator("depends_on", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v


class ActionStep(StepBase):
    type: Literal["action"]
    tool: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkStep(StepBase):
    type: Literal["think"]
    prompt: str = Field(min_length=1)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    effort: Literal["low", "medium", "high", "max"] | None = None


class ConditionalStep(StepBase):
    type: Literal["conditional"]
    prompt: str = Field(min_length=1)
    branches: dict[str, list[Step]]
    default: str | None = None  # the branch to take when the answer matches none
    model: str | None = None


class SubplanStep(StepBase):
    type: Literal["subplan"]
    goal: str = Field(min_length=1)
    planner_model: str | None = None
    max_steps: int | None = Field(None, ge=1)
    max_cost: float | None = Field(None, ge=0)


class ReflectStep(StepBase):
    type: Literal["reflect"]


MAX_AGENT_TURNS = 32  # tool rounds one agent step may take, whatever the plan asks


class AgentStep(StepBase):
    """A conversation in which the model calls the listed tools, sees their results and goes on."""
    type: Literal["agent"]
    prompt: str = Field(min_length=1)
    tools: list[str] = Field(min_length=1, max_length=64)
    max_turns: int = Field(8, ge=1, le=MAX_AGENT_TURNS)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)

    @field_validator("tools", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v


class ReplyStep(StepBase):
    """An answer to an inbox message. ``to`` and ``text`` are checked when the step runs, so a reply to no
    message, or an empty one, fails that step (with its reason) rather than the whole plan."""
    type: Literal["reply"]
    to: Any = None  # a message id; a string once {{variables}} are filled in
    text: Any = None


class UnknownStep(StepBase):
    type: str


KNOWN_TYPES = ("action", "think", "conditional", "subplan", "reflect", "agent", "reply")


def _step_tag(v: Any) -> str:
    t = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return t if t in KNOWN_TYPES else "unknown"


Step = Annotated[
    Annotated[ActionStep, Tag("action")]
    | Annotated[ThinkStep, Tag("think")]
    | Annotated[ConditionalStep, Tag("conditional")]
    | Annotated[SubplanStep, Tag("subplan")]
    | Annotated[ReflectStep, Tag("reflect")]
    | Annotated[AgentStep, Tag("agent")]
    | Annotated[ReplyStep, Tag("reply")]
    | Annotated[UnknownStep, Tag("unknown")],
    Discriminator(_step_tag),
]
ConditionalStep.model_rebuild()


class PlanBudget(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_cost: float | None = Field(None, ge=0)
    max_steps: int | None = Field(None, ge=0)
    max_duration_seconds: float | None = Field(None, gt=0)


class MidSessionTripwire(BaseModel):
    model_config = ConfigDict(extra="allow")
    condition: Literal["step_fails", "cost_above"]
    value: float | None = None


class Plan(BaseModel):
    model_config = ConfigDict(extra="allow")
    steps: list[Step] = Field(max_length=MAX_STEPS_PARSED)
    session_budget: PlanBudget | None = None
    mid_session_tripwires: list[MidSessionTripwire] = Field(default_factory=list)
    # Clamped leniently by the runtime (a bad value falls back to the default sleep), so not validated here.
    next_wake_config: dict[str, Any] | None = None


class SubPlan(BaseModel):
    model_config = ConfigDict(extra="allow")
    steps: list[Step] = Field(max_length=MAX_STEPS_PARSED)


_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.S)


def first_json_object(text: str) -> Any:
    """The JSON object in an LLM answer: the whole text, a fenced block, or the first balanced ``{...}``."""
    stripped = text.strip()
    if not stripped:
        raise PlanError("the answer was empty")
    candidates = [stripped] + [m.group(1).strip() for m in _FENCE.finditer(text)]
    for c in candidates:
        try:
            value = json.loads(c)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        raise PlanError(f"the answer is a JSON {type(value).__name__}; expected one JSON object")
    obj = _balanced_object(text)
    if obj is None:
        raise PlanError("no JSON object found in the answer (it may be prose, or cut off)")
    return obj


def _balanced_object(text: str) -> dict | None:
    """The first ``{`` at which a complete JSON object starts (``raw_decode`` at each one, so a
    stray brace or quote in the prose before it does not matter)."""
    decoder = json.JSONDecoder()
    end = len(text.rstrip())
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            if exc.pos >= end or exc.msg.startswith("Unterminated string"):
                # It ran out of text: everything after is inside it, so no later brace can be the answer.
                raise PlanError(f"the JSON object starting at character {start} is never closed "
                                f"(the answer may be cut off)") from None
        except RecursionError:
            pass  # nested deeper than any plan: not the answer
        else:
            if isinstance(value, dict):
                return value
        start = text.find("{", start + 1)
    return None


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:4]:
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p in KNOWN_TYPES + ("unknown",)))
        parts.append(f"{loc or '(root)'}: {e['msg']}")
    more = len(exc.errors()) - 4
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_plan(text: str, truncated: bool = False, model: type[BaseModel] = Plan) -> Any:
    """A validated plan from an LLM answer, or :class:`PlanError` saying what is wrong."""
    if truncated:
        raise PlanError("the answer was cut off (finish_reason: length); a truncated plan is not a plan")
    raw = first_json_object(text)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise PlanError(f"the plan does not validate: {_validation_message(exc)}") from None


def parse_object(text: str, truncated: bool = False) -> dict:
    """Any JSON object from an LLM answer (reflection output), with the same leniency."""
    if truncated:
        raise PlanError("the answer was cut off (finish_reason: length)")
    return first_json_object(text)
