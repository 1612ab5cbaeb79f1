"""Where the agent stands, for ``brainstem status`` and ``brainstem sessions``: read-only views of the store."""

from __future__ import annotations

from typing import Any

from . import history, keys
from .budget import daily_spent
from .config import load_defaults
from .karma import unfinished_session
from .kv.base import Store
from .reflect import deep_reflect_due
from .settings import Settings
from .sleep import now_utc, sleeping_until
from .versions import failing_streak


def status(store: Store, settings: Settings) -> dict[str, Any]:
    problems: list[str] = []
    defaults = load_defaults(store, problems)
    hist = history.read(store)
    last = hist[-1] if hist else None
    wake_config = store.get_json(keys.WAKE_CONFIG, default=None)
    until = sleeping_until(wake_config, now_utc())
    number = store.get_json(keys.SESSION_COUNTER, default=0)
    due, why = deep_reflect_due(store, defaults, (number if isinstance(number, int) else 0) + 1)
    running = unfinished_session(store)
    lock = store.lock_owner(keys.WAKE_LOCK)
    truth = store.get_json("stats:last_ground_truth", default=None)
    return {
        "store": store.display_url,
        "soul_present": bool((store.get(keys.SOUL) or "").strip()),
        "sessions": number,
        "last_session": last,
        "running": {"session": running, "lock_holder": lock} if (running or lock) else None,
        "failing_in_a_row": len(failing_streak(hist)),
        "cost_today": round(daily_spent(store), 6),
        "daily_ceiling": settings.max_daily_cost,
        "session_ceiling": settings.max_session_cost,
        "balances_last_seen": truth,
        "next_wake_after": (wake_config or {}).get("next_wake_after") if isinstance(wake_config, dict) else None,
        "asleep": until is not None,
        "deep_reflection_due_next_wake": due,
        "deep_reflection": why,
        "config_problems": problems or None,
    }
