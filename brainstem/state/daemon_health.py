"""Why the daemon cannot wake the agent, kept in the store (``stats:daemon``) for ``status`` and the dashboard,
and whether one serves it at all (``stats:daemon_seen``).

``brainstem run`` logs to its own journal, which the operator reading ``brainstem status`` on another
terminal (or host) never sees: a daemon failing every tick on a missing API key looked like "next
wake due now" forever. So a fire that fails for an operator fault (no key, a refused key, no credit,
the store refusing writes, a misconfiguration) writes the reason here, with the time failing began;
the next fire that runs a session without such a fault deletes it. The record changes only when the
reason does, so a daemon failing every few seconds writes once, not every tick.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import now_iso, now_utc, parse_iso
from brainstem.core.errors import one_line
from brainstem.store.base import Store


def read(store: Store) -> dict[str, Any] | None:
    """``{"since", "reason"}`` while the daemon is failing to wake the agent, else None."""
    rec = store.get_json(keys.DAEMON_FAILING, default=None)
    if isinstance(rec, dict) and isinstance(rec.get("reason"), str) and isinstance(rec.get("since"), str):
        return {"since": rec["since"], "reason": rec["reason"]}
    return None


def note_failing(store: Store, reason: str) -> bool:
    """Record that a fire failed for ``reason`` (made one line). ``since`` is kept from the first failure
    of the streak, whatever the reason is now. True when the record changed (a new or different reason)."""
    reason = one_line(reason, 300)
    old = read(store)
    if old is not None and old["reason"] == reason:
        return False
    store.put(keys.DAEMON_FAILING, {"since": old["since"] if old else now_iso(), "reason": reason})
    return True


def clear(store: Store) -> dict[str, Any] | None:
    """A fire succeeded: forget the failure. Returns what was recorded (None: nothing was failing)."""
    if store.get(keys.DAEMON_FAILING) is None:  # the usual case: one read per fire, no write
        return None
    old = read(store)
    store.delete(keys.DAEMON_FAILING)
    return old


def line(rec: dict[str, Any] | None) -> str | None:
    """``failing since T: reason``, as status and the dashboard show it."""
    return f"failing since {rec['since']}: {rec['reason']}" if rec else None


# ``brainstem run`` says it is alive every SEEN_EVERY seconds (its wake_log is written only at fires, an
# hour apart on an hourly schedule); older than three of its periods, it is not running, or cannot reach
# the store. A daemon serving many agents says it less often, so that its heartbeats cost at most
# SEEN_RATE writes a second however many agents it serves; each record names its own period.
SEEN_EVERY = 30.0
SEEN_STALE = 3 * SEEN_EVERY
SEEN_RATE = 20.0
_MOST_EVERY = 86_400.0  # a record claiming a longer period (edited by hand) is judged by this one


def seen_every(agents: int) -> float:
    """How often a daemon serving ``agents`` agents says it is alive to each."""
    return max(SEEN_EVERY, agents / SEEN_RATE)


def note_seen(store: Store, host: str, pid: int, stopped: bool = False, every: float = SEEN_EVERY) -> None:
    """The daemon serving this agent is alive (or, ``stopped``, has stopped cleanly) as of now, and says so
    again within ``every`` seconds."""
    store.put(keys.DAEMON_SEEN, {"at": now_iso(), "host": host, "pid": pid, "stopped": stopped, "every": every})


def seen(store: Store, now: datetime | None = None) -> dict[str, Any]:
    """``{"running": bool, "at", "host", "pid", "stopped"}``; ``at`` None when no daemon ever said so."""
    rec = store.get_json(keys.DAEMON_SEEN, default=None)
    rec = rec if isinstance(rec, dict) else {}
    at = parse_iso(rec.get("at"))
    every = rec.get("every")
    every = min(float(every), _MOST_EVERY) if isinstance(every, (int, float)) and every > 0 else SEEN_EVERY
    fresh = at is not None and ((now or now_utc()) - at).total_seconds() <= 3 * max(every, SEEN_EVERY)
    return {"running": bool(fresh and not rec.get("stopped")), "at": rec.get("at") if at else None,
            "host": rec.get("host"), "pid": rec.get("pid"), "stopped": bool(rec.get("stopped"))}
