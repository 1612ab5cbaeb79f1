"""What one session carries, and the one place it is put together.

A session is its :class:`SessionDeps` (who it is, its store, recorder, config, budget and stop
signals: fixed for the run), its :class:`~brainstem.session.state.SessionState` (all that changes
as it runs) and what is made for it here: :func:`build_session` assembles a :class:`Session` (the
agent's view of the store, the tool policy and the LLM chokepoint) for every kind of session, a
wake, a dry run and a replay (including the replays of deep reflection's gate), from a small
:class:`SessionSpec` saying what sets that kind apart. The executor and reflection read from it. It
holds no behaviour of its own beyond routing a tool run through the sandbox with the session's grants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import now_utc
from brainstem.core.errors import ConfigError
from brainstem.core.secrets import LLM_KEY, public_url
from brainstem.core.settings import Settings
from brainstem.llm.chokepoint import LLM
from brainstem.llm.providers import OpenRouterProvider
from brainstem.session.state import SessionState
from brainstem.session.stopping import Stopping
from brainstem.state import refusals, review
from brainstem.state.budget import Budget, clamp
from brainstem.state.config import Defaults, Models, SessionBudget
from brainstem.state.guarded import AgentKV
from brainstem.state.schedules import Limits
from brainstem.state.versions import record_write
from brainstem.store.base import Store
from brainstem.store.karma import Karma
from brainstem.store.lease import Lease
from brainstem.tools.adapters import dynamic_providers
from brainstem.tools.mcp_tools import Catalog, catalog, prompt_entries
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import ToolOutcome, run_tool


@dataclass(frozen=True)
class SessionDeps:
    """What a session's run depends on: given when it starts, never reassigned (the budget and the store
    change inside, the references do not)."""
    id: str
    number: int
    settings: Settings
    store: Store
    karma: Karma
    budget: Budget
    defaults: Defaults
    models: Models
    soul: str
    mode: str = "live"  # "live", "dry_run" (no tool runs) or "replay" (a recorded session, in an overlay)
    stop: Stopping = field(default_factory=Stopping)  # what stops it from outside (a replay: nothing)
    # The replay gate deep reflection passes a proposed change through (staged keys -> report); given
    # by the wake, which sits above replay. None: no gate, and reflection then refuses such changes.
    check_change: Callable[..., dict] | None = None
    lease: Lease | None = None  # None: a dry run or a replay, which hold none
    started: datetime = field(default_factory=now_utc)


@dataclass(frozen=True)
class SessionSpec:
    """What sets one kind of session apart as it is put together; whatever is left out is made from
    its deps. A wake gives the views its ground truth ran with, and its meter; a replay, the answers
    and fetches of its recording."""
    providers: list | None = None  # who answers its LLM calls (None: the cascade, see cascade())
    agent_kv: AgentKV | None = None  # the agent's view of the store, when something used it before
    policy: ToolPolicy | None = None  # the tools' grants and services, when something used them before
    meter: Any = None  # the wire meter of sandboxed code's requests to the LLM host
    on_anomaly: Callable | None = None  # told of a call whose cost looks wrong


@dataclass(frozen=True)
class Session:
    """A session at work: its deps, the views and LLM made for it (never reassigned), and its state."""
    deps: SessionDeps
    state: SessionState
    agent_kv: AgentKV
    tool_policy: ToolPolicy
    llm: LLM
    tool_registry: Any = None

    def record(self, event: str, **fields: Any) -> dict:
        return self.deps.karma.record(event, **fields)

    def run_tool(self, name: str, args: Any, attempt: int = 1, step_id: str | None = None) -> ToolOutcome:
        deps = self.deps
        left_ms = int(deps.budget.time_left() * 1000)

        cap = deps.settings.review_max_per_session
        record = deps.karma.record

        def supervised(outcome: ToolOutcome) -> None:  # the run waits for the operator's verdict
            queue_review(deps.store, deps.karma, deps.id, name, step_id, args, outcome, cap)

        return run_tool(name, args, store=deps.store, agent_kv=self.agent_kv, record=record,
                        policy=self.tool_policy, attempt=attempt, step_id=step_id, max_timeout_ms=max(50, left_ms),
                        on_read=self.state.reads.update, dry_run=deps.mode == "dry_run", enforce_mode=True,
                        on_supervised=supervised, review_room=partial(self.state.review_room, cap),
                        floors=deps.settings.mode_floors(), on_seen=self.state.seen.setdefault)

    def mcp_catalog(self) -> Catalog:
        """The operator's MCP tools offered to this session (their servers asked on first use, within the
        session's time left)."""
        return catalog(self.tool_policy, self.deps.karma.record, timeout=self.deps.budget.time_left())

    def tools_for_prompt(self) -> Any:
        """The tools a planning prompt lists: the agent's registry and the MCP tools offered (unchanged
        when there are none)."""
        found = self.mcp_catalog()
        if not found.tools:
            return self.tool_registry
        registry = self.tool_registry if isinstance(self.tool_registry, dict) else {}
        listed = registry.get("tools")
        return {**registry, "tools": {**(listed if isinstance(listed, dict) else {}), **prompt_entries(found)}}

    def models_for_prompt(self) -> list[dict]:
        return [{"alias": m.alias, "id": m.id, "input_cost_per_mtok": m.input_cost_per_mtok,
                 "output_cost_per_mtok": m.output_cost_per_mtok, "supports_reasoning": m.supports_reasoning}
                for m in self.deps.models.models]


def queue_review(store: Store, karma: Karma, session_id: str, tool: str, step_id: str | None, args: Any,
                 outcome: ToolOutcome, cap: int) -> None:
    """A supervised tool's run, put in the review inbox to wait for the operator's verdict (recorded
    ``review_queued``; ``review_dropped`` when ``session_id`` has ``cap`` runs waiting already)."""
    redact = karma.redact
    item = review.add(store, tool=tool, session_id=session_id, step_id=step_id, input=redact(args), ok=outcome.ok,
                      result=redact(outcome.value), error=redact(outcome.error), max_per_session=cap)
    if item is None:  # only this session queues its items: not reached while review_room() counts
        karma.record(events.REVIEW_DROPPED, tool=tool, step_id=step_id, reason="the review inbox is full")
    else:
        karma.record(events.REVIEW_QUEUED, tool=tool, step_id=step_id, review_id=item["id"])


def build_session(deps: SessionDeps, state: SessionState, spec: SessionSpec = SessionSpec()) -> Session:
    """A session ready to plan, with ``state`` as it starts (the context orient is shown, the effort)."""
    settings, store, karma = deps.settings, deps.store, deps.karma
    agent_kv = spec.agent_kv or agent_view(store, karma, deps.id, settings)
    policy = spec.policy or ToolPolicy.from_settings(settings, on_secrets=learner(karma))
    registry = store.get_json(keys.CONFIG_TOOL_REGISTRY, default={})
    providers = spec.providers if spec.providers is not None else cascade(deps, agent_kv, policy)
    llm = LLM(models=deps.models, budget=deps.budget, record=karma.record, soul=deps.soul, providers=providers,
              fallback_model=deps.defaults.execution.fallback_model or deps.models.fallback_model,
              call_timeout=settings.llm_timeout, meter=spec.meter, on_anomaly=spec.on_anomaly, stop=deps.stop.check,
              screen=answer_screen(deps, policy))
    return Session(deps=deps, state=state, agent_kv=agent_kv, tool_policy=policy, llm=llm, tool_registry=registry)


def answer_screen(deps: SessionDeps, policy: ToolPolicy | None) -> Callable[[str, bool], bool] | None:
    """What looks through every model answer before anything uses or records it: secret text in one (the
    model spelling out a guess it was asked to, or a host leaking) is handled as code's is: recorded
    ``secret_refused``, the agent's code held, and the answer never shown. Marking where a guess matched
    (as karma's redaction would) would answer the guess, every step of every session."""
    return None if policy is None else screen_answers(deps.store, deps.karma, policy)


def screen_answers(store: Store, karma: Karma, policy: ToolPolicy) -> Callable[[str, bool], bool]:
    """:func:`answer_screen` for any recorder of model calls (a session, a scheduled run)."""
    scrubber = policy.scrubber(store)

    def screen(text: str, key_masked: bool) -> bool:
        # The client masks an exact echo of the key in a host's error before it gets here; whether that was
        # the host repeating its credential or quoting the agent's guess of it, nothing shows which.
        found = sorted({*scrubber.held(text), *([LLM_KEY] if key_masked else [])})
        if not found:
            return False
        karma.record(events.SECRET_REFUSED, source="llm", secrets=found, direction="in",
                     reason="secret text in a model's answer, a host's error or a prompt put together from "
                            "the agent's text, which can only come from a leak or a guess; not used or sent, "
                            "and the agent's code is held until the operator clears it (brainstem refusals "
                            "--clear)")
        policy.withdrawn.setdefault("tool", "the model")
        refusals.note(store, "the model")
        return True

    return screen


def learner(karma: Karma) -> Callable[[dict[str, str]], None]:
    """What a policy calls with the secrets it grants: the session's karma redacts them from then on."""
    def learn(secrets: dict[str, str]) -> None:
        for name, value in secrets.items():
            karma.redact.add(name, value)
    return learn


def agent_view(store: Store, karma: Karma, sid: str, settings: Settings) -> AgentKV:
    """The store as the agent's code and plans write it: checked (its schedules within the operator's limits),
    and every privileged write versioned."""
    return AgentKV(store, karma.record, on_privileged_write=lambda key, old, new, source: record_write(
        store, key, old, new, source=source, session_id=sid), limits=Limits.from_settings(settings))


# --- its parts ---

def check_ready(store: Store, settings: Settings, need_key: bool = True) -> tuple[str, str]:
    """The soul and the orient prompt, or a one-line misconfiguration error."""
    soul = store.get(keys.SOUL)
    if not soul or not soul.strip():
        raise ConfigError(f"no soul in {store.display_url}: run `brainstem seed --soul FILE` (or --example-soul)")
    orient = store.get(keys.PROMPT_ORIENT)
    if not orient or not orient.strip():
        raise ConfigError(f"no prompt:orient in {store.display_url}: run `brainstem seed`")
    if need_key and settings.llm_server == "openrouter" and settings.llm_api_key is None:
        raise ConfigError("BRAINSTEM_LLM_API_KEY is not set: set it (or point BRAINSTEM_LLM_BASE_URL at another "
                          "OpenAI-compatible server), or pass --llm-cassette FILE to answer from recorded answers")
    return soul, orient


def hardcoded_provider(settings: Settings) -> OpenRouterProvider:
    return OpenRouterProvider(settings.llm_base_url, settings.llm_key, max_attempts=settings.llm_max_attempts,
                              backoff_base=settings.llm_backoff)


def cascade(deps: SessionDeps, agent_kv: AgentKV, policy: ToolPolicy) -> list:
    """Tier 1 (the agent's adapter), tier 2 (its last working version), tier 3 (hard-coded)."""
    settings = deps.settings
    dynamic = dynamic_providers(deps.store, agent_kv, deps.karma.record, policy,
                                base_url=public_url(settings.llm_base_url), floors=settings.mode_floors(),
                                dry_run=deps.mode == "dry_run")
    return [*dynamic, hardcoded_provider(settings)]


_BUDGET = {name: f.default for name, f in SessionBudget.model_fields.items()}  # config's own defaults


def make_budget(defaults: Defaults, settings: Settings, left_today: float) -> Budget:
    """The agent's configured budget, clamped under the operator's ceilings and what is left of today's."""
    budget = Budget(
        max_cost=min(clamp(defaults.session_budget.max_cost, settings.max_session_cost, _BUDGET["max_cost"]),
                     left_today),
        max_steps=int(clamp(defaults.session_budget.max_steps, settings.max_session_steps, _BUDGET["max_steps"])),
        max_duration=clamp(defaults.session_budget.max_duration_seconds, settings.max_session_seconds,
                           _BUDGET["max_duration_seconds"]),
        reserve_fraction=defaults.execution.reflect_reserve_fraction)
    return budget
