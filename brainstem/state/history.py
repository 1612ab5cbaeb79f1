"""``session_history``: one summary per session, bounded, and what keeps karma bounded with it.

Every session ends with an entry (outcome, cost, steps, duration, summary),
appended to the ``session_history`` log: a session's bookkeeping costs the
same after 10,000 sessions as after 10 (``bench/growth.py``). The log keeps
the last ``HISTORY_MAX`` entries, trimmed in batches; a session that leaves it
takes its karma along. Karma older than the retention age is dropped while
its summary stays: a cursor (``stats:karma_retained_from``, a position in the
log) moves over the sessions whose karma is gone, so each append looks at a
few entries, never the whole history, and readers mark the entries before it
``karma_expired``.

Stores from before kept the history as one JSON list value; the first append
moves it into the log (resumably: a copy is kept until the move is done).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import iso, now_iso, now_utc, parse_duration, parse_iso
from brainstem.core.errors import ConfigError, MalformedValue
from brainstem.core.outcomes import ALL
from brainstem.store import karma as karma_mod
from brainstem.store.base import Store
from brainstem.store.karma import Karma

HISTORY_MAX = 1000
TRIM_SLACK = 100  # trimmed once this many past HISTORY_MAX: one trim per hundred sessions, not one per session
DEDUPE_WINDOW = 32  # a session is closed by itself or by the next wake: a second record of it is always this near
RETAINED_FROM = "stats:karma_retained_from"  # {"index": N}: the entries before position N have no karma any more
MIGRATING = "stats:session_history_v1"  # the old JSON list, kept while it is moved into the log


def read(store: Store) -> list[dict]:
    return read_checked(store)[0]


def read_checked(store: Store) -> tuple[list[dict], str | None]:
    """(the entries that could be read, why the stored history was not read whole, or None).

    A history that is not valid JSON, or not a list, or has items that are not objects, keeps
    whatever entries can be recovered from it: never silently nothing.
    """
    legacy = _legacy(store)
    if legacy is not None:
        return _parse_value(legacy)
    return _parse_log(store, store.read_log(keys.SESSION_HISTORY), 0)


def recent(store: Store, n: int) -> list[dict]:
    """The last ``n`` entries, oldest first, reading only those."""
    legacy = _legacy(store)
    if legacy is not None:
        return _parse_value(legacy)[0][-n:]
    length = store.log_length(keys.SESSION_HISTORY)
    start = max(0, length - n)
    return _parse_log(store, store.read_log(keys.SESSION_HISTORY, start), start)[0]


def _legacy(store: Store) -> str | None:
    """The history's text when it is still the old JSON list value (or being moved from it), else None."""
    moving = store.get_text(MIGRATING)
    return moving if moving is not None else _old_list(store)


def _old_list(store: Store) -> str | None:
    """The text of ``session_history`` when it is a plain value (the old JSON list), not yet a log."""
    try:
        if store.log_length(keys.SESSION_HISTORY):
            return None
    except MalformedValue:  # Redis: the key holds a plain value, not a list
        pass
    try:
        return store.get_text(keys.SESSION_HISTORY)
    except MalformedValue:  # Redis: a list after all (appended meanwhile)
        return None


def _parse_value(raw: str) -> tuple[list[dict], str | None]:
    try:
        h = json.loads(raw)
    except ValueError as exc:
        recovered = _salvage(raw)
        return recovered, (f"session_history is not valid JSON ({exc}); recovered {len(recovered)} "
                           f"entries from its text")
    if not isinstance(h, list):
        recovered = _salvage(raw)  # entries may sit inside it (an object keyed by id, a wrapper...)
        return recovered, (f"session_history is a JSON {type(h).__name__}, not a list; recovered "
                           f"{len(recovered)} entries from it")
    good = [e for e in h if isinstance(e, dict)]
    if len(good) != len(h):
        return good, f"session_history had {len(h) - len(good)} entries that were not objects; dropped them"
    return good, None


def _parse_log(store: Store, raws: list[str], start: int) -> tuple[list[dict], str | None]:
    """Log entries from position ``start`` on; those before the retention cursor are marked ``karma_expired``.
    An entry that is not a JSON object (damaged in place) stays in the list as a ``damaged`` entry with
    what can be read of it (its id, its number), so the session, and its karma, stay reachable."""
    cursor = _cursor(store)
    out, bad = [], 0
    for i, raw in enumerate(raws, start):
        entry = _entry(raw)
        if entry is None:
            bad += 1
            entry = damaged_entry(raw, i)
        if i < cursor:
            entry["karma_expired"] = True
        out.append(entry)
    return out, (f"session_history has {bad} damaged entries (not JSON objects); they are listed as damaged"
                 if bad else None)


_ID_IN_TEXT = re.compile(r'"id"\s*:\s*"([0-9]{1,12}-[0-9a-zA-Z]{1,32})"')


def damaged_entry(raw: str, position: int) -> dict:
    """What a damaged history entry still tells: the session's id and number when its text holds them."""
    m = _ID_IN_TEXT.search(raw or "")
    sid = m.group(1) if m else None
    return {"id": sid, "number": int(sid.split("-", 1)[0]) if sid else None, "outcome": "unknown", "cost": None,
            "steps": None, "started_at": None, "damaged": True, "position": position, "raw": (raw or "")[:300]}


def damaged(entries: list[dict]) -> list[dict]:
    """The damaged entries among ``entries`` (see :func:`damaged_entry`)."""
    return [e for e in entries if e.get("damaged") is True]


DAMAGE_REPORTED = "stats:history_damage_reported"  # positions of damaged entries already in some karma


def unreported_damage(store: Store, window: int = 64) -> list[dict]:
    """Damaged entries among the last ``window`` that no session's karma has reported yet; marks them
    reported, so each is recorded once, by the next session to find it."""
    found = damaged(recent(store, window))
    if not found:
        return []
    seen = store.get_json(DAMAGE_REPORTED, default=None)
    seen = set(seen) if isinstance(seen, list) else set()
    new = [d for d in found if d.get("position") not in seen]
    if new:
        store.put(DAMAGE_REPORTED, sorted(seen | {d["position"] for d in new})[-200:])
    return new


def _entry(raw: str) -> dict | None:
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _cursor(store: Store) -> int:
    value = store.get_json(RETAINED_FROM, default=None)
    index = value.get("index") if isinstance(value, dict) else None
    return index if isinstance(index, int) and not isinstance(index, bool) and index > 0 else 0


def _salvage(text: str) -> list[dict]:
    """Session entries (objects with an ``id``) found in a damaged history's text, in order."""
    decoder = json.JSONDecoder()
    out, i = [], text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            out.append(obj)
            i = text.find("{", end)
        else:
            i = text.find("{", i + 1)
    return out


def has(store: Store, session_id: str | None) -> bool:
    """Whether the history has the session (the whole history is read: for the operator's commands)."""
    return session_id is not None and any(h.get("id") == session_id for h in read(store))


def _recorded(store: Store, session_id: Any) -> bool:
    """Whether the session is among the last entries: where a session already recorded always is."""
    return session_id is not None and any(h.get("id") == session_id for h in recent(store, DEDUPE_WINDOW))


def migrate(store: Store, on_reject: Callable[[str], None] | None = None) -> None:
    """Move a history kept as one JSON list value into the log, once. Resumable: the list is copied to
    ``MIGRATING`` first and dropped last, so a move cut off halfway is finished by the next call."""
    moving = store.get_text(MIGRATING)
    if moving is None:
        moving = _old_list(store)
        if moving is None:
            return
        entries, problem = _parse_value(moving)
        if problem is not None:
            store.put(keys.REJECTED_SESSION_HISTORY, {"at": now_iso(), "reason": problem, "raw": moving})
            if on_reject is not None:
                on_reject(problem)
        store.put(MIGRATING, json.dumps(entries, ensure_ascii=False))
        store.delete(keys.SESSION_HISTORY)
    entries = _parse_value(moving)[0]
    done = store.log_length(keys.SESSION_HISTORY)  # appends happen only here until the move is done
    for e in entries[done:]:
        store.append(keys.SESSION_HISTORY, e)
    # The old list flagged each session whose karma had expired; the cursor goes past the last of them.
    flagged = [i for i, e in enumerate(entries) if e.get("karma_expired")]
    if flagged:
        for e in entries[:flagged[-1]]:
            if isinstance(e.get("id"), str) and not e.get("karma_expired"):
                store.delete_log(keys.karma(e["id"]))
        store.put(RETAINED_FROM, {"index": flagged[-1] + 1})
    store.delete(MIGRATING)


def append(store: Store, entry: dict, retention_days: float | None = None, now: datetime | None = None,
           on_reject: Callable[[str], object] | None = None) -> int:
    """Add ``entry``; drop the karma of sessions that leave the history or pass the retention age
    (counted back from ``now``, the end of the session being added). Returns how many sessions'
    karma expired by age.

    O(1) in the history's length: one append, a look at the last ``DEDUPE_WINDOW`` entries (a
    session already there is not added twice: the first record of it stands), a trim every
    ``TRIM_SLACK`` sessions, and the retention cursor moved over the few entries that just aged out.
    A history from before (one JSON list) is moved into the log first; a damaged one keeps what can
    be read of it, its raw text is saved under ``stats:rejected_session_history`` and ``on_reject``
    is told why.
    """
    migrate(store, on_reject)
    if _recorded(store, entry.get("id")):
        return 0
    length = store.append(keys.SESSION_HISTORY, entry)
    cursor = start = _cursor(store)
    if length > HISTORY_MAX + TRIM_SLACK:
        drop = length - HISTORY_MAX
        # A session that leaves the history takes its karma with it (unless it expired already).
        for raw in store.read_log(keys.SESSION_HISTORY, cursor, drop) if cursor < drop else []:
            gone = _entry(raw)
            if gone is not None and isinstance(gone.get("id"), str):
                store.delete_log(keys.karma(gone["id"]))
        # The cursor first: cut off between the two, it lags, and the next append catches it up.
        cursor, length = max(0, cursor - drop), length - drop
        store.put(RETAINED_FROM, {"index": cursor})
        store.trim_log(keys.SESSION_HISTORY, HISTORY_MAX)
        start = cursor
    expired = 0
    if retention_days is not None:
        cutoff = (now or now_utc()) - timedelta(days=retention_days)
        while cursor < length - 1:  # never the entry just added
            batch = store.read_log(keys.SESSION_HISTORY, cursor, min(length - 1, cursor + 16))
            if not batch:
                break
            for raw in batch:
                h = _entry(raw) or {}
                when = parse_iso(h.get("ended_at") or h.get("started_at"))
                if when is not None and when >= cutoff:
                    break
                if when is not None and isinstance(h.get("id"), str) and not h.get("karma_expired"):
                    store.delete_log(keys.karma(h["id"]))
                    expired += 1
                cursor += 1
            else:
                continue
            break
    if cursor != start:
        store.put(RETAINED_FROM, {"index": cursor})
    return expired


UNLISTED_MAX = 1000


def note_unlisted(store: Store, karma_id: str, retention_days: float, now: datetime | None = None) -> None:
    """Keep karma that has no history entry (a dry run, a wake a reflex handled, a live replay) bounded as
    the history's is: at most ``UNLISTED_MAX`` of them, none older than the retention age."""
    now = now or now_utc()
    kept = store.get_json(keys.UNLISTED_KARMA, default=[])
    kept = [k for k in kept if isinstance(k, dict) and isinstance(k.get("id"), str)] if isinstance(kept, list) else []
    kept.append({"id": karma_id, "at": iso(now)})
    cutoff = now - timedelta(days=retention_days)
    keep = [k for k in kept[:-1] if (parse_iso(k.get("at")) or now) > cutoff][-(UNLISTED_MAX - 1):] + kept[-1:]
    kept_ids = {k["id"] for k in keep}
    for k in kept:
        if k["id"] not in kept_ids:
            store.delete_log(keys.karma(k["id"]))
    store.put(keys.UNLISTED_KARMA, keep)


def close_dead_session(store: Store, breadcrumb: dict, outcome: str,
                       on_reject: Callable[[str], None] | None = None, **fields: Any) -> dict | None:
    """Record the end of a session that cannot record it itself (it crashed, or was cut off):
    an entry in the history and a ``session_end`` in its own karma. Idempotent: a session already
    in the history is left as it is (None is returned); one that recorded its own ``session_end``
    before dying is entered with the outcome it recorded. Its cost is the sum of its ``llm_call``
    entries (and ``spend_settled``: calls answered after it lost its lease)."""
    sid = breadcrumb.get("id")
    if _recorded(store, sid):
        return None
    entry: dict[str, Any] = {"id": sid, "outcome": outcome, "started_at": breadcrumb.get("started_at"), **fields}
    entries = karma_mod.read(store, sid) if sid else []
    ended = [e for e in entries if e.get("event") == events.SESSION_END]
    if ended:  # it closed itself, then died before the history had it: its own word stands
        end = ended[-1]
        entry.update({k: end[k] for k in ("outcome", "kind", "cost", "steps", "duration_ms", "reason",
                                          "operator_action") if k in end})
        entry["ended_at"] = end.get("t")
    else:
        calls = [e for e in entries if e.get("event") in (events.LLM_CALL, events.SPEND_SETTLED)]
        if calls:
            entry["cost"] = round(sum(c["cost"] for c in calls if isinstance(c.get("cost"), (int, float))
                                      and not isinstance(c.get("cost"), bool)), 10)
            entry["steps"] = len([e for e in entries if e.get("event") == events.STEP_START])
    append(store, entry, on_reject=on_reject)
    if sid and not ended:
        extra = {k: entry[k] for k in ("cost", "steps") if k in entry}
        Karma(store, sid).record(events.SESSION_END, outcome=outcome, **extra, **fields)
    return entry


# --- views for the operator: time windows, totals, days, finding a session ---

def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a duration back from now (``30m``, ``12h``, ``7d``, ``2w``) or an ISO date or time
    (``2026-05-01``, ``2026-05-01T12:00:00Z``; UTC when no zone is given) -> the moment it means."""
    when = parse_iso(text)
    if when is not None:
        return when
    try:
        return (now or now_utc()) - timedelta(seconds=parse_duration(text, "--since"))
    except ConfigError:
        raise ConfigError(f"--since {text!r} is neither a duration nor a date: use e.g. 30m, 12h, 7d, 2w "
                          f"or 2026-05-01") from None


def started_since(entries: list[dict], cutoff: datetime | None) -> list[dict]:
    """The entries that started at or after ``cutoff`` (all of them when it is None). An entry with
    no readable start time is kept only when there is no cutoff."""
    if cutoff is None:
        return list(entries)
    out = []
    for h in entries:
        when = parse_iso(h.get("started_at"))
        if when is not None and when >= cutoff:
            out.append(h)
    return out


def _cost(h: dict, field: str = "cost") -> float:
    c = h.get(field)
    return float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else 0.0


def totals(entries: list[dict]) -> dict[str, Any]:
    """``{"sessions": N, "cost": USD, "simulated_cost": USD, "outcomes": {outcome: count}}`` over ``entries``,
    outcomes in the order of the outcomes table (``clean`` first), any others after them by name.
    ``simulated_cost`` is the part of ``cost`` answered from a cassette: it moved no money."""
    counts: dict[str, int] = {}
    for h in entries:
        name = str(h.get("outcome") or "unknown")
        counts[name] = counts.get(name, 0) + 1
    order = [o for o in ALL if o in counts] + sorted(set(counts) - set(ALL))
    return {"sessions": len(entries), "cost": round(sum(_cost(h) for h in entries), 10),
            "simulated_cost": round(sum(_cost(h, "simulated_cost") for h in entries), 10),
            "outcomes": {o: counts[o] for o in order}}


def by_day(entries: list[dict]) -> list[dict[str, Any]]:
    """Per UTC day a session started on, oldest first: ``{"day": "YYYY-MM-DD", "sessions", "cost",
    "outcomes"}``. Sessions with no readable start time are counted under ``"day": "unknown"``, last."""
    days: dict[str, list[dict]] = {}
    for h in entries:
        when = parse_iso(h.get("started_at"))
        days.setdefault(when.strftime("%Y-%m-%d") if when else "unknown", []).append(h)
    order = sorted(d for d in days if d != "unknown") + (["unknown"] if "unknown" in days else [])
    return [{"day": d, **totals(days[d])} for d in order]


def resolve_session(store: Store, ref: str) -> str | None:
    """The id of the session ``ref`` names: an id (``12-a1b2c3``) or a plain session number (``12``).
    None when the store knows no such session (not in the history, not running, no karma)."""
    breadcrumb = karma_mod.read_breadcrumb(store) or {}
    candidates = [breadcrumb.get("id"), karma_mod.latest_session_id(store)]
    if ref.isdigit():
        number = int(ref)
        for h in reversed(read(store)):
            sid = h.get("id")
            if isinstance(sid, str) and (h.get("number") == number or sid.split("-", 1)[0] == ref):
                return sid
        return next((c for c in candidates if isinstance(c, str) and c.split("-", 1)[0] == ref), None)
    if ref in candidates or store.log_length(keys.karma(ref)) or has(store, ref):
        return ref
    return None
