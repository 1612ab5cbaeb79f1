"""The review inbox: every run of a *supervised* tool, waiting for the operator's verdict.

A tool's meta says how far the agent is trusted with it: ``manual`` never runs,
``supervised`` runs and lands here, ``automated`` runs unwatched. The operator
settles each item here (``brainstem review ID --confirm`` or ``--correct TEXT``)
and deep reflection reads each tool's record (:func:`tool_records`), so the
agent promotes or demotes a tool on evidence rather than on its own opinion.

Items live at ``review:{id}``, runtime-owned: the agent's guarded view refuses
writes there, so the agent can never settle its own runs. The inbox is bounded
two ways, neither at the expense of the other: a session queues at most
``BRAINSTEM_REVIEW_MAX_PER_SESSION`` pending items (past it the run is not
run, see :mod:`brainstem.session.build`), and past :data:`MAX_SETTLED`
settled items the ones settled longest ago are dropped. Queueing never drops a
settled item: the operator's verdicts are not trimmed to make room for runs
waiting for one, and a pending item is never dropped.
"""

from __future__ import annotations

import json
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc
from brainstem.core.errors import BadArgument, NotFound, one_line
from brainstem.store.base import Store

MAX_SETTLED = 1000  # settled items kept; past this, the ones settled longest ago are dropped
MAX_FIELD_CHARS = 4000  # the JSON text of an item's input or result, and its error
MAX_CORRECTION_CHARS = 4000

PENDING = "pending"
CONFIRMED = "confirmed"
CORRECTED = "corrected"


def _capped(value: Any) -> Any:
    """``value`` as JSON (non-JSON values as text); when its JSON text is longer than
    :data:`MAX_FIELD_CHARS`, that text cut short with a note of how much is missing."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):  # a circular or too deeply nested value
        text = json.dumps(str(value)[:MAX_FIELD_CHARS * 2], ensure_ascii=False)
    if len(text) <= MAX_FIELD_CHARS:
        return json.loads(text)
    return text[:MAX_FIELD_CHARS] + f"… [{len(text) - MAX_FIELD_CHARS} more chars]"


def _cap_text(text: str | None) -> str | None:
    if text is None:
        return None
    text = str(text)
    if len(text) <= MAX_FIELD_CHARS:
        return text
    return text[:MAX_FIELD_CHARS] + f"… [{len(text) - MAX_FIELD_CHARS} more chars]"


def _number(item_id: Any) -> int | None:
    """A review id as its number: a positive integer, given as an int or as ASCII digits; else None."""
    if isinstance(item_id, bool):
        return None
    if isinstance(item_id, int):
        return item_id if item_id > 0 else None
    text = str(item_id).strip()
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        return None
    return int(text)


def _item_keys(store: Store) -> list[str]:
    return [k.name for k in store.list_all(keys.REVIEW_PREFIX) if not k.is_log]


def _read(store: Store, key: str) -> dict | None:
    """The item at ``key``; None when ``key`` is not ``review:{id}``, or its value is absent, not JSON,
    not an object, or not carrying the id its key names."""
    suffix = key[len(keys.REVIEW_PREFIX):]
    number = _number(suffix)
    if number is None or suffix != str(number):
        return None
    item = store.get_json(key)
    if not isinstance(item, dict) or _number(item.get("id")) != number:
        return None
    item["id"] = str(number)
    return item


def add(store: Store, *, tool: str, session_id: str | None, step_id: str | None, input: Any, ok: bool,
        result: Any, error: str | None, max_per_session: int | None = None) -> dict | None:
    """Record one run of a supervised tool as a pending review item, and return the item; None (nothing
    written) when ``session_id`` already has ``max_per_session`` items pending.

    ``input`` and ``result`` are kept as JSON, cut to :data:`MAX_FIELD_CHARS` characters of JSON text
    when longer. Nothing is dropped to make room: the settled items stay as they are.
    """
    if max_per_session is not None and pending_of(store, session_id) >= max_per_session:
        return None
    item_id = str(store.incr(keys.REVIEW_COUNTER))
    item = {"id": item_id, "tool": tool, "session_id": session_id, "step_id": step_id, "input": _capped(input),
            "ok": bool(ok), "result": _capped(result), "error": _cap_text(error), "status": PENDING,
            "created_at": iso(now_utc(), ms=True)}
    store.put(keys.review_item(item_id), item)
    return item


def pending_of(store: Store, session_id: str | None) -> int:
    """How many of ``session_id``'s items wait for a verdict."""
    return sum(1 for item in items(store) if item.get("session_id") == session_id)


def _prune(store: Store) -> None:
    """Drop the items settled longest ago while more than :data:`MAX_SETTLED` are kept (never the verdict
    just given); pending ones stay, and do not count."""
    settled = sorted((item for item in items(store, include_settled=True) if item.get("status") != PENDING),
                     key=lambda item: (str(item.get("settled_at") or ""), int(item["id"])))
    for item in settled[:max(0, len(settled) - MAX_SETTLED)]:
        store.delete(keys.review_item(item["id"]))


def items(store: Store, include_settled: bool = False) -> list[dict]:
    """The review items, oldest first (by id): the pending ones, or every one with ``include_settled``.

    A value under ``review:`` that is not an item (not a JSON object with the id its key names) is
    skipped: one bad value never hides the inbox."""
    found = [item for key in _item_keys(store) if (item := _read(store, key)) is not None]
    found.sort(key=lambda item: int(item["id"]))
    if include_settled:
        return found
    return [item for item in found if item.get("status") == PENDING]


def get(store: Store, item_id: Any) -> dict | None:
    """One review item by its id; None when there is none (or the id is not a positive integer)."""
    number = _number(item_id)
    if number is None:
        return None
    return _read(store, keys.review_item(str(number)))


def not_found(item_id: Any) -> NotFound:
    """The error for an id that names no review item, as one line that says how to list them."""
    why = "" if _number(item_id) is not None else " (review ids are positive numbers)"
    return NotFound(f"no review item {one_line(item_id, 60)!r}{why}: `brainstem review` lists the pending ones")


def settle(store: Store, item_id: str, *, confirm: bool = False, correction: str | None = None) -> dict:
    """Give a pending item the operator's verdict: ``confirm`` (the run was right) or a ``correction``
    (what it should have done). Returns the settled item.

    :class:`NotFound` for an unknown id (or one that is not a positive integer); :class:`BadArgument`
    for an item already settled, for both verdicts or none, and for an empty or overlong correction.
    """
    if confirm and correction is not None:
        raise BadArgument("give a review item either --confirm or --correct TEXT, not both")
    if not confirm and correction is None:
        raise BadArgument("settle a review item with --confirm or --correct TEXT")
    if correction is not None:
        if not correction.strip():
            raise BadArgument("the correction is empty; say what the tool run should have done")
        if len(correction) > MAX_CORRECTION_CHARS:
            raise BadArgument(f"the correction is {len(correction)} characters long; the limit is "
                              f"{MAX_CORRECTION_CHARS}")
    item = get(store, item_id)
    if item is None:
        raise not_found(item_id)
    if item.get("status") != PENDING:
        raise BadArgument(f"review item {item['id']} is already {one_line(item.get('status'), 40)}"
                          f" (`brainstem review {item['id']}` shows it)")
    item.update(status=CONFIRMED if confirm else CORRECTED, correction=None if confirm else correction.strip(),
                settled_at=iso(now_utc(), ms=True))
    store.put(keys.review_item(item["id"]), item)
    _prune(store)
    return item


def tool_records(store: Store, max_corrections: int = 3) -> dict[str, dict]:
    """Each supervised tool's record with the operator, for deep reflection:
    ``{tool: {"confirmed": n, "corrected": n, "pending": n, "corrections": [...]}}``, the corrections
    being the last ``max_corrections`` correction texts, newest last."""
    records: dict[str, dict] = {}
    corrected: dict[str, list[dict]] = {}
    for item in items(store, include_settled=True):
        tool = item.get("tool") if isinstance(item.get("tool"), str) else str(item.get("tool"))
        rec = records.setdefault(tool, {CONFIRMED: 0, CORRECTED: 0, PENDING: 0, "corrections": []})
        status = item.get("status")
        if status in (CONFIRMED, CORRECTED, PENDING):
            rec[status] += 1
        if status == CORRECTED and isinstance(item.get("correction"), str):
            corrected.setdefault(tool, []).append(item)
    for tool, done in corrected.items():
        done.sort(key=lambda item: (str(item.get("settled_at") or ""), int(item["id"])))
        last = done[-max_corrections:] if max_corrections > 0 else []
        records[tool]["corrections"] = [item["correction"] for item in last]
    return records
