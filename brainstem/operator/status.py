"""Where the agent stands, for ``brainstem status``, its dashboard page and ``karma --follow``.

:func:`status` gathers the report (read-only views of the store, one dict the
dashboard and ``status --json`` share); :func:`render` turns it into the
labelled lines ``brainstem status`` prints, section by section.
"""

from __future__ import annotations

import math
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import iso
from brainstem.core.errors import NotText, one_line
from brainstem.core.outcomes import operator_action
from brainstem.core.settings import NOT_OFFERED, Settings
from brainstem.daemon.telegram import status as telegram_status
from brainstem.operator.output import as_text, ceiling, clip, labelled, spent, usd
from brainstem.session.deep_schedule import deep_reflect_due
from brainstem.session.wallet import NEEDS_WEB3, web3_missing
from brainstem.state import daemon_health, inbox, refusals, runway
from brainstem.state import history as session_history
from brainstem.state.budget import anomalies_today, daily_spent, simulated_today
from brainstem.state.config import load_defaults, load_models
from brainstem.state.review import items as review_items
from brainstem.state.sleep import agent_sleeping_until
from brainstem.state.versions import failing_streak
from brainstem.store.base import Store
from brainstem.store.karma import read_breadcrumb


def _running(store: Store) -> dict[str, Any] | None:
    """The session in progress, if any: its id, when it started, where, and whether it is still alive.

    ``state`` is ``running`` (its lease is held by a live holder), ``died`` (the lease expired or was
    released, or its process on this host is gone: the next wake records it as crashed) or
    ``locked`` (a wake holds the lease but has not started its session yet). ``lease_holder`` is the
    lease's owner; ``lock_holder`` is the same, under the name it had when the lease was called a lock.
    """
    from brainstem.store.lease import holder_is_dead

    breadcrumb = read_breadcrumb(store)
    holder = store.lease_owner(keys.WAKE_LEASE)
    if breadcrumb is None and holder is None:
        return None
    alive = holder is not None and not holder_is_dead(holder)
    if breadcrumb is None:
        return {"state": "locked" if alive else "died", "id": None, "started_at": None, "lease_holder": holder,
                "lock_holder": holder}
    out = {"state": "running" if alive else "died", "id": breadcrumb.get("id"),
           "started_at": breadcrumb.get("started_at"), "pid": breadcrumb.get("pid"), "host": breadcrumb.get("host"),
           "lease_holder": holder, "lock_holder": holder}
    if breadcrumb.get("id") is None:
        out["note"] = "its breadcrumb was unreadable"
    return out


def session_gone(store: Store, session_id: str) -> tuple[str, str] | None:
    """Whether the session ``session_id`` has stopped, judged as status judges a running session.

    None while it runs: its breadcrumb (``session:current``) is its own and a live holder has the
    wake lease. Otherwise ``("ended", why)`` when the history has it (it closed, or was closed for
    it), or ``("died", why)``: its breadcrumb is gone or names another session, or the lease's
    holder is gone. A ``session_end`` may have been written just before this looked: read its
    karma once more before believing either.
    """
    from brainstem.store.lease import holder_is_dead

    breadcrumb = read_breadcrumb(store)
    why = None
    if breadcrumb is None:
        why = "its breadcrumb (session:current) is gone"
    elif breadcrumb.get("id") != session_id:
        why = f"session:current now belongs to {breadcrumb.get('id') or 'an unreadable breadcrumb'}"
    else:
        holder = store.lease_owner(keys.WAKE_LEASE)
        if holder is None:
            why = "no wake holds the lease any more (it expired or was released)"
        elif holder_is_dead(holder):
            why = f"the process holding the wake lease ({holder}) is gone"
    if why is None:
        return None
    for h in reversed(session_history.read(store)):
        if h.get("id") == session_id:
            return "ended", f"the history has it as {h.get('outcome')}"
    return "died", why


def status(store: Store, settings: Settings) -> dict[str, Any]:
    """Everything ``brainstem status`` shows, as one JSON-ready dict (``status --json`` prints it as it is)."""
    problems: list[str] = []
    defaults = load_defaults(store, problems)
    load_models(store, problems)  # an invalid price list is named here, not only in the next session's karma
    hist = session_history.read(store)
    last = hist[-1] if hist else None
    wake_config = store.get_json(keys.WAKE_CONFIG, default=None)
    until = agent_sleeping_until(store, wake_config)  # a dead session's agent is due at its retry
    number = store.get_json(keys.SESSION_COUNTER, default=0)
    due, why = deep_reflect_due(store, defaults, (number if isinstance(number, int) else 0) + 1, settings)
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
        "daemon": daemon_health.read(store),  # why `brainstem run` cannot wake it: {since, reason}, or None
        "history_damaged": [{"position": e.get("position"), "id": e.get("id")}
                            for e in session_history.damaged(hist)] or None,
        "cost_today": round(daily_spent(store), 6),
        "simulated_cost_today": round(simulated_today(store), 6),  # cassette answers: never in cost_today
        "daily_ceiling": _finite(settings.max_daily_cost),  # null: no ceiling (set to inf)
        "session_ceiling": _finite(settings.max_session_cost),
        "balances_last_seen": truth,
        "wallet_needs": NEEDS_WEB3 if settings.wallet_address and web3_missing() else None,
        "llm_server": settings.llm_server,  # generic: its credit is not offered (balances_last_seen.not_offered)
        **runway.outlook(store, daily_spent(store), offered=settings.llm_server == "openrouter"),
        "min_runway_days": settings.min_runway_days,
        "sleep_stretched": (wake_config or {}).get("stretched_for_runway") if isinstance(wake_config, dict) else None,
        "credit_guard": _credit_guard(store, settings),
        "next_wake_after": (wake_config or {}).get("next_wake_after") if isinstance(wake_config, dict) else None,
        "asleep": until is not None,
        "next_wake_at": iso(until) if until is not None else None,  # None: due now, whatever the schedule said
        "deep_reflection_due_next_wake": due,
        "deep_reflection": why,
        "config_problems": problems or None,
        # Names and hosts only: never a value. A name bound but not set is shown as such.
        "secret_bindings": {b.label: {"hosts": sorted(b.hosts),
                                      "set": b.label in given if not b.from_store
                                      else store.get(b.label) is not None}
                            for b in settings.bindings().values()},
        "fetch_allow": list(settings.fetch_allow),
        "telegram": telegram_status(store, settings),
        "cost_anomalies_today": anomalies_today(store) or None,
        "secret_refusals": refusals.counts(store),
        "reviews_pending": len(review_items(store)),
        "inbox": inbox.summary(store),
        "reflexes": _reflexes(store),
        "schedules": _schedules(store),
        "tool_mode_floors": settings.mode_floors() or None,
        "sandbox": _sandbox_report(),
    }


def _credit_guard(store: Store, settings: Settings) -> dict[str, Any] | None:
    """The floor on the LLM credit (``BRAINSTEM_MIN_CREDIT``) and the breaker a 402 opened: whether either
    keeps the agent from paid calls now, and whether the operator was told; None when neither is set or open."""
    rec = store.get_object(keys.LLM_CREDIT)
    floor, breaker = rec.get("floor"), rec.get("breaker")
    if settings.min_credit is None and not isinstance(breaker, dict):
        return None
    return {"min_credit": settings.min_credit, "below_floor": floor if isinstance(floor, dict) else None,
            "breaker": breaker if isinstance(breaker, dict) else None,
            "told": rec.get("told") if isinstance(rec.get("told"), dict) else None}


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


def _schedules(store: Store) -> list[dict[str, Any]]:
    """Each schedule by id: what it runs, when, its next run (``due`` once that has come) and how its last run
    ended; a value under ``schedule:`` that is not a schedule, with why (it never runs)."""
    from brainstem.core.clock import now_utc, parse_iso
    from brainstem.state import schedules

    now, inventory = now_utc(), schedules.load_all(store)
    out: list[dict[str, Any]] = []
    for s in inventory.schedules:
        next_run = schedules.upcoming(s, now)
        out.append({"id": s.id, "tool": s.tool, "when": s.when, "enabled": s.enabled, "created_by": s.created_by,
                    "notify": s.notify, "next_run": next_run, "due": (parse_iso(next_run) or now) <= now if next_run
                    else False, "last_run": s.last_run, "last_outcome": s.last_outcome})
    out += [{"id": schedules.id_of(p.key), "key": p.key, "error": p.reason.removeprefix(f"{p.key}: ")}
            for p in inventory.problems]
    return out


def _soul_state(store: Store) -> bool | str:
    """True, False, or "not text" (the store holds bytes that are not UTF-8: see `brainstem kv get soul`)."""
    try:
        return bool((store.get(keys.SOUL) or "").strip())
    except NotText:
        return "not text"


def _sandbox_report() -> dict[str, Any]:
    """Which kernel protections the sandbox's workers run under here, and why any is off."""
    try:
        from brainstem.sandbox import report

        return report()
    except Exception as exc:  # noqa: BLE001 - status must show the rest even if the sandbox cannot start
        return {"error": f"the sandbox could not be checked: {type(exc).__name__}: {exc}"[:300]}


# --- rendering: the report as ``brainstem status`` prints it, one labelled line each ---------

def render(report: dict[str, Any]) -> list[str]:
    """The report as labelled lines, in a fixed order: the agent, what runs, spend and schedule,
    what needs the operator, then the protections."""
    return (_agent_lines(report) + _running_lines(report) + _spend_lines(report) + _schedule_lines(report)
            + _attention_lines(report) + _protection_lines(report))


def _agent_lines(report: dict[str, Any]) -> list[str]:
    """The store, the soul, the session count and the last session (with what the operator must do)."""
    last = report["last_session"] or {}
    soul = report["soul_present"]
    out = [labelled("store", report["store"]),
           labelled("soul", "present" if soul is True else "MISSING (brainstem seed --soul FILE)" if not soul
                    else "NOT TEXT (brainstem kv put soul --file FILE --force-soul)"),
           labelled("sessions", as_text(report["sessions"]))]
    if last:
        out.append(labelled("last session", f"{as_text(last.get('id'))}  {as_text(last.get('outcome'))}  "
                                            f"{as_text(last.get('ended_at') or last.get('started_at'))}  "
                                            f"{spent(last.get('cost') or 0, last.get('simulated_cost'))}  "
                                            f"{as_text(last.get('steps', 0))} steps"))
    if last and report.get("operator_action"):
        out.append(labelled("OPERATOR", report["operator_action"]))
    elif isinstance(last.get("reason"), str):  # why it ended so: a limit, no plan, a reflection that did not happen
        out.append(labelled("why", clip(last["reason"], 200)))
    if report.get("daemon"):
        out.append(labelled("daemon", daemon_health.line(report["daemon"])))
    return out


def _running_lines(report: dict[str, Any]) -> list[str]:
    """A session running now (or one that died), and damage to the session history."""
    out = []
    running = report["running"]
    if running:
        where = (f" (pid {running.get('pid')} on {as_text(running.get('host'), 'unknown host')})"
                 if running.get("pid") else "")
        if running["state"] == "running":
            out.append(labelled("running now", f"session {as_text(running.get('id'))} since "
                                               f"{as_text(running.get('started_at'))}{where}"))
        elif running["state"] == "locked":
            out.append(labelled("running now", f"a wake holds the lease ({as_text(running.get('lease_holder'))}), "
                                               f"no session begun yet"))
        else:
            out.append(labelled("died", f"session {as_text(running.get('id'), '(unknown id)')} started "
                                        f"{as_text(running.get('started_at'), 'at an unknown time')}{where} and is "
                                        f"gone (its lease expired or its process exited); the next wake records "
                                        f"it as crashed"))
    if report.get("session_history_rejected"):
        r = report["session_history_rejected"]
        out.append(labelled("history problem", f"{as_text(r.get('at'))}: {as_text(r.get('reason'))} (its raw text "
                                               f"is kept in {as_text(r.get('raw_kept_at'))})"))
    for d in report.get("history_damaged") or []:
        out.append(labelled("HISTORY DAMAGED", f"entry {as_text(d.get('position'))} of session_history is not "
                                               f"readable JSON (session {as_text(d.get('id'), 'unknown')}); it is "
                                               f"listed as damaged, and its karma stays readable with brainstem "
                                               f"karma"))
    return out


def _spend_lines(report: dict[str, Any]) -> list[str]:
    """Failures in a row, spend against the ceilings, balances, the next wake, deep reflection, config."""
    truth = report["balances_last_seen"] or {}
    bal = truth.get("balances") if isinstance(truth.get("balances"), dict) else {}

    def money(v, why_unknown=None, name=""):
        if v is None and name in (truth.get("not_offered") or ()):
            return NOT_OFFERED
        return ("unknown" + (f" ({why_unknown})" if why_unknown else "")) if v is None else usd(v, 2)
    out = [labelled("failing in a row", as_text(report["failing_in_a_row"])),
           labelled("spent today", _spent_today(report)),
           labelled("balances", f"LLM credit {money(bal.get('openrouter'), name='openrouter')}, wallet USDC "
                                f"{money(bal.get('wallet_usdc'), report.get('wallet_needs'))}"
                    + (f" (as of {as_text(truth.get('at'))})" if truth else "")),
           *_credit_lines(report),
           labelled("next wake", _next_wake(report)),
           labelled("deep reflection", f"{'due at next wake' if report['deep_reflection_due_next_wake'] else 'not due'}"
                                       f" ({as_text(report['deep_reflection'])})")]
    out += [labelled("config problem", as_text(p)) for p in report["config_problems"] or []]
    return out


def _credit_lines(report: dict[str, Any]) -> list[str]:
    """The runway the LLM credit gives, the floor and breaker holding paid calls back, a stretched sleep."""
    out = []
    days, mean = report.get("runway_days"), report.get("mean_daily_spend")
    if report.get("llm_server") == "openrouter":
        text = (f"{days:g} days" if days is not None else "unknown") + (
            f" (LLM credit {usd(report['llm_credit'], 2)} at {usd(mean)} a day, the last 7 days' mean)"
            if days is not None else " (needs the LLM credit and some spend in the last 7 days)")
        if report.get("min_runway_days") is not None:
            text += f"; BRAINSTEM_MIN_RUNWAY_DAYS {report['min_runway_days']:g}"
        out.append(labelled("runway", text))
    guard = report.get("credit_guard") or {}
    if guard.get("below_floor"):
        f = guard["below_floor"]
        out.append(labelled("NO PAID CALLS", f"the LLM credit ({usd(f.get('credit') or 0, 2)}) is below "
                                             f"BRAINSTEM_MIN_CREDIT ({usd(guard.get('min_credit') or 0, 2)}) since "
                                             f"{as_text(f.get('since'))}: add credit at the provider"))
    elif guard.get("breaker"):
        b = guard["breaker"]
        out.append(labelled("NO PAID CALLS", f"the LLM server answered 402 at {as_text(b.get('last_402_at'))}: "
                                             f"no paid call until a balance read shows credit again or "
                                             f"{as_text(b.get('probe_after'))} (brainstem kv delete "
                                             f"{keys.LLM_CREDIT} clears it)"))
    stretched = report.get("sleep_stretched")
    if isinstance(stretched, dict):
        out.append(labelled("sleep stretched", f"{as_text(stretched.get('asked_seconds'))} s asked, "
                                               f"{as_text(stretched.get('slept_seconds'))} s slept: the runway "
                                               f"({as_text(stretched.get('runway_days'))} days) is under "
                                               f"BRAINSTEM_MIN_RUNWAY_DAYS"))
    return out


def _next_wake(report: dict[str, Any]) -> str:
    """When the agent next wakes: a time while it sleeps, else ``due now`` and why (never a time beside it
    as if it were the next wake)."""
    if report["asleep"]:
        return f"{report.get('next_wake_at') or as_text(report['next_wake_after'])} (asleep)"
    said = report["next_wake_after"]
    if (report.get("inbox") or {}).get("urgent_due"):
        return "due now: an urgent message waits" + (f" (its own schedule said {as_text(said)})" if said else "")
    return "due now" + (f" (its schedule said {as_text(said)})" if said else "")


def _spent_today(report: dict[str, Any]) -> str:
    """Today's spend against the daily ceiling as it is set (or that there is none), and the session's."""
    cost, daily, per_session = report["cost_today"], report["daily_ceiling"], report["session_ceiling"]
    text = (f"{usd(cost)}, no daily ceiling" if daily is None
            else f"{usd(cost)} of {ceiling(daily)}" + (" (over it)" if isinstance(cost, (int, float))
                                                        and cost > daily else ""))
    if report.get("simulated_cost_today"):
        text += f" (+{usd(report['simulated_cost_today'])} simulated, from cassettes)"
    return text + (" (no ceiling per session)" if per_session is None
                   else f" (per session at most {ceiling(per_session)})")


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def _schedule_lines(report: dict[str, Any]) -> list[str]:
    """Each schedule by id: what it runs and when, its next run, its last run and how it ended."""
    out = []
    for s in report.get("schedules") or []:
        if s.get("error"):
            out.append(labelled("schedule", f"{as_text(s.get('id') or s.get('key'))}: INVALID, never runs: "
                                            f"{as_text(s['error'])}"))
            continue
        if s["enabled"]:
            upcoming = f"next run {as_text(s['next_run'])}{' (due now)' if s['due'] else ''}"
        else:
            upcoming = "PAUSED (brainstem schedule resume " + s["id"] + ")"
        last = ("never run" if s["last_run"] is None and s["last_outcome"] is None
                else f"last {as_text(s['last_outcome'])} at {as_text(s['last_run'])}")
        out.append(labelled("schedule", f"{s['id']}: {s['tool']} {s['when']}; {upcoming}; {last}; "
                                        f"{s['created_by']}'s" + (f", notify {s['notify']}" if s["notify"] != "none"
                                                                   else "")))
    return out


def _attention_lines(report: dict[str, Any]) -> list[str]:
    """What waits for the operator (cost anomalies to check, secret refusals, tool runs to review), and for
    the agent (the operator's unread messages)."""
    out = []
    for n, a in enumerate(report["cost_anomalies_today"] or [], 1):
        head = (f"{as_text(a.get('at'))} session {as_text(a.get('session_id'))}: the endpoint reported "
                f"{usd(a.get('reported', 0))} for a {as_text(a.get('model'))} call that could cost at most "
                f"{usd(a.get('worst_case', 0))}.")
        if "corrected_to" in a:
            out.append(labelled(f"COST ANOMALY {n}", f"{head} Corrected by the operator to {usd(a['corrected_to'])}."))
        else:
            out.append(labelled(f"COST ANOMALY {n}", f"{head} It counts towards today's ceiling as billed; check the "
                                                     f"provider's activity page, and if it billed less, `brainstem "
                                                     f"anomaly {n} --billed USD` corrects today's spend for this "
                                                     f"call alone."))
    refused = report.get("secret_refusals") or {}
    if refused.get("total"):
        hold = ("the agent's code is HELD until you clear it: brainstem refusals --clear" if refused.get("held")
                else "cleared")
        out.append(labelled("SECRET REFUSED", f"{refused['total']} time(s), {refused['today']} today: code met "
                                              f"secret text it could only have by a leak or a guess (last: "
                                              f"{as_text(refused.get('last_tool'))} at "
                                              f"{as_text(refused.get('last_at'))}); {hold}. Look for "
                                              f"secret_refused in its karma"))
    if report["reviews_pending"]:
        out.append(labelled("REVIEW", f"{report['reviews_pending']} run(s) of supervised tools wait for your "
                                      f"verdict: brainstem review"))
    box = report.get("inbox") or {}
    if box.get("unread"):
        urgent = (f" ({box['urgent_unread']} urgent{': the agent is due now' if box.get('urgent_due') else ''})"
                  if box.get("urgent_unread") else "")
        out.append(labelled("inbox", f"{box['unread']} unread message(s){urgent}; the agent reads them in its "
                                     f"next session (brainstem inbox)"))
    last = box.get("last_reply")
    if isinstance(last, dict):
        sent = {True: ", sent to Telegram", False: ", not sent to Telegram"}.get(last.get("telegram_sent"), "")
        out.append(labelled("last reply", f"to message {as_text(last.get('to'))} at {as_text(last.get('at'))}"
                                          f"{sent}: {one_line(last.get('text'), 120)} (brainstem inbox)"))
    return out


def _protection_lines(report: dict[str, Any]) -> list[str]:
    """Reflexes, tool mode floors, the sandbox's protections and the secret bindings."""
    out = []
    reflexes = report.get("reflexes")
    if reflexes and reflexes.get("error"):
        out.append(labelled("reflexes", f"IGNORED: {reflexes['error']}"))
    elif reflexes:
        out.append(labelled("reflexes", ", ".join(f"{r['name']} (last fired {as_text(r['last_fired'], 'never')})"
                                                  for r in reflexes["rules"]) or "none"))
    for name, mode in (report.get("tool_mode_floors") or {}).items():
        out.append(labelled("tool mode", f"{name}: at least {mode} (BRAINSTEM_TOOL_MODES)"))
    sandbox = report.get("sandbox") or {}
    if sandbox.get("error"):
        out.append(labelled("sandbox", sandbox["error"]))
    else:
        prot = sandbox.get("protections") or {}
        on = [k for k, v in prot.items() if v.get("state") == "on"]
        off = [k for k, v in prot.items() if v.get("state") == "off"]
        out.append(labelled("sandbox", f"runtime as {as_text(sandbox.get('runtime'))}; on: {', '.join(on) or 'none'}"
                            + (f"; OFF: {', '.join(off)} (brainstem status --json says why)" if off else "")))
    out += _telegram_lines(report.get("telegram"))
    bindings = report["secret_bindings"]
    if not bindings:
        out.append(labelled("secrets", "none bound (tools get no secrets; BRAINSTEM_TOOL_SECRETS binds NAME@HOST)"))
    for label, b in bindings.items():
        out.append(labelled("secret", f"{label} -> {', '.join(b['hosts'])}{'' if b['set'] else '  (NOT SET)'}"))
    return out


def _telegram_lines(tg: dict[str, Any] | None) -> list[str]:
    """Whether ``brainstem run`` polls Telegram, what it turned away, and its last error."""
    if not tg:
        return []
    if not tg["polling"] and not (tg["other_chats"] or tg["received"] or tg["last_error"]):
        return [labelled("telegram", f"not polling ({as_text(tg['why_not'])})")]
    head = (f"brainstem run polls chat {as_text(tg['chat_id'])} (at {as_text(tg['api_host'])})" if tg["polling"]
            else f"not polling ({as_text(tg['why_not'])})")
    out = [labelled("telegram", f"{head}; {tg['received']} message(s) received, last poll "
                                f"{as_text(tg['last_poll_at'], 'never')}")]
    if tg["other_chats"]:
        out.append(labelled("telegram", f"{tg['other_chats']} text(s) from other chats turned away, never shown "
                                        f"to the agent (last {as_text(tg['other_chats_last_at'])}); if yours are "
                                        f"among them, check BRAINSTEM_TELEGRAM_CHAT_ID"))
    if tg["last_error"]:
        now = f"FAILING ({tg['failing']} in a row)" if tg["failing"] else "last error"
        out.append(labelled("telegram", f"{now}: {as_text(tg['last_error'])} at {as_text(tg['last_error_at'])}"))
    return out
