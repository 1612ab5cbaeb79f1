"""What one session carries: its id, store views, recorder, config, budget and LLM chokepoint.

Built once by ``wake.py``; the executor and reflection read from it. It holds
no behaviour of its own beyond routing a tool run through the sandbox with
the session's grants.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from brainstem.core.settings import Settings
from brainstem.llm.chokepoint import LLM
from brainstem.state import lineage
from brainstem.state.budget import Budget
from brainstem.state.config import Defaults, Models
from brainstem.state.guarded import AgentKV
from brainstem.store.base import Store
from brainstem.store.karma import Karma
from brainstem.tools.services import ToolOutcome, ToolPolicy, run_tool


@dataclass
class Session:
    id: str
    number: int
    settings: Settings
    store: Store
    karma: Karma
    agent_kv: AgentKV
    defaults: Defaults
    models: Models
    budget: Budget
    llm: LLM
    soul: str
    effort: str = "low"
    tool_registry: Any = None
    context: dict = field(default_factory=dict)
    reads: Counter = field(default_factory=Counter)  # keys read this session (memory hygiene)
    tool_policy: ToolPolicy | None = None  # secrets, egress, metering and write quotas of this session's tools
    mode: str = "live"  # "live", "dry_run" (no tool runs) or "replay" (a recorded session, in an overlay)

    def record(self, event: str, **fields: Any) -> dict:
        return self.karma.record(event, **fields)

    def run_tool(self, name: str, args: Any, attempt: int = 1, step_id: str | None = None) -> ToolOutcome:
        left_ms = int(self.budget.time_left() * 1000)

        def supervised(outcome: ToolOutcome) -> None:  # the run waits for the operator's verdict
            from brainstem.core import events
            from brainstem.state import review

            item = review.add(self.store, tool=name, session_id=self.id, step_id=step_id,
                              input=self.karma.redact(args), ok=outcome.ok,
                              result=self.karma.redact(outcome.value), error=self.karma.redact(outcome.error))
            self.record(events.REVIEW_QUEUED, tool=name, step_id=step_id, review_id=item["id"])

        # The operator's BRAINSTEM_TOOL_MODES, following the code through renames and copies.
        floor = lineage.floor(self.store, name, self.settings.mode_floors()) if isinstance(name, str) else None
        return run_tool(name, args, store=self.store, agent_kv=self.agent_kv, record=self.record,
                        policy=self.policy(), attempt=attempt, step_id=step_id, max_timeout_ms=max(50, left_ms),
                        on_read=self.reads.update, dry_run=self.mode == "dry_run", enforce_mode=True,
                        on_supervised=supervised, mode_floor=floor)

    def policy(self) -> ToolPolicy:
        if self.tool_policy is None:
            self.tool_policy = ToolPolicy.from_settings(self.settings, on_secrets=self.learn_secrets)
        return self.tool_policy

    def learn_secrets(self, secrets: dict[str, str]) -> None:
        for name, value in secrets.items():
            self.karma.redact.add(name, value)

    def models_for_prompt(self) -> list[dict]:
        return [{"alias": m.alias, "id": m.id, "input_cost_per_mtok": m.input_cost_per_mtok,
                 "output_cost_per_mtok": m.output_cost_per_mtok, "supports_reasoning": m.supports_reasoning}
                for m in self.models.models]
