"""Hard budgets: cost, steps and wall-clock time, under the operator's ceilings.

The agent asks for a budget (``config:defaults.session_budget``, then the
plan's ``session_budget``); the runtime clamps what it asks under the
operator's settings, which the agent cannot change. A slice of the cost and
time (``execution.reflect_reserve_fraction``) is kept for reflection, so a
session that runs out still ends with memory rather than off a cliff.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from . import keys
from .kv.base import Store
from .sleep import iso, now_utc

MAX_ANOMALIES_KEPT = 20


class BudgetExceeded(Exception):
    """A limit would be passed; ``limit`` is ``cost``, ``steps`` or ``time``."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


@dataclass
class Budget:
    max_cost: float
    max_steps: int
    max_duration: float
    reserve_fraction: float = 0.2
    spent: float = 0.0
    steps: int = 0
    t0: float = field(default_factory=time.monotonic)
    # Nested limits of running subplans: (absolute cost limit, absolute step limit).
    caps: list[tuple[float | None, int | None]] = field(default_factory=list)
    # Set from outside (SIGTERM in `brainstem run`): stop at the next step or call.
    cancel: threading.Event = field(default_factory=threading.Event)
    # Set by the session's lease heartbeat when another wake may hold the agent now: stop the same way.
    lost: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def cap(self, cost: float | None = None, steps: int | None = None):
        """Limit what runs inside the block to ``cost`` more USD and ``steps`` more steps."""
        self.caps.append((None if cost is None else self.spent + cost, None if steps is None else self.steps + steps))
        try:
            yield
        finally:
            self.caps.pop()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def cost_ceiling(self, use_reserve: bool = False) -> float:
        base = self.max_cost if use_reserve else self.max_cost * (1 - self.reserve_fraction)
        return min([base] + [c for c, _ in self.caps if c is not None])

    def binding_limit(self, use_reserve: bool = False) -> str:
        """``subplan`` when a subplan's own cost cap is what binds, else ``cost``."""
        base = self.max_cost if use_reserve else self.max_cost * (1 - self.reserve_fraction)
        return "subplan" if self.cost_ceiling(use_reserve) < base else "cost"

    def time_ceiling(self, use_reserve: bool = False) -> float:
        return self.max_duration if use_reserve else self.max_duration * (1 - self.reserve_fraction)

    def time_left(self, use_reserve: bool = False) -> float:
        return self.time_ceiling(use_reserve) - self.elapsed()

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise BudgetExceeded("interrupted", "the runtime is shutting down")
        if self.lost.is_set():
            raise BudgetExceeded("interrupted", "this session's wake lease was lost")

    def before_step(self) -> None:
        """Raise :class:`BudgetExceeded` if another step may not start."""
        self.check_cancel()
        if self.steps >= self.max_steps:
            raise BudgetExceeded("steps", f"step budget used: {self.steps} of {self.max_steps} steps")
        if self.time_left() <= 0:
            raise BudgetExceeded("time", f"time budget used: {self.elapsed():.1f}s of {self.time_ceiling():.1f}s")
        if self.spent >= self.cost_ceiling():
            raise BudgetExceeded(self.binding_limit(),
                                 f"cost budget used: ${self.spent:.4f} of ${self.cost_ceiling():.4f}")
        for _cost_cap, step_cap in self.caps:
            if step_cap is not None and self.steps >= step_cap:
                raise BudgetExceeded("subplan", "the subplan has used its step budget")

    def snapshot(self) -> dict:
        return {"spent": round(self.spent, 6), "max_cost": self.max_cost, "steps": self.steps,
                "max_steps": self.max_steps, "elapsed_s": round(self.elapsed(), 2),
                "max_duration_s": self.max_duration}


def clamp(requested: float | None, ceiling: float, default: float) -> float:
    """The agent's request (or the default), never above the operator's ceiling, never negative."""
    value = default if requested is None else requested
    return max(0.0, min(float(value), float(ceiling)))


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def daily_spent(store: Store) -> float:
    """USD spent on LLM calls today (UTC), across sessions."""
    rec = store.get_json(keys.DAILY_COST, default=None)
    if isinstance(rec, dict) and rec.get("date") == today() and isinstance(rec.get("usd"), (int, float)):
        return float(rec["usd"])
    return 0.0


def add_daily(store: Store, usd: float) -> float:
    """Add to today's spend, under a short lock of its own: a session is not the only spender (a dry run,
    a live replay or ``tool run`` may spend beside it), and a lost update would under-count real money."""
    owner = f"{os.getpid()}:{threading.get_ident()}:{time.monotonic_ns()}"
    deadline = time.monotonic() + DAILY_LOCK_WAIT
    held = store.acquire_lock(keys.DAILY_COST, owner, int(DAILY_LOCK_WAIT * 1000))
    while not held and time.monotonic() < deadline:
        time.sleep(0.005)
        held = store.acquire_lock(keys.DAILY_COST, owner, int(DAILY_LOCK_WAIT * 1000))
    try:  # a holder that died lets go when its lock expires; past the wait, the spend is still added
        total = daily_spent(store) + usd
        store.put(keys.DAILY_COST, {"date": today(), "usd": round(total, 8)})
    finally:
        if held:
            store.release_lock(keys.DAILY_COST, owner)
    return total


DAILY_LOCK_WAIT = 2.0



def note_anomaly(store: Store, anomaly: dict, session_id: str | None = None) -> None:
    """Keep a call whose reported cost exceeded its worst case where ``status`` shows it (today's, newest last).

    The cost itself is already in today's spend: it was billed. This is so the operator sees why.
    """
    rec = store.get_json(keys.COST_ANOMALIES, default=None)
    items = rec.get("items", []) if isinstance(rec, dict) and rec.get("date") == today() else []
    items = [*items, {**anomaly, "session_id": session_id,
                      "at": iso(now_utc())}][-MAX_ANOMALIES_KEPT:]
    store.put(keys.COST_ANOMALIES, {"date": today(), "items": items})


def anomalies_today(store: Store) -> list[dict]:
    rec = store.get_json(keys.COST_ANOMALIES, default=None)
    if isinstance(rec, dict) and rec.get("date") == today() and isinstance(rec.get("items"), list):
        return [i for i in rec["items"] if isinstance(i, dict)]
    return []


def correct_anomaly(store: Store, number: int, billed: float) -> tuple[dict, float]:
    """The operator's correction of today's anomaly ``number`` (1-based, as ``status`` lists them):
    the provider billed ``billed`` USD for it, not what it reported. Today's spend drops by the
    difference and nothing else; the anomaly stays listed, marked corrected. Returns (the anomaly,
    today's spend after). ``ValueError`` when there is no such anomaly or it is corrected already."""
    items = anomalies_today(store)
    if not 1 <= number <= len(items):
        raise ValueError(f"no cost anomaly number {number} today "
                         f"(there are {len(items)}; `brainstem status` lists them)")
    item = items[number - 1]
    if "corrected_to" in item:
        raise ValueError(f"cost anomaly {number} was corrected already (to ${item['corrected_to']:.4f})")
    reported = float(item.get("reported") or 0.0)
    if not 0 <= billed <= reported:
        raise ValueError(f"--billed must be between 0 and the ${reported:.4f} that was reported")
    total = max(0.0, add_daily(store, billed - reported))
    item.update(corrected_to=billed, corrected_at=iso(now_utc()))
    store.put(keys.COST_ANOMALIES, {"date": today(), "items": items})
    return item, total
