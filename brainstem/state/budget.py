"""Hard budgets: cost, steps and wall-clock time, under the operator's ceilings.

The agent asks for a budget (``config:defaults.session_budget``, then the
plan's ``session_budget``); the runtime clamps what it asks under the
operator's settings, which the agent cannot change. A slice of the cost and
time (``execution.reflect_reserve_fraction``) is kept for reflection, so a
session that runs out still ends with memory rather than off a cliff.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.state.runway import note_day
from brainstem.store.base import Store

MAX_ANOMALIES_KEPT = 20
# A hold outlives the longest its request can take by this much; past that, its process is taken to
# have died between reserve and settle, and the hold stops counting.
HOLD_MARGIN_S = 60.0


class BudgetExceeded(Exception):
    """A limit would be passed; ``limit`` is ``cost``, ``steps``, ``time``, ``subplan`` or ``daily``
    (the operator's ceiling on today's spend)."""

    def __init__(self, limit: str, message: str):
        super().__init__(message)
        self.limit = limit


class DailyLedger:
    """Today's spend against the operator's daily ceiling, kept in the store, so every process of the
    agent (its session, a dry run, a live replay, each ``brainstem tool run``) books against one total.

    Before a metered request its worst case is held (atomically: refused if the day's spend plus every
    live hold would pass the ceiling); after the answer the hold is replaced by the actual cost.
    ``billable()``, when given, says whether the call just answered cost real money (a live replay's
    recorded answers do not)."""

    def __init__(self, store: Store, ceiling: float, billable: Callable[[], bool] | None = None):
        self.store = store
        self.ceiling = float(ceiling)
        self.billable = billable

    def left(self) -> float:
        spent, held = self.store.daily_spend(today())
        return self.ceiling - spent - held

    def reserve(self, token: str, usd: float, ttl_s: float) -> bool:
        return self.store.reserve_spend(today(), usd, self.ceiling, token, ttl_s)

    def settle(self, token: str | None, usd: float) -> None:
        if self.billable is not None and not self.billable():
            usd = 0.0
        day = today()
        total = self.store.settle_spend(day, token, usd)
        if usd > 0:
            note_day(self.store, day, total)  # the day's total outlives the day: the runway's mean

    def simulate(self, usd: float) -> None:
        """Note what a simulated call (answered from a cassette) would have cost, apart from today's spend."""
        add_simulated(self.store, usd)


@dataclass
class Hold:
    """One request's worst case, held until it is settled at its actual cost."""
    token: str
    usd: float
    daily: bool  # held in the store against today's ceiling too
    settled: bool = False
    simulated: bool = False  # answered from a cassette: the session's budget counts it, today's spend never


@dataclass
class Budget:
    max_cost: float
    max_steps: int
    max_duration: float
    reserve_fraction: float = 0.2
    spent: float = 0.0
    simulated: float = 0.0  # the part of ``spent`` that moved no money (calls answered from a cassette)
    steps: int = 0
    t0: float = field(default_factory=time.monotonic)
    # Nested limits of running subplans: (absolute cost limit, absolute step limit).
    caps: list[tuple[float | None, int | None]] = field(default_factory=list)
    # Today's spend across processes; None: this budget alone (tests, recorded replays).
    daily: DailyLedger | None = None
    # Worst cases of requests in flight: token -> (USD, monotonic deadline).
    _holds: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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

    @property
    def held(self) -> float:
        """USD held for requests in flight (a hold whose request never came back stops at its deadline)."""
        now = time.monotonic()
        return sum(usd for usd, deadline in list(self._holds.values()) if deadline > now)

    def headroom(self, use_reserve: bool = False, simulated: bool = False) -> tuple[float, str]:
        """(USD a new request may still cost, the limit that binds: ``cost``, ``subplan`` or ``daily``).
        Today's is read from the store: other processes spend beside this one. A ``simulated`` request
        moves no money, so today's ceiling does not bind it (the session's budget still does)."""
        left = self.cost_ceiling(use_reserve) - self.spent - self.held
        limit = self.binding_limit(use_reserve)
        if self.daily is not None and not simulated:
            day = self.daily.left()
            if day < left:
                left, limit = day, "daily"
        return left, limit

    def reserve(self, usd: float, *, use_reserve: bool = False, ttl_s: float, simulated: bool = False) -> Hold:
        """Hold ``usd`` (a request's worst case) against this budget and today's ceiling, before the
        request is sent; :class:`BudgetExceeded` (``daily`` when today's is what binds) if it would
        pass either. Settle it with :meth:`settle` once the answer says what it cost. A ``simulated``
        request (a cassette's answer) is held against this budget only: it moves no money."""
        usd = float(usd)
        if not math.isfinite(usd) or usd < 0:
            raise BudgetExceeded("cost", f"a request whose worst case is ${usd} cannot be priced")
        token = uuid.uuid4().hex
        with self._lock:
            ceiling = self.cost_ceiling(use_reserve)
            if self.spent + self.held + usd > ceiling + 1e-9:
                raise BudgetExceeded(self.binding_limit(use_reserve),
                                     f"a request that could cost ${usd:.4f} would pass the budget: ${self.spent:.4f} "
                                     f"spent and ${self.held:.4f} held of {dollars(ceiling)}")
            self._holds[token] = (usd, time.monotonic() + ttl_s)
        if self.daily is None or simulated:
            return Hold(token, usd, daily=False, simulated=simulated)
        try:
            ok = self.daily.reserve(token, usd, ttl_s)
        except BaseException:
            self._holds.pop(token, None)
            raise
        if not ok:
            self._holds.pop(token, None)
            raise BudgetExceeded("daily", f"a request that could cost ${usd:.4f} would pass today's ceiling of "
                                          f"{dollars(self.daily.ceiling)} (spent and held by every process of this "
                                          f"agent)")
        return Hold(token, usd, daily=True)

    def settle(self, hold: Hold | None, usd: float) -> None:
        """Charge ``usd`` (what a request cost) and let its hold go; ``hold`` None: a charge with no hold.
        A hold is settled once; settling it again does nothing."""
        with self._lock:
            if hold is not None:
                if hold.settled:
                    return
                hold.settled = True
                self._holds.pop(hold.token, None)
            self.spent += usd
            if hold is not None and hold.simulated:
                self.simulated += usd
        if self.daily is None:
            return
        if hold is not None and hold.simulated:
            if usd:
                self.daily.simulate(usd)
        else:
            self.daily.settle(hold.token if hold is not None and hold.daily else None, usd)

    def release(self, hold: Hold | None) -> None:
        """Let a hold go unspent (the request was not sent, or was answered with nothing billed)."""
        if hold is not None and not hold.settled:
            self.settle(hold, 0.0)

    def time_ceiling(self, use_reserve: bool = False) -> float:
        return self.max_duration if use_reserve else self.max_duration * (1 - self.reserve_fraction)

    def time_left(self, use_reserve: bool = False) -> float:
        return self.time_ceiling(use_reserve) - self.elapsed()

    def before_step(self) -> None:
        """Raise :class:`BudgetExceeded` if another step may not start."""
        if self.steps >= self.max_steps:
            raise BudgetExceeded("steps", f"step budget used: {self.steps} of {self.max_steps} steps")
        if self.time_left() <= 0:
            raise BudgetExceeded("time", f"time budget used: {self.elapsed():.1f}s of {self.time_ceiling():.1f}s")
        if self.spent >= self.cost_ceiling():
            raise BudgetExceeded(self.binding_limit(),
                                 f"cost budget used: ${self.spent:.4f} of {dollars(self.cost_ceiling())}")
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


def dollars(usd: float, least: int = 4) -> str:
    """An amount in USD with ``least`` digits, or up to six when fewer would round it into another number
    (a ceiling of $0.000001 is not "$0.0000")."""
    digits = next((d for d in range(least, 6) if abs(round(usd, d) - usd) < 1e-12), 6)  # float noise is no digit
    return f"${usd:,.{digits}f}"


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def daily_spent(store: Store) -> float:
    """USD spent on LLM calls today (UTC), across sessions."""
    rec = store.get_json(keys.DAILY_COST, default=None)
    if isinstance(rec, dict) and rec.get("date") == today() and isinstance(rec.get("usd"), (int, float)):
        return float(rec["usd"])
    return 0.0


def simulated_today(store: Store) -> float:
    """USD that calls answered from a cassette would have cost today (UTC): shown apart, never spent."""
    rec = store.get_json(keys.DAILY_SIMULATED_COST, default=None)
    if isinstance(rec, dict) and rec.get("date") == today() and isinstance(rec.get("usd"), (int, float)):
        return float(rec["usd"])
    return 0.0


def add_simulated(store: Store, usd: float) -> None:
    """Add to today's simulated spend. A plain read and write, not the ledger's atomic settle: it is a
    figure shown to the operator, never a limit, so a rare lost update between processes costs nothing."""
    store.put(keys.DAILY_SIMULATED_COST, {"date": today(), "usd": round(simulated_today(store) + usd, 10)})


def daily_reserved(store: Store) -> float:
    """USD held now by requests in flight (every process of the agent), not yet in today's spend."""
    return store.daily_spend(today())[1]


def add_daily(store: Store, usd: float) -> float:
    """Add to today's spend (negative: a correction; never below 0), atomically in the store: a session
    is not the only spender (a dry run, a live replay or ``tool run`` may spend beside it), and a lost
    update would under-count real money. Returns today's spend after."""
    day = today()
    total = store.settle_spend(day, None, usd)
    note_day(store, day, total, exact=usd < 0)
    return total


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
