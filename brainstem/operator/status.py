"""Where the agent stands, for ``brainstem status`` and ``brainstem sessions``: read-only views of the store."""

from __future__ import annotations

from typing import Any

from brainstem.core import keys
from brainstem.core.errors import NotText
from brainstem.core.outcomes import operator_action
from brainstem.core.settings import Settings
from brainstem.session.reflect import deep_reflect_due
from brainstem.state import history as session_history
from brainstem.state import refusals
from brainstem.state.budget import anomalies_today, daily_spent
from brainstem.state.config import load_defaults, load_models
from brainstem.state.review import items as review_items
from brainstem.state.sleep import agent_sleeping_until
from brainstem.state.versions import failing_streak
from brainstem.store.base import Store
from brainstem.store.karma import unfinished_session


def _running(store: Store) -> dict[str, Any] | None:
    """The session in progress, if any: its id, when it started, where, and whether it is still alive.

    ``state`` is ``running`` (its lock is held by a live holder), ``died`` (the lock expired or was
    released, or its process on this host is gone: the next wake records it as crashed) or
    ``locked`` (a wake holds the lock but has not started its session yet).
    """
    from brainstem.store.lease import holder_is_dead

    crumb = unfinished_session(store)
    lock = store.lock_owner(keys.WAKE_LOCK)
    if crumb is None and lock is None:
        return None
    alive = lock is not None and not holder_is_dead(lock)
    if crumb is None:
        return {"state": "locked" if alive else "died", "id": None, "started_at": None, "lock_holder": lock}
    out = {"state": "running" if alive else "died", "id": crumb.get("id"), "started_at": crumb.get("started_at"),
           "pid": crumb.get("pid"), "host": crumb.get("host"), "lock_holder": lock}
    if crumb.get("id") is None:
        out["note"] = "its breadcrumb was unreadable"
    return out


def session_gone(store: Store, session_id: str) -> tuple[str, str] | None:
    """Whether the session ``session_id`` has stopped, judged as status judges a running session.

    None while it runs: its breadcrumb (``session:current``) is its own and a live holder has the
    wake lock. Otherwise ``("ended", why)`` when the history has it (it closed, or was closed for
    it), or ``("died", why)``: its breadcrumb is gone or names another session, or the lock's
    holder is gone. A ``session_end`` may have been written just before this looked: read its
    karma once more before believing either.
    """
    from brainstem.store.lease import holder_is_dead

    crumb = unfinished_session(store)
    why = None
    if crumb is None:
        why = "its breadcrumb (session:current) is gone"
    elif crumb.get("id") != session_id:
        why = f"session:current now belongs to {crumb.get('id') or 'an unreadable breadcrumb'}"
    else:
        lock = store.lock_owner(keys.WAKE_LOCK)
        if lock is None:
            why = "no wake holds the lock any more (it expired or was released)"
        elif holder_is_dead(lock):
            why = f"the process holding the wake lock ({lock}) is gone"
    if why is None:
        return None
    for h in reversed(session_history.read(store)):
        if h.get("id") == session_id:
            return "ended", f"the history has it as {h.get('outcome')}"
    return "died", why


def status(store: Store, settings: Settings) -> dict[str, Any]:
    problems: list[str] = []
    defaults = load_defaults(store, problems)
    load_models(store, problems)  # an invalid price list is named here, not only in the next session's karma
    hist = session_history.read(store)
    last = hist[-1] if hist else None
    wake_config = store.get_json(keys.WAKE_CONFIG, default=None)
    until = agent_sleeping_until(store, wake_config)  # a dead session's agent is due at its retry
    number = store.get_json(keys.SESSION_COUNTER, default=0)
    due, why = deep_reflect_due(store, defaults, (number if isinstance(number, int) else 0) + 1)
    running = _running(store)
    rejected = store.get_json(keys.REJECTED_SESSION_HISTORY, default=None)
    truth = store.get_json(keys.LAST_GROUND_TRUTH, default=None)
    given = settings.allowed_secret_values()
    return {
        "store": store.display_url,
        "soul_present": _soul_state(store),
        "sessions": number,
        "last_session": last,
        "running": running,
        "operator_action": operator_action(last.get("outcome")) if last else None,
        "session_history_rejected": ({"at": rejected.get("at"), "reason": rejected.get("reason"),
                                      "raw_kept_at": keys.REJECTED_SESSION_HISTORY}
                                     if isinstance(rejected, dict) else None),
        "failing_in_a_row": len(failing_streak(hist)),
        "history_damaged": [{"position": e.get("position"), "id": e.get("id")}
                            for e in session_history.damaged(hist)] or None,
        "cost_today": round(daily_spent(store), 6),
        "daily_ceiling": settings.max_daily_cost,
        "session_ceiling": settings.max_session_cost,
        "balances_last_seen": truth,
        "next_wake_after": (wake_config or {}).get("next_wake_after") if isinstance(wake_config, dict) else None,
        "asleep": until is not None,
        "deep_reflection_due_next_wake": due,
        "deep_reflection": why,
        "config_problems": problems or None,
        # Names and hosts only: never a value. A name bound but not set is shown as such.
        "secret_bindings": {b.label: {"hosts": sorted(b.hosts),
                                      "set": b.label in given if not b.from_store
                                      else store.get(b.label) is not None}
                            for b in settings.bindings().values()},
        "fetch_allow": list(settings.fetch_allow),
        "cost_anomalies_today": anomalies_today(store) or None,
        "secret_refusals": refusals.counts(store),
        "reviews_pending": len(review_items(store)),
        "reflexes": _reflexes(store),
        "tool_mode_floors": settings.mode_floors() or None,
        "sandbox": _sandbox_report(),
    }


def _reflexes(store: Store) -> dict[str, Any] | None:
    """The reflex rules by name, with when each last fired; or why the stored list is ignored."""
    from brainstem.state.reflexes import ReflexError, load

    try:
        rules, fired = load(store)
    except ReflexError as exc:
        return {"error": str(exc)}
    if not rules:
        return None
    return {"rules": [{"name": r.name, "last_fired": fired.get(r.name)} for r in rules]}


def _soul_state(store: Store) -> bool | str:
    """True, False, or "not text" (the store holds bytes that are not UTF-8: see `brainstem kv get soul`)."""
    try:
        return bool((store.get(keys.SOUL) or "").strip())
    except NotText:
        return "not text"


def _sandbox_report() -> dict[str, Any]:
    """Which kernel protections the sandbox's workers run under here, and why any is off."""
    try:
        from brainstem.sandbox.isolation import report

        return report()
    except Exception as exc:  # noqa: BLE001 - status must show the rest even if the sandbox cannot start
        return {"error": f"the sandbox could not be checked: {type(exc).__name__}: {exc}"[:300]}
