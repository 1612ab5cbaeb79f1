"""How long the LLM balance lasts: each recent day's spend, their mean, and the runway it gives.

Today's spend (``stats:daily_cost``) is one value the store settles atomically, and it starts again at
0 each UTC day. So that the days before today are still known, every settle also notes the day's total
as it stands in ``stats:spend_days`` (a plain read and write: each writer notes the total the store
gave it, and a day's figure never goes down but by the operator's correction). What the runway is worked
out from is only ever the last :data:`WINDOW_DAYS` UTC days, today included.

The runway is the balance divided by the mean daily spend over those days: the days the ledger has
seen, at most seven (an agent two days old is not taken to have spent nothing for five). It is
unknown (None) when either is: no balance read, or nothing spent in the window.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

from brainstem.core import keys
from brainstem.core.json_numbers import finite
from brainstem.store.base import Store
from brainstem.store.fenced import unfenced

WINDOW_DAYS = 7
KEEP_DAYS = WINDOW_DAYS + 1  # a day more than the window, so the window is whole just after midnight


def note_day(store: Store, day: str, total: float, exact: bool = False) -> None:
    """Note ``day``'s total spend as the store settled it. Never lowers a day's figure (another process
    may note an older total after a newer one), except ``exact`` (an operator's correction)."""
    rec = _read(store)
    days = rec["days"]
    old = days.get(day, 0.0)
    days[day] = round(max(0.0, float(total)) if exact else max(old, float(total)), 10)
    if exact or days[day] != old or day not in rec["raw_days"]:
        kept = dict(sorted(days.items())[-KEEP_DAYS:])
        # Money spent is noted whoever holds the lease, as today's spend is settled: unfenced.
        unfenced(store).put(keys.SPEND_DAYS, {"since": rec["since"] or day, "days": kept})


def spend_by_day(store: Store, today: date | None = None) -> tuple[dict[str, float], int]:
    """(each day of the window the ledger knows, by ISO date; how many days of the window the ledger
    covers: from the first day it saw, or the window's start, to today, at least 1)."""
    today = today or datetime.now(timezone.utc).date()
    start = today - timedelta(days=WINDOW_DAYS - 1)
    rec = _read(store)
    days = {d: v for d, v in rec["days"].items() if start.isoformat() <= d <= today.isoformat()}
    since = _day(rec["since"]) or _day(min(rec["days"], default=None)) or today
    covered = (today - max(start, min(since, today))).days + 1
    return days, max(1, min(WINDOW_DAYS, covered))


def mean_daily_spend(store: Store, today_spent: float | None = None, today: date | None = None) -> float | None:
    """USD a day, on average, over the last :data:`WINDOW_DAYS` days the ledger covers; None when nothing was
    spent in them (there is nothing to average). ``today_spent``: today's spend as the ledger of today's
    ceiling has it (it may be ahead of the note)."""
    today = today or datetime.now(timezone.utc).date()
    days, covered = spend_by_day(store, today)
    if today_spent is not None:
        days[today.isoformat()] = max(days.get(today.isoformat(), 0.0), today_spent)
    total = sum(days.values())
    return total / covered if total > 0 else None


def runway_days(credit: float | None, mean_spend: float | None) -> float | None:
    """Days the balance lasts at that mean spend; None when either is unknown (or nothing is spent)."""
    if credit is None or mean_spend is None or mean_spend <= 0:
        return None
    return max(0.0, credit) / mean_spend


def stretch(runway: float | None, min_days: float | None) -> float | None:
    """By how much to stretch the agent's sleep (above 1) while the runway is under ``min_days``: the factor
    that slows the spend enough for the balance to last them. None: no stretch."""
    if runway is None or min_days is None or runway >= min_days:
        return None
    return min_days / runway if runway > 0 else float("inf")


def last_credit(store: Store) -> tuple[float | None, str | None]:
    """(the LLM credit last seen, when): the newer of the runtime's own read (``stats:llm_credit``) and the
    last ground truth's; (None, None) when neither knows it."""
    seen = []
    own = store.get_object(keys.LLM_CREDIT)
    if isinstance(own.get("at"), str) and "credit" in own:
        seen.append((own["at"], finite(own.get("credit"))))
    truth = store.get_object(keys.LAST_GROUND_TRUTH)
    balances = truth.get("balances") if isinstance(truth.get("balances"), dict) else {}
    if isinstance(truth.get("at"), str):
        seen.append((truth["at"], finite(balances.get("openrouter"))))
    if not seen:
        return None, None
    at, credit = max(seen, key=lambda s: s[0])  # ISO times in UTC compare as text
    return credit, at


def outlook(store: Store, today_spent: float, offered: bool) -> dict[str, Any]:
    """What ``status`` and the metrics show: ``llm_credit`` (None: unknown, or not offered by the server),
    when it was read, the mean daily spend and the ``runway_days`` they give."""
    credit, at = last_credit(store) if offered else (None, None)
    mean = mean_daily_spend(store, today_spent)
    days = runway_days(credit, mean)
    return {"llm_credit": credit, "llm_credit_at": at, "mean_daily_spend": None if mean is None else round(mean, 6),
            "runway_days": None if days is None else round(days, 2)}


def _read(store: Store) -> dict[str, Any]:
    rec = store.get_json(keys.SPEND_DAYS, default=None)
    raw = rec.get("days") if isinstance(rec, dict) and isinstance(rec.get("days"), dict) else {}
    days = {d: v for d, v in ((str(d), finite(v)) for d, v in raw.items()) if v is not None and _day(d)}
    since = rec.get("since") if isinstance(rec, dict) and _day(rec.get("since")) else None
    return {"days": days, "raw_days": raw, "since": since}


def _day(text: Any) -> date | None:
    try:
        return date.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
