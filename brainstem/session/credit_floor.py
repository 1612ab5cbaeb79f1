"""The real LLM balance as a floor, and a circuit breaker after a 402: no paid call the money is not there for.

Before a session spends anything (before the agent's balance checkers, reflexes or orient), the runtime
reads the LLM credit itself, free (:func:`brainstem.llm.credit.fetch_credit`, OpenRouter's ``/key`` and
``/credits``), when the server offers one and something hangs on it: ``BRAINSTEM_MIN_CREDIT``, an open
breaker, or ``BRAINSTEM_MIN_RUNWAY_DAYS``. A generic OpenAI-compatible server offers no balance: nothing
is read, and only the breaker's backoff holds there.

* The floor: a balance read below ``BRAINSTEM_MIN_CREDIT`` keeps the session from every paid call: it ends
  ``llm_no_credit`` before anything runs. A balance that cannot be read holds nothing back (the floor
  cannot tell), and karma says why it is unknown.
* The breaker: a session that ended ``llm_no_credit`` from the server's 402 opens it. While it is open no
  paid call is made: a wake ends ``llm_no_credit`` at once, unless a free balance read shows credit again
  (above the floor and above what it was at the 402), which closes it, or, where the read cannot tell
  (no balance offered or readable, or the same balance the 402 came with), the fault backoff since the
  last 402 has passed: then one session may try (``probe``), and a 402 again opens it for longer. A read
  that shows no credit at all keeps it open whatever the time.
* The operator is told once (the inbox, as ``from: runtime``, and Telegram when it is set up), when the
  money first runs out; not again until credit has come back and run out once more.

Everything is kept in ``stats:llm_credit``, which is runtime-owned: the agent can neither read a way round
it nor clear it. The sleep after such a session is the fault backoff every operator fault gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from brainstem.core import events, keys, outcomes
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import BrainstemError
from brainstem.core.json_numbers import finite
from brainstem.core.settings import Settings
from brainstem.llm.credit import fetch_credit
from brainstem.state import inbox, runway
from brainstem.state.budget import daily_spent
from brainstem.store.base import Store
from brainstem.store.karma import Karma
from brainstem.tools.bot_api import SEND_TIMEOUT
from brainstem.tools.operator_chat import NotSent, send
from brainstem.tools.policy import ToolPolicy

FLOOR, BREAKER = "floor", "breaker"


@dataclass
class Verdict:
    """What the runtime found before the session spends: whether it may (``blocked`` None) and why not,
    the credit it read itself (``read``: whether it read one), and the runway that gives."""
    blocked: str | None = None
    cause: str | None = None  # FLOOR or BREAKER when blocked
    credit: float | None = None
    why_unknown: str | None = None
    read: bool = False
    runway: dict | None = None  # {"runway_days", "mean_daily_spend", "min_runway_days", "stretch"}


def offered(settings: Settings) -> bool:
    """Whether the LLM server offers a balance the runtime can read (OpenRouter, with a key to ask with)."""
    return settings.llm_server == "openrouter" and settings.llm_key is not None


def load(store: Store) -> dict[str, Any]:
    """``stats:llm_credit`` as a dict (a value that is not one, written around the runtime: empty)."""
    return dict(store.get_object(keys.LLM_CREDIT))


def check(settings: Settings, store: Store, karma: Karma, *, timeout: float, now: datetime | None = None) -> Verdict:
    """Read the credit if anything hangs on it, and say whether the session may make a paid call."""
    now = now or now_utc()
    state = load(store)
    before = dict(state)
    verdict = Verdict()
    breaker = state.get("breaker") if isinstance(state.get("breaker"), dict) else None
    floor = settings.min_credit
    if offered(settings) and (floor is not None or breaker is not None or settings.min_runway_days is not None):
        why: list[str] = []
        verdict.credit = fetch_credit(base_url=settings.llm_base_url, api_key=settings.llm_key, timeout=timeout,
                                      why=why)
        verdict.read, verdict.why_unknown = True, (why[-1] if why and verdict.credit is None else None)
        state.update(credit=verdict.credit, at=iso(now), why_unknown=verdict.why_unknown)
    credit = verdict.credit
    if floor is not None and credit is not None and credit < floor:
        verdict.blocked, verdict.cause = (f"the LLM credit, ${credit:.4f}, is below BRAINSTEM_MIN_CREDIT "
                                          f"(${floor:.4f}): no paid call was made"), FLOOR
        was = _part(state, "floor")
        state["floor"] = {"since": was.get("since") or iso(now), "credit": credit, "min_credit": floor}
    else:
        state.pop("floor", None)
    if verdict.blocked is None and breaker is not None:
        verdict.blocked = _breaker(breaker, state, karma, credit, max(floor or 0.0, 0.0), now)
        verdict.cause = BREAKER if verdict.blocked else None
    if verdict.blocked is None and "floor" not in state and "breaker" not in state:
        state.pop("told", None)  # the money is there: the next time it runs out, the operator is told again
    if verdict.blocked is not None:
        karma.record(events.CREDIT_FLOOR, cause=verdict.cause, credit=credit, min_credit=floor,
                     why_unknown=verdict.why_unknown, probe_after=(state.get("breaker") or {}).get("probe_after"),
                     reason=verdict.blocked)
    verdict.runway = _runway(settings, store, credit)
    if state != before:  # the sleep path of an agent with nothing set writes nothing here
        store.put(keys.LLM_CREDIT, state)
    return verdict


def _breaker(breaker: dict, state: dict, karma: Karma, credit: float | None, floor: float,
             now: datetime) -> str | None:
    """Whether the open breaker still keeps the session from paid calls (why), closing it or letting one
    session try as its state says."""
    at_trip = finite(breaker.get("credit_at_trip"))
    if credit is not None and credit > floor and (at_trip is None or credit > at_trip):
        state.pop("breaker", None)
        karma.record(events.CREDIT_BREAKER, state="closed", credit=credit, opened_at=breaker.get("opened_at"))
        return None
    probe_after = parse_iso(breaker.get("probe_after"))
    if credit is not None and credit <= floor:
        return (f"the LLM server answered 402 (out of credit) at {breaker.get('opened_at')}, and the balance "
                f"read now, ${credit:.4f}, shows no credit: no paid call was made")
    if probe_after is None or now >= probe_after:
        karma.record(events.CREDIT_BREAKER, state="probe", credit=credit, trips=breaker.get("trips"),
                     opened_at=breaker.get("opened_at"))
        return None
    return (f"the LLM server answered 402 (out of credit) at {breaker.get('opened_at')}: no paid call until a "
            f"balance read shows credit again or {iso(probe_after)}")


def trip(settings: Settings, store: Store, karma: Karma, session_id: str, default_sleep: float, timeout: float,
         now: datetime | None = None) -> dict:
    """A session ended ``llm_no_credit`` on the server's 402: open the breaker (or, after a try, open it
    again for longer: the fault backoff of one more 402 in a row), noting the balance (read free, when
    offered) it came with. Returns the breaker."""
    credit = (fetch_credit(base_url=settings.llm_base_url, api_key=settings.llm_key, timeout=timeout)
              if offered(settings) else None)
    now = now or now_utc()
    state = load(store)
    old = _part(state, "breaker")
    trips = int(finite(old.get("trips")) or 0) + 1
    breaker = {"opened_at": old.get("opened_at") or iso(now), "last_402_at": iso(now), "trips": trips,
               "credit_at_trip": credit, "session_id": session_id,
               "probe_after": iso(now + timedelta(seconds=outcomes.fault_backoff(trips, default_sleep)))}
    state["breaker"] = breaker
    store.put(keys.LLM_CREDIT, state)
    karma.record(events.CREDIT_BREAKER, state="open", credit=credit, trips=trips, probe_after=breaker["probe_after"])
    return breaker


def tell_once(store: Store, karma: Karma, policy: ToolPolicy | None, text: str) -> bool:
    """Tell the operator ``text`` (the inbox; Telegram too when it is set up) unless they were told already
    since the money last ran out. True when this call told them."""
    state = load(store)
    if state.get("told"):
        return False
    message = inbox.post(store, text, sender="runtime", extra={"via": "credit_floor"})
    telegram: str | None = None
    if policy is not None and policy.telegram is not None:
        try:
            sent = send(policy, text, SEND_TIMEOUT, tool="runtime", record=karma.record, charge=_free)
            telegram = f"sent:{sent.get('message_id')}"
        except (NotSent, BrainstemError) as exc:
            telegram = f"not sent: {exc}"[:300]
    state = load(store)  # as it is now: the send took time
    state["told"] = {"at": iso(now_utc()), "inbox_id": message["id"], "telegram": telegram}
    store.put(keys.LLM_CREDIT, state)
    karma.record(events.OPERATOR_NOTICE, about="llm_credit", text=text, inbox_id=message["id"], telegram=telegram)
    return True


def notice(verdict_reason: str, breaker: dict | None = None) -> str:
    """The operator's one notice: what happened and what to do."""
    how = ("add credit at the provider: the next wake reads the balance (free) and goes on as soon as it "
           "shows credit")
    if breaker is not None and breaker.get("probe_after"):
        how += f"; where it cannot tell, one paid try is made after {breaker['probe_after']}"
    return f"The agent's LLM credit ran out: {verdict_reason}. Until then the agent makes no paid LLM call; {how}."


def blocked_now(store: Store, now: datetime | None = None) -> str | None:
    """Why a paid call must not be made now, from what the last wake found (no read of its own: for a
    schedule's summary between wakes), or None."""
    state = load(store)
    if isinstance(state.get("floor"), dict):
        return "the LLM credit is below BRAINSTEM_MIN_CREDIT"
    breaker = state.get("breaker")
    if isinstance(breaker, dict):
        probe_after = parse_iso(breaker.get("probe_after"))
        if probe_after is not None and (now or now_utc()) < probe_after:
            return "the LLM server answered 402 (out of credit) and no balance read has shown credit since"
    return None


def _runway(settings: Settings, store: Store, credit: float | None) -> dict | None:
    """The runway the credit just read gives, and the stretch of the sleep it asks for (with
    ``BRAINSTEM_MIN_RUNWAY_DAYS`` set)."""
    if settings.min_runway_days is None:
        return None
    mean = runway.mean_daily_spend(store, daily_spent(store))
    days = runway.runway_days(credit, mean)
    return {"runway_days": days, "mean_daily_spend": mean, "credit": credit,
            "min_runway_days": settings.min_runway_days, "stretch": runway.stretch(days, settings.min_runway_days)}


def _part(state: dict, name: str) -> dict:
    value = state.get(name)
    return value if isinstance(value, dict) else {}


def _free(_what: str, _size: int) -> None:
    """The runtime's own message: not code's, so no write quota is charged for it."""
