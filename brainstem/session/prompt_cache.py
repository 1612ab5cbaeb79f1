"""A session's prompts laid out for the provider's prompt cache: stable part first, volatile part last.

A provider caches a prompt's prefix, so what two calls share must come first
and be the same bytes. The orient and reflect prompts are rendered in parts,
cut at the start of a line: the instructions, models, tools and config (the
same from session to session), then the keys the agent chose to load (its
wisdom: the same until it rewrites them), then everything that changes every
session (the time, the balances, the inbox, crash data, the last
reflection). A template that mixes them is cut where each later kind first
appears, so the text sent is always exactly the whole template rendered.

Whether the parts are marked for caching is the chokepoint's decision, from
the model's cache prices and :func:`next_session`: when this prompt is
expected again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from brainstem.core.templates import PLACEHOLDER, render
from brainstem.llm.cache import TTL_SECONDS, Reuse
from brainstem.state import history as session_history

STABLE, LOADED, VOLATILE = 0, 1, 2
LOADED_NAMES = ("context.additionalContext", "context.additionalContextNotes")
# A session that shows the operator messages is in a conversation: the operator reads the reply and may
# answer at once (an urgent message wakes the agent), so another session is expected within minutes.
FOLLOW_UP_S = 120.0


def orient_kind(name: str) -> int:
    """How often an orient variable changes: the session's context every session, save the loaded keys."""
    if name.startswith(LOADED_NAMES):
        return LOADED
    return VOLATILE if name == "context" or name.startswith("context.") else STABLE


def reflect_kind(name: str) -> int:
    """Every reflect variable is the session's own (its plan, karma, results, cost)."""
    return VOLATILE


def split(template: str, kind: Callable[[str], int]) -> list[str]:
    """``template`` cut, at line starts, before the first placeholder of each kind that changes more often
    than the ones before it; joined, the parts are the template."""
    cuts: list[int] = []
    current = STABLE
    for m in PLACEHOLDER.finditer(template):
        k = kind(m.group(1))
        if k <= current:
            continue
        current = k
        at = template.rfind("\n", 0, m.start()) + 1
        if at > (cuts[-1] if cuts else 0):
            cuts.append(at)
    bounds = [0, *cuts, len(template)]
    return [template[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def render_parts(template: str, variables: Mapping[str, Any], kind: Callable[[str], int],
                 on_missing: Callable[[str], None] | None = None) -> list[str]:
    """The template rendered part by part (see :func:`split`): joined, exactly ``render(template)``."""
    return [render(part, variables, on_missing=on_missing) for part in split(template, kind)]


def next_session(session) -> Reuse | None:
    """When this session's orient and reflect prompts are expected again: in a conversation with the operator
    within minutes; else after about as long as the last gap between sessions, when that was under a cache
    lifetime (each session then refreshes the entry: counted as the sessions in the next hour)."""
    if session.state.inbox_ids:
        return Reuse(after_s=FOLLOW_UP_S)
    recent = session_history.recent(session.deps.store, 1)
    ended = recent[-1].get("ended_at") if recent else None
    try:
        gap = (session.deps.started - datetime.fromisoformat(str(ended).replace("Z", "+00:00"))).total_seconds()
    except (TypeError, ValueError):
        return None
    if gap < 0 or gap > max(TTL_SECONDS.values()):
        return None
    return Reuse(after_s=gap, times=max(1, int(TTL_SECONDS["1h"] // max(gap, 1.0))))
