"""Scheduled actions: one tool, run with a fixed input at set times, with no model call in between.

A schedule is the JSON object at ``schedule:ID``::

    {"id": "a1b2c3d4", "tool": "fetch_prices", "input": {"pair": "ETH"}, "cron": "0 9 * * MON-FRI",
     "tz": "Europe/London", "notify": "inbox", "missed": "once", "catchup": 3600, "enabled": true,
     "created_by": "agent", "next_run": "2026-05-04T08:00:00Z", "last_run": null, "last_outcome": null}

* ``every`` (``30m``, ``1d``: elapsed time) or ``cron`` (five fields, in ``tz``, an IANA name, default
  UTC), exactly one; :mod:`brainstem.core.recurrence` says when each runs.
* ``notify`` (``none``, ``inbox``, ``telegram``; default none): where the result goes;
  ``synthesize``: an optional prompt for a summary of it.
* ``missed`` (``skip`` or ``once``, default once) and ``catchup`` (seconds, default 3600): what a run
  that was due while nothing ran (the host down) becomes, see :func:`decide`.
* ``created_by`` (``operator`` or ``agent``, default agent): the agent never changes or removes an
  operator's schedule, and its own stay within the operator's limits (:class:`Limits`).
* ``next_run``, ``last_run`` (ISO-8601 UTC, to the second) and ``last_outcome`` (:data:`OUTCOMES`)
  are the runtime's: a writer may leave them out, and any field with a default.

A malformed value under ``schedule:`` is reported (:func:`load_all`), never fatal: the other
schedules still run. Everything here is a plain function of its inputs; nothing runs a tool.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from brainstem.core import keys, recurrence
from brainstem.core.clock import iso, parse_iso
from brainstem.core.errors import BrainstemError, ConfigError, KVWriteRefused, MalformedValue, StoreUnavailable
from brainstem.store.base import Store
from brainstem.store.lease import acquire, forget_token, owner_token

if TYPE_CHECKING:
    from brainstem.core.settings import Settings

# How one run of a schedule ended (``last_outcome``, and what the runner records).
OK = "ok"  # the tool ran and answered
FAILED = "failed"  # the tool ran and failed
SKIPPED_MISSED = "skipped_missed"  # due while nothing ran, and too late to run (see decide)
SKIPPED_OVERLAP = "skipped_overlap"  # due while its previous run was still running
REFUSED = "refused"  # the tool's policy refused the run (its mode, a budget, a missing secret)
OUTCOMES = (OK, FAILED, SKIPPED_MISSED, SKIPPED_OVERLAP, REFUSED)

DEFAULT_CATCHUP = 3600
MAX_CATCHUP = 7 * 86400
GRACE = 60.0  # a run at most this late is on time, whatever ``missed`` says (as the daemon's misfire grace)
MISSED_CAP = 1000  # missed runs counted one by one at most; past it a count says "or more"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_ID = re.compile(ID_PATTERN.strip("^$"))
RUNTIME_FIELDS = ("next_run", "last_run", "last_outcome")
TIMING_FIELDS = ("every", "cron", "tz")


class ScheduleError(BrainstemError):
    """A schedule's JSON is not a valid schedule; the one-line message names the key and the field."""

    exit_code = 2


class ScheduleBusy(KVWriteRefused):
    """A run holds the schedule's claim longer than an edit waits: nothing was written; try again."""


class ScheduleRefused(KVWriteRefused):
    """The agent's write of a schedule breaks the operator's limits, or touches the operator's schedule."""


@dataclass(frozen=True)
class Limits:
    """What the operator allows the agent (``BRAINSTEM_SCHEDULE_MIN_INTERVAL``, ``BRAINSTEM_SCHEDULE_MAX``)."""

    min_interval: int = 300  # seconds: no schedule of the agent's runs more often
    max_count: int = 20  # schedules the agent may have (the operator's are not counted)

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.schedule_min_interval, settings.schedule_max)


class Schedule(BaseModel):
    """One schedule as validated at the boundary, its defaults filled in; ``rule`` is its parsed timing."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(pattern=ID_PATTERN)
    tool: str
    input: dict[str, Any] = Field(default_factory=dict)
    every: str | None = None
    cron: str | None = None
    tz: str = "UTC"
    notify: Literal["none", "inbox", "telegram"] = "none"
    synthesize: str | None = Field(None, min_length=1, max_length=4000)
    missed: Literal["skip", "once"] = "once"
    catchup: int = Field(DEFAULT_CATCHUP, ge=0, le=MAX_CATCHUP)
    enabled: bool = True
    created_by: Literal["operator", "agent"] = "agent"
    next_run: str | None = None
    last_run: str | None = None
    last_outcome: Literal["ok", "failed", "skipped_missed", "skipped_overlap", "refused"] | None = None

    _rule: recurrence.Rule = PrivateAttr()

    @field_validator("tool", mode="before")
    @classmethod
    def _tool_name(cls, value: Any) -> Any:
        if not isinstance(value, str) or not 1 <= len(value) <= 128 or any(
                c == ":" or c.isspace() or not c.isprintable() for c in value):
            raise ValueError(f"{value!r} is not a tool's name (1-128 printable characters, no ':' or spaces)")
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"the tool's input is a JSON object, got {type(value).__name__}")
        return value

    @field_validator("next_run", "last_run")
    @classmethod
    def _utc_time(cls, value: str | None) -> str | None:
        if value is None:
            return None
        t = parse_iso(value)
        if t is None:
            raise ValueError(f"{value!r} is not an ISO-8601 time (e.g. 2026-05-04T09:00:00Z)")
        return iso(t)

    @model_validator(mode="after")
    def _timing(self) -> Schedule:
        try:
            self._rule = recurrence.parse(self.every, self.cron, self.tz)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def rule(self) -> recurrence.Rule:
        return self._rule

    @property
    def when(self) -> str:
        """Its timing as a person reads it: ``every 30m``, ``cron 0 9 * * MON-FRI (Europe/London)``."""
        if self.every is not None:
            return f"every {self.every}"
        return f"cron {self.cron}" + ("" if self.tz == "UTC" else f" ({self.tz})")


def check_id(schedule_id: Any) -> str:
    """``schedule_id`` if it can name a schedule (1-64 of letters, digits, ``_`` and ``-``), else ScheduleError."""
    if not isinstance(schedule_id, str) or not _ID.fullmatch(schedule_id):
        raise ScheduleError(f"schedule id {schedule_id!r} is not 1-64 letters, digits, '_' or '-' "
                            "(starting with a letter or digit)")
    return schedule_id


def new_id(taken: set[str] | frozenset[str] = frozenset()) -> str:
    """A fresh id: 8 hex digits, short enough to type, not one of ``taken``."""
    while True:
        candidate = secrets.token_hex(4)
        if candidate not in taken:
            return candidate


def id_of(key: str) -> str | None:
    """The id in ``schedule:ID``, or None for any other key."""
    return key[len(keys.SCHEDULE_PREFIX):] if key.startswith(keys.SCHEDULE_PREFIX) else None


def is_id(text: str) -> bool:
    return bool(_ID.fullmatch(text))


def _first_error(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        msg = f"not a field of a schedule ({', '.join(Schedule.model_fields)})"
    elif e["type"] == "missing":
        msg = "missing (it has no default)"
    return f"{where}: {msg}" if where else msg


def parse(schedule_id: str, raw: Any) -> Schedule:
    """The schedule at ``schedule:ID`` from its parsed JSON, or a one-line :class:`ScheduleError`.

    ``id`` may be left out (the key gives it); when given it must be the key's."""
    where = keys.schedule(check_id(schedule_id))
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where}: a schedule is a JSON object, got {type(raw).__name__}")
    if "id" in raw and raw["id"] != schedule_id:
        raise ScheduleError(f"{where}: id {raw['id']!r} is not the key's id {schedule_id!r}")
    try:
        return Schedule.model_validate({**raw, "id": schedule_id})
    except ValidationError as exc:
        raise ScheduleError(f"{where}: {_first_error(exc)}") from None


def parse_text(schedule_id: str, text: str) -> Schedule:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ScheduleError(f"{keys.schedule(schedule_id)}: not valid JSON ({exc})") from None
    return parse(schedule_id, raw)


def dump(schedule: Schedule) -> dict[str, Any]:
    """The JSON object stored at the schedule's key (a field that is null is left out)."""
    return schedule.model_dump(exclude_none=True)


# --- the schedules in a store ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A value under ``schedule:`` that is not a schedule: it never runs, and is reported."""

    key: str
    reason: str
    operator: bool = False  # its JSON says created_by operator: still the operator's to change


@dataclass(frozen=True)
class Inventory:
    """Every schedule of an agent, and the values under ``schedule:`` that are not schedules."""

    schedules: list[Schedule] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def get(self, schedule_id: str) -> Schedule | None:
        return next((s for s in self.schedules if s.id == schedule_id), None)

    def operators(self, schedule_id: str) -> bool:
        """Whether ``schedule:ID`` is the operator's (valid or not): the agent may not touch it."""
        s = self.get(schedule_id)
        if s is not None:
            return s.created_by == "operator"
        return any(p.operator for p in self.problems if p.key == keys.schedule(schedule_id))

    def agent_count(self, besides: str | None = None) -> int:
        return sum(1 for s in self.schedules if s.created_by == "agent" and s.id != besides)

    def replaced(self, schedule_id: str, schedule: Schedule | None) -> Inventory:
        """The inventory once ``schedule:ID`` holds ``schedule`` (None: once it is gone): what the rest of
        a batch of writes is checked against."""
        key = keys.schedule(schedule_id)
        kept = [s for s in self.schedules if s.id != schedule_id] + ([schedule] if schedule is not None else [])
        return Inventory(sorted(kept, key=lambda s: keys.schedule(s.id)), [p for p in self.problems if p.key != key])


def _claims_operator(text: str) -> bool:
    try:
        raw = json.loads(text)
    except ValueError:
        return False
    return isinstance(raw, dict) and raw.get("created_by") == "operator"


def load_all(store: Store) -> Inventory:
    """The agent's schedules, sorted by key; a malformed value is a :class:`Problem`, never an exception."""
    inventory = Inventory()
    for info in store.list_all(keys.SCHEDULE_PREFIX):
        schedule_id = id_of(info.name) or ""
        if info.is_log:
            inventory.problems.append(Problem(info.name, f"{info.name}: a log, not a schedule"))
            continue
        try:
            text = store.get_text(info.name)
        except MalformedValue as exc:  # not text at all
            inventory.problems.append(Problem(info.name, str(exc)))
            continue
        if text is None:  # deleted since it was listed
            continue
        try:
            inventory.schedules.append(parse_text(schedule_id, text))
        except ScheduleError as exc:
            inventory.problems.append(Problem(info.name, str(exc), _claims_operator(text)))
    return inventory


def load(store: Store, schedule_id: str) -> Schedule | None:
    """The schedule ``schedule:ID``, None when absent; :class:`ScheduleError` when it is malformed."""
    text = store.get_text(keys.schedule(check_id(schedule_id)))
    return None if text is None else parse_text(schedule_id, text)


def save(store: Store, schedule: Schedule) -> None:
    store.put(keys.schedule(schedule.id), dump(schedule))


# --- what the agent may write ---------------------------------------------------------------------------


def _span(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def first_run(rule: recurrence.Rule, now: datetime, last_run: str | None = None, min_interval: int = 0) -> str:
    """``next_run`` for a schedule whose timing is new: its first run after ``now``, and no sooner than
    ``min_interval`` after its ``last_run`` (a schedule rewritten right after it ran does not run again at once)."""
    after = now
    last = parse_iso(last_run)
    if last is not None and last + timedelta(seconds=min_interval - 1) > now:
        after = last + timedelta(seconds=min_interval - 1)
    return iso(recurrence.next_after(rule, after))


def upcoming(schedule: Schedule, now: datetime) -> str | None:
    """Its next run as the runtime sees it: ``next_run``, or the first run after ``now`` while it has none (what
    the runtime stores when it first looks); None while it is paused."""
    if not schedule.enabled:
        return None
    return schedule.next_run or first_run(schedule.rule, now)


def filled(schedule: Schedule, now: datetime) -> Schedule:
    """``schedule`` with its ``next_run`` filled in when it has none (a schedule the operator writes)."""
    if schedule.next_run is not None:
        return schedule
    return schedule.model_copy(update={"next_run": first_run(schedule.rule, now)})


def check_agent_write(inventory: Inventory, schedule_id: str, raw: Any, limits: Limits,
                      now: datetime) -> Schedule:
    """What the agent's write of ``raw`` at ``schedule:ID`` stores: validated, within the operator's
    limits, its runtime fields filled in; else :class:`ScheduleError` (not a schedule) or
    :class:`ScheduleRefused` (over a limit, or the operator's), each one line.

    The runtime's fields are the runtime's: whatever the agent gives for ``next_run``, ``last_run`` and
    ``last_outcome`` is replaced by what the stored schedule had, and ``next_run`` is computed afresh
    when the timing (``every``, ``cron``, ``tz``) changes: never sooner than the operator's minimum interval
    after its last run or, for a schedule that has none (a new one, one re-made under another id, or put
    back after a delete), after this write (the runner holds every run of the agent's to the same
    interval, whatever the schedule says)."""
    where = keys.schedule(check_id(schedule_id))
    if inventory.operators(schedule_id):
        raise ScheduleRefused(f"{where} is the operator's schedule: the agent may not change or remove it")
    if isinstance(raw, dict) and raw.get("created_by", "agent") != "agent":
        raise ScheduleRefused(f"{where}: created_by is 'agent' for a schedule the agent writes, "
                              f"got {raw.get('created_by')!r}")
    schedule = parse(schedule_id, {k: v for k, v in raw.items() if k not in RUNTIME_FIELDS}
                     if isinstance(raw, dict) else raw)
    interval = recurrence.min_interval(schedule.rule, now)
    if interval < limits.min_interval:
        raise ScheduleRefused(f"{where} would run as often as every {_span(interval)}; the operator's minimum "
                              f"is {_span(limits.min_interval)} (BRAINSTEM_SCHEDULE_MIN_INTERVAL)")
    if inventory.agent_count(besides=schedule_id) >= limits.max_count:
        raise ScheduleRefused(f"{where}: the agent has {inventory.agent_count(besides=schedule_id)} schedules, the "
                              f"most the operator allows (BRAINSTEM_SCHEDULE_MAX {limits.max_count}); "
                              f"remove one first")
    old = inventory.get(schedule_id)
    kept = {f: getattr(old, f) for f in RUNTIME_FIELDS} if old is not None else {}
    if old is None or old.next_run is None or any(getattr(old, f) != getattr(schedule, f) for f in TIMING_FIELDS):
        # With no last run, the write itself (an `every` already waits its interval from now).
        since = kept.get("last_run") or (iso(now) if isinstance(schedule.rule, recurrence.Cron) else None)
        kept["next_run"] = first_run(schedule.rule, now, since, limits.min_interval)
    return schedule.model_copy(update=kept)


CLAIM_TTL_MS = 10_000  # an edit holds a schedule's claim for milliseconds; the TTL only covers a crash
CLAIM_WAIT = 5.0  # seconds to wait for a run's claim (held while it decides, never while it runs)


@contextlib.contextmanager
def claimed(store: Store, schedule_ids: Iterable[str], who: str, wait: float | None = None,
            ttl_ms: int = CLAIM_TTL_MS) -> Iterator[dict[str, str]]:
    """Hold the claims of ``schedule_ids`` (the lease a run takes while it decides and writes its next run)
    for an edit, yielding each id's owner token: every writer of a schedule but a raw ``kv put`` goes through
    it (the runner, `brainstem schedule`, the agent's writes), so none undoes another's write.
    :class:`ScheduleBusy` when one is held past ``wait`` seconds (default :data:`CLAIM_WAIT`; 0: one try)."""
    held: dict[str, str] = {}
    try:
        for schedule_id in sorted(set(schedule_ids)):  # one order for every writer: no two wait on each other
            name = keys.SCHEDULE_CLAIM_LEASE + schedule_id
            # A token of this call's own, taken as this process's live one: a run in this same process (the
            # daemon) never takes the holder for a dead one and reclaims the claim.
            owner = owner_token(f"{who}-{secrets.token_hex(4)}")
            deadline = time.monotonic() + (CLAIM_WAIT if wait is None else wait)
            while not acquire(store, name, owner, ttl_ms):
                if time.monotonic() >= deadline:
                    raise ScheduleBusy(f"schedule {schedule_id} is being claimed by a run "
                                       f"({store.lease_owner(name)}); try again in a moment")
                time.sleep(0.05)
            held[schedule_id] = owner
        yield held
    finally:
        for schedule_id, owner in held.items():
            try:
                store.release_lease(keys.SCHEDULE_CLAIM_LEASE + schedule_id, owner)
            except StoreUnavailable:
                pass  # it runs out on its own
            finally:
                forget_token(owner)


def check_agent_delete(inventory: Inventory, schedule_id: str) -> None:
    """:class:`ScheduleRefused` when the agent may not remove ``schedule:ID`` (the operator's)."""
    if inventory.operators(check_id(schedule_id)):
        raise ScheduleRefused(f"{keys.schedule(schedule_id)} is the operator's schedule: "
                              "the agent may not change or remove it")


# --- what is due ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do with a schedule now, and the ``next_run`` to store after.

    ``run``: run it once now (``due`` is the scheduled time it answers, the latest one due);
    ``skip``: record ``skipped_missed`` and run nothing; ``wait``: not due yet; ``off``: disabled.
    ``missed``: scheduled runs that will never happen (every one due but the run); when
    ``counted_all`` is False there were more than :data:`MISSED_CAP` and ``missed`` is a floor."""

    action: Literal["run", "skip", "wait", "off"]
    next_run: str | None
    due: str | None = None
    missed: int = 0
    counted_all: bool = True


def _due(rule: recurrence.Rule, first: datetime, now: datetime) -> tuple[int, bool, datetime]:
    """How many runs are due in [first, now] (exactly, or at least, with ``counted_all``), and the latest."""
    if isinstance(rule, recurrence.Every):
        step = timedelta(seconds=rule.seconds)
        count = (now - first) // step + 1
        return count, True, first + (count - 1) * step
    due = [first, *recurrence.runs(rule, first, now, cap=MISSED_CAP - 1)]
    if len(due) < MISSED_CAP:
        return len(due), True, due[-1]
    latest = recurrence.latest_at_or_before(rule, now, due[-1]) or due[-1]
    return len(due), latest == due[-1], latest


def decide(schedule: Schedule, now: datetime, grace: float = GRACE) -> Decision:
    """What to do with ``schedule`` at ``now``: run once, skip what was missed, or wait.

    The latest run due decides. It runs when it is at most ``grace`` late (on time, whatever
    ``missed`` says), or, with ``missed: once``, at most ``catchup`` seconds late; else every run due
    is skipped. Either way the earlier runs due are missed (a schedule never runs twice to catch up),
    and ``next_run`` moves to the first run after ``now``: on the cron, or for ``every`` on the grid
    of the old ``next_run``, so a late run does not shift the ones after it."""
    now = now if now.tzinfo else now.replace(tzinfo=timezone.utc)
    if not schedule.enabled:
        return Decision("off", schedule.next_run)
    first = parse_iso(schedule.next_run)
    if first is None:
        return Decision("wait", first_run(schedule.rule, now))
    if first > now:
        return Decision("wait", schedule.next_run)
    rule = schedule.rule
    count, counted_all, latest = _due(rule, first, now)
    allowed = grace if schedule.missed == "skip" else max(grace, schedule.catchup)
    next_run = iso(recurrence.next_after(rule, now, anchor=first))
    if (now - latest).total_seconds() <= allowed:
        return Decision("run", next_run, iso(latest), count - 1, counted_all)
    return Decision("skip", next_run, iso(latest), count, counted_all)
