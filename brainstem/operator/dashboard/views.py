"""What each dashboard page shows, read from the store: plain functions, no web framework here."""

from __future__ import annotations

import difflib
import json
import math
import re
from datetime import datetime
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import BrainstemError
from brainstem.daemon import telegram
from brainstem.daemon.scheduler import read_wake_log
from brainstem.operator.dashboard.conversation import conversation
from brainstem.state import daemon_health, schedules
from brainstem.state import history as session_history
from brainstem.store import karma as karma_mod

DETAIL_CHARS = 20_000  # one expanded entry; karma holds more, the CLI shows it whole
TIMED = {events.LLM_CALL: "llm", events.TOOL_COMPLETE: "tool", events.FETCH: "fetch"}


def pretty(value: Any, limit: int = DETAIL_CHARS, redact: Any = None) -> str:
    """``value`` as text, cut at ``limit``; ``redact`` (a text -> text function) runs before the cut, so the
    cut never leaves the first characters of a secret behind."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if redact is not None:
        text = redact(text)
    return text if len(text) <= limit else text[:limit] + f"\n… [{len(text) - limit} more characters]"


# --- sessions ---

def sessions_page(store, *, outcome: str | None = None, page: int = 1, per_page: int = 50) -> dict:
    """One page of sessions, newest first, filtered by outcome; with per-day totals for the chart."""
    rows = session_history.read(store)
    outcomes = sorted({str(h.get("outcome")) for h in rows if h.get("outcome")})
    if outcome:
        rows = [h for h in rows if h.get("outcome") == outcome]
    total = len(rows)
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    newest_first = rows[::-1]
    shown = newest_first[(page - 1) * per_page: page * per_page]
    return {"rows": shown, "total": total, "page": page, "pages": pages, "outcomes": outcomes,
            "outcome": outcome, "days": session_history.by_day(_last_days(rows, 30))[-30:], "per_page": per_page}


def _last_days(rows: list[dict], days: int) -> list[dict]:
    """The sessions of the last ``days`` days: ISO times compare as text, so no date is parsed for the rest."""
    from datetime import timedelta

    cut = iso(now_utc() - timedelta(days=days))[:10]
    return [h for h in rows if str(h.get("started_at") or "")[:10] >= cut]


def timeline(store, session_id: str, redact: Any = None) -> dict | None:
    """A session's karma as a waterfall: each timed entry (LLM call, tool run, fetch) with its start and
    duration in ms from the session's start, and every entry expandable to its fields."""
    entries = karma_mod.read(store, session_id)
    if not entries:
        return None
    rows, end_ms = [], 1
    for i, e in enumerate(entries):
        event = e.get("event")
        timed = TIMED.get(event) if isinstance(event, str) else None
        at = _ms(e.get("elapsed_ms"))
        dur = _ms(e.get("duration_ms")) if timed else 0
        start = int(max(0, at - dur))
        end_ms = max(end_ms, at)
        label = e.get("purpose") or e.get("tool") or e.get("step_id") or ""
        if event == events.FETCH:
            label = f"{e.get('tool')} {e.get('method')} {e.get('host')}{e.get('path') or ''}"
        rows.append({"i": i, "event": event, "kind": timed or "mark", "label": label,
                     "start": start, "dur": dur, "cost": e.get("cost"), "t": e.get("t"),
                     "detail": pretty({k: v for k, v in e.items() if k not in ("t", "elapsed_ms")}, redact=redact),
                     "conv": conversation(e, redact) if event == events.LLM_CALL else None})
    # A session ends in session_end; a schedule's run (whose karma this page shows too) in schedule_run.
    end = next((e for e in reversed(entries) if e.get("event") in (events.SESSION_END, events.SCHEDULE_RUN)), None)
    return {"id": session_id, "rows": rows, "end_ms": end_ms, "end": end, "start": entries[0]}


def _ms(value: Any) -> int | float:
    """An offset or duration in ms as drawn: a finite number of at least 0, else 0 (karma holds what it was
    given, and a NaN or infinity must not break the page)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, value)


def latest_session(store) -> str | None:
    return karma_mod.latest_session_id(store)


# --- schedules ---

RUN_ID = re.compile(r"sched-(?P<id>.+)-(?P<at>\d{8}T\d{6}Z)(?:-(?P<n>\d+))?")


def run_of(run_id: str) -> str | None:
    """The schedule whose run ``run_id`` is (``sched-ID-20260504T090000Z``, a ``-N`` after it when that
    time ran twice), or None for any other karma id (a session's)."""
    found = RUN_ID.fullmatch(run_id)
    return found["id"] if found else None


def _last_runs(store) -> dict[str, str]:
    """Each schedule's newest run that left karma: schedule id -> run id. One listing for all of them."""
    newest: dict[str, tuple[str, int, str]] = {}
    for info in store.list_all(keys.karma("sched-")):
        run_id = info.name[len(keys.karma("")):]
        found = RUN_ID.fullmatch(run_id)
        if info.is_log and found:
            rank = (found["at"], int(found["n"] or 1), run_id)
            if found["id"] not in newest or rank > newest[found["id"]]:
                newest[found["id"]] = rank
    return {schedule_id: rank[2] for schedule_id, rank in newest.items()}


def _at(value: Any) -> str:
    """An ISO-8601 UTC time as the page prints it (``2026-05-04 09:00``, seconds only when there are any);
    anything else as the text it is."""
    t = parse_iso(value)
    if t is None:
        return "" if value is None else str(value)
    return iso(t)[:19 if t.second else 16].replace("T", " ")


def _span(seconds: float) -> str:
    """A duration as a person reads it, in its largest unit and the next: ``45s``, ``12m``, ``3h 5m``, ``2d``."""
    s = int(abs(seconds))
    parts = [(s // 86400, "d"), (s % 86400 // 3600, "h"), (s % 3600 // 60, "m"), (s % 60, "s")]
    first = next((i for i, (n, _) in enumerate(parts) if n), len(parts) - 1)
    return " ".join(f"{n}{unit}" for n, unit in parts[first:first + 2] if n) or "0s"


def _from_now(value: Any, now: datetime) -> str:
    t = parse_iso(value)
    if t is None:
        return ""
    delta = (t - now).total_seconds()
    return f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago"


def schedules_page(store, now: datetime | None = None, redact: Any = None) -> dict:
    """The agent's schedules (:func:`~brainstem.state.schedules.load_all`) as rows in key order, each with its
    next run (``due`` once that time has come), its last run and outcome, and its newest run's karma id when
    that karma is kept. A value under ``schedule:`` that is not a schedule is a row too, its ``error`` set to
    why. Reads only: a schedule without ``next_run`` shows the first run after ``now`` without storing it."""
    now = now or now_utc()
    inventory, runs = schedules.load_all(store), _last_runs(store)
    rows: list[dict] = []
    for s in inventory.schedules:
        try:
            upcoming = schedules.upcoming(s, now)
        except (BrainstemError, ValueError, OverflowError) as exc:  # a timing with no run left in range
            rows.append({"id": s.id, "key": keys.schedule(s.id), "error": f"no next run: {exc}",
                         "operator": s.created_by == "operator", "run": runs.get(s.id)})
            continue
        due = upcoming is not None and (parse_iso(upcoming) or now) <= now
        rows.append({
            "id": s.id, "key": keys.schedule(s.id), "tool": s.tool, "input": pretty(s.input, redact=redact),
            "when": s.when, "missed": s.missed, "enabled": s.enabled, "created_by": s.created_by, "notify": s.notify,
            "synthesize": pretty(s.synthesize, redact=redact) if s.synthesize else None,
            "next_run": _at(upcoming), "due": due, "next_in": _from_now(upcoming, now),
            "last_run": _at(s.last_run), "last_ago": _from_now(s.last_run, now), "last_outcome": s.last_outcome,
            "run": runs.get(s.id)})
    for p in inventory.problems:
        schedule_id = schedules.id_of(p.key) or p.key
        rows.append({"id": schedule_id, "key": p.key, "error": p.reason.removeprefix(f"{p.key}: "),
                     "operator": p.operator, "run": runs.get(schedule_id)})
    rows.sort(key=lambda r: r["key"])
    agents = sum(1 for r in rows if r.get("created_by") == "agent")
    return {"rows": rows, "agents": agents, "invalid": sum(1 for r in rows if "error" in r)}


# --- self-modification ---

def versioned_keys(store) -> list[dict]:
    from brainstem.state.versions import versions

    out = []
    for info in store.list_all(keys.VERSIONS_PREFIX):
        key = info.name[len(keys.VERSIONS_PREFIX):]
        if info.is_log or not keys.is_privileged(key):
            continue
        vs = versions(store, key)
        if vs:
            out.append({"key": key, "versions": len(vs), "last": vs[-1].get("at"), "source": vs[-1].get("source"),
                        "session_id": vs[-1].get("session_id")})
    out.sort(key=lambda r: parse_iso(r["last"]) or parse_iso("1970-01-01T00:00:00Z"), reverse=True)
    return out


def key_history(store, key: str, a: int | None, b: int | None) -> dict:
    from brainstem.state.versions import versions

    vs = versions(store, key)
    current = store.get(key)
    by_number = {v["version"]: v for v in vs}
    a = a if a in by_number else (vs[-2]["version"] if len(vs) >= 2 else None)
    b = b if b in by_number else None  # None: the current value

    def text(v):
        return (v.get("value") or "") if v is not None else ""
    left = by_number.get(a) if a is not None else None
    right_text, right_name = (text(by_number[b]), f"version {b}") if b is not None else (current or "", "current")
    diff = "".join(difflib.unified_diff(text(left).splitlines(keepends=True), right_text.splitlines(keepends=True),
                                        fromfile=f"{key} (version {a})", tofile=f"{key} ({right_name})")) \
        if left is not None else ""
    return {"key": key, "versions": vs[::-1], "current": current, "a": a, "b": b, "diff": diff}


def pending_code(store, redact: Any = None) -> list[dict]:
    """The code not approved under its name (``brainstem tool pending``), each with its diff against the
    approved bytes (``brainstem tool diff``), redacted before it is cut."""
    from brainstem.state import approval

    out = []
    for row in approval.pending(store):
        code = store.get(row["key"])
        if code is not None:
            out.append({**row, "diff": pretty(approval.diff(store, row["name"], code), redact=redact)})
    return out


# --- the store ---

def key_list(store, prefix: str, page: int, per_page: int = 200) -> dict:
    infos = [k for k in store.list_all(prefix) if not k.name.startswith(keys.VERSIONS_PREFIX)]
    total = len(infos)
    pages = max(1, -(-total // per_page))
    page = min(max(1, page), pages)
    shown = infos[(page - 1) * per_page: page * per_page]
    return {"keys": [{"name": k.name, "log": k.is_log, "secret": keys.is_secret(k.name)} for k in shown],
            "total": total, "page": page, "pages": pages, "prefix": prefix}


def key_value(store, key: str, redact: Any = None) -> dict:
    """A key's value for the browser: never a ``secret:*`` value, whatever the key holds."""
    if keys.is_secret(key):
        present = store.get_text(key) is not None
        return {"key": key, "secret": True, "present": present, "value": None}
    if store.log_length(key):
        return {"key": key, "log": True, "entries": store.log_length(key),
                "value": pretty([karma_mod.parse_entry(r) for r in store.read_log(key, -50)], redact=redact)}
    from brainstem.core.errors import NotText

    try:
        value = store.get(key)
    except NotText as exc:
        return {"key": key, "value": None, "error": str(exc)}
    if value is not None:
        try:
            value = pretty(json.loads(value), redact=redact)
        except ValueError:
            value = pretty(value, redact=redact)
    return {"key": key, "value": value}


# --- kinds of session, and what runs the agent ---

KIND_NAMES = {"session": "session", "deep_reflect": "deep reflection", "reflex": "reflexes only"}


def kind_name(entry: Any) -> str:
    """What kind of session a history entry or a ``session_end`` entry is, as the lists print it."""
    if not isinstance(entry, dict):
        return ""
    if entry.get("dry_run"):
        return "dry run"
    if entry.get("replay") or str(entry.get("id") or entry.get("session_id") or "").startswith("replay-"):
        return "live replay"
    kind = entry.get("kind")
    return KIND_NAMES.get(kind, str(kind)) if kind else "session"


def unlisted(store, limit: int = 20) -> list[dict]:
    """The karma kept without a history entry (dry runs, wakes reflexes handled, live replays), newest first,
    each with how it ended when its karma says so."""
    kept = store.get_json(keys.UNLISTED_KARMA, default=[])
    rows = []
    for k in (kept if isinstance(kept, list) else [])[::-1][:limit]:
        if not isinstance(k, dict) or not isinstance(k.get("id"), str):
            continue
        last = store.read_log(keys.karma(k["id"]), -1)
        end = karma_mod.parse_entry(last[0]) if last else {}
        end = end if isinstance(end, dict) and end.get("event") == events.SESSION_END else {}
        rows.append({"id": k["id"], "at": k.get("at"), "kind": kind_name({"id": k["id"], **end}) if end else "",
                     "outcome": end.get("outcome"), "cost": end.get("cost"), "kept": bool(last)})
    return rows


def liveness(store, settings, now: datetime | None = None) -> dict:
    """Whether a daemon serves the agent and whether a Telegram poller polls its bot: running, or not seen
    since when (``stats:daemon_seen``, the wake_log's last fire; the poll lease, ``stats:telegram``)."""
    now = now or now_utc()
    try:
        seen = daemon_health.seen(store, now)
        fires = read_wake_log(store, 1)
        poller = store.lease_owner(keys.TELEGRAM_LEASE)
        tg = telegram.status(store, settings)
    except BrainstemError as exc:
        return {"error": str(exc)}
    last_fire = fires[-1].get("t") if fires else None
    latest = max((t for t in (seen["at"], last_fire) if parse_iso(t)), key=lambda t: parse_iso(t), default=None)
    daemon = {"running": seen["running"], "host": seen["host"], "pid": seen["pid"], "stopped": seen["stopped"],
              "at": _at(latest) if latest else None, "ago": _from_now(latest, now) if latest else None}
    poll = tg.get("last_poll_at")
    telegram_row = {"running": bool(poller), "owner": poller, "configured": tg["polling"], "why_not": tg["why_not"],
                    "at": _at(poll) if poll else None, "ago": _from_now(poll, now) if poll else None,
                    "failing": tg["failing"], "last_error": tg["last_error"]}
    return {"daemon": daemon, "telegram": telegram_row}
