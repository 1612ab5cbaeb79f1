"""Running the agent's schedules: each due run exactly once across processes and hosts, never overlapping
itself, each recorded in a karma log of its own.

Where runs happen: ``brainstem wake`` runs the due ones first, whatever the agent's own sleep says (the
sleep path's cheap look, :func:`due_soon`, sends it down the full path only when one needs the runner);
``brainstem run`` looks every second and runs them beside the agent's sessions; ``brainstem schedule run
ID`` runs one now (:func:`run_now`). A dry run (``brainstem wake --dry-run``) runs none.

Claiming a run. A short claim lease (``schedule_claim:ID``) serialises the decision: under it the schedule
is read again and :func:`~brainstem.state.schedules.decide` asked. A run or a skip moves ``next_run``
before anything runs, so whoever looks next finds it not due; a run is claimed by writing ``last_run``
(the time it was due; ``last_outcome`` cleared until it ends) and a marker, ``stats:schedule_running:ID``
(run id, owner, scheduled time). The run holds the run lease ``schedule_run:ID``, renewed while it runs,
and writes only through a view fenced by it (the claim's writes are fenced by the claim lease). So:

* two processes that find one run due: one claims it; the other finds the claim lease held (it leaves
  the schedule alone) or the run claimed (``next_run`` moved on): it neither runs it nor records anything;
* a run due while the previous one still runs (its run lease held): ``skipped_overlap``, recorded;
* downtime that missed several runs: one entry, ``skipped_missed`` with a ``missed`` count, or, under
  ``missed: once`` within ``catchup``, one late run whose entry counts the others as ``missed``;
* a run whose process died (its marker there, its run lease gone): recorded once, ``failed`` with a
  reason saying its process ended, and never run again for that time.

Each run's karma is ``karma:sched-ID-YYYYMMDDTHHMMSSZ`` (its scheduled time): its tool_start and
tool_complete, any llm_call, and last the ``schedule_run`` entry (``id``, ``scheduled``, ``outcome``,
``cost``; ``missed``, ``reason``, ``message`` and where it went when there are any), shown by
``brainstem karma RUN_ID``. A value under ``schedule:`` that is not a schedule is reported once, a
``config_rejected`` entry in a karma log of its own (and a log line), and never runs.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from brainstem.core import events, keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.core.errors import BrainstemError, LeaseLost, MalformedValue, NotFound, StoreUnavailable
from brainstem.core.settings import Settings
from brainstem.sandbox import pool
from brainstem.session.schedule_action import Done, describe, perform
from brainstem.state import history as session_history
from brainstem.state.schedules import (
    FAILED,
    SKIPPED_MISSED,
    SKIPPED_OVERLAP,
    Inventory,
    Problem,
    Schedule,
    ScheduleBusy,
    ScheduleError,
    check_id,
    claimed,
    decide,
    first_run,
    id_of,
    load,
    load_all,
    save,
)
from brainstem.state.sleep import digest, full_look, recheck, reported_problems, schedules_due
from brainstem.store import karma as karma_mod
from brainstem.store.base import Store
from brainstem.store.fenced import FencedStore
from brainstem.store.karma import Karma, Redactor
from brainstem.store.lease import Lease, acquire, forget_token, held_alive, owner_token, use_host_name

log = logging.getLogger("brainstem.schedules")

PROBLEMS_CLAIM = "_problems"  # the claim lease of reporting what is not a schedule: no schedule id starts with _
SETTLE_WAIT = 5.0  # seconds a finished run waits for the claim lease to record its outcome on the schedule


@dataclass
class ScheduleRunResult:
    """What became of one due run (or of ``brainstem schedule run ID``)."""

    id: str
    run_id: str
    outcome: str
    scheduled: str
    cost: float = 0.0
    missed: int = 0
    reason: str | None = None
    notified: str | None = None
    notify_error: str | None = None

    @property
    def message(self) -> str:
        extra = [f"cost ${self.cost:.4f}"] + ([f"{self.missed} missed"] if self.missed else [])
        line = f"schedule {self.id}: {self.outcome} ({', '.join(extra)}); karma: brainstem karma {self.run_id}"
        return line + (f"; {self.reason}" if self.reason else "")


@dataclass
class _Claim:
    """A run claimed: its schedule, run id and run-lease token, and what the claim wrote."""

    schedule: Schedule
    run_id: str
    token: str
    scheduled: str
    last_run: str
    missed: int


class _Ctx:
    """What a pass over the schedules shares: the settings, store, providers and listeners."""

    def __init__(self, settings: Settings, store: Store, providers: Sequence | None, listeners: Iterable):
        self.settings, self.store, self.providers, self.listeners = settings, store, providers, list(listeners)
        self.ttl_ms = int(settings.lease_seconds * 1000)

    def karma(self, store: Store, run_id: str) -> Karma:
        return Karma(store, run_id, Redactor(self.settings.known_secrets()), listeners=self.listeners)

    def kept(self, store: Store, run_id: str) -> None:
        """Karma with no history entry, kept and bounded as the history's is."""
        session_history.note_unlisted(store, run_id, self.settings.karma_retention_days)


def due_soon(store: Store) -> bool:
    """Whether the schedules need the runner now (the sleep path's look: one list call with none)."""
    return schedules_due(store)


def run_due(settings: Settings, store: Store, *, providers: Sequence | None = None, listeners: Iterable = (),
            cancel: threading.Event | None = None, only: Sequence[str] | None = None) -> list[ScheduleRunResult]:
    """Run (or skip, as the schedule says) every due run no other process has claimed; record what died.
    ``only``: the keys under ``schedule:`` the due index found due (:func:`~brainstem.state.sleep.due_now`),
    the others left alone (all of them when one is not a schedule: what is reported is the whole set).
    The due index is set from what the pass left. Raises only StoreUnavailable: one schedule's trouble is
    logged and the others still run."""
    use_host_name(settings.hostname)
    ctx = _Ctx(settings, store, providers, listeners)
    inventory = _some(store, only) if only is not None else None
    full = inventory is None
    if inventory is None:
        inventory = load_all(store)
        _report(ctx, inventory.problems)
    _close_dead(ctx, None if full else [s.id for s in inventory.schedules])
    results = []
    now = now_utc()
    try:
        for schedule in inventory.schedules:
            if cancel is not None and cancel.is_set():
                break
            d = decide(schedule, now)
            if d.action == "off" or (d.action == "wait" and d.next_run == schedule.next_run):
                continue
            result = _guarded(ctx, schedule.id, manual=False)
            if result is not None:
                results.append(result)
    finally:
        _reindex(store, None if full or only is None else only)
    return results


def _some(store: Store, only: Sequence[str]) -> Inventory | None:
    """The schedules at ``only`` (those gone left out); None when one of them is not a schedule."""
    found = []
    for key in only:
        try:
            schedule = load(store, id_of(key) or "")
        except (ScheduleError, MalformedValue):
            return None
        if schedule is not None:
            found.append(schedule)
    return Inventory(found)


def _reindex(store: Store, only: Sequence[str] | None) -> None:
    """The due index set from what a pass left (a full look after a pass over them all): a key the index
    found due that the pass left alone (another process claimed it) is looked at again, not every second."""
    try:
        if only is None:
            full_look(store)
        else:
            recheck(store, list(only))
    except BrainstemError as exc:
        log.debug("the due index was not set after a pass (the next full look sets it): %s", exc)


def run_now(settings: Settings, store: Store, schedule_id: str, *, providers: Sequence | None = None,
            listeners: Iterable = ()) -> ScheduleRunResult:
    """Run schedule ``schedule_id`` once now, whatever its timing (``next_run`` stays; a paused one runs
    too); ``skipped_overlap`` while its previous run still runs. NotFound, ScheduleError (malformed) or
    BrainstemError (another process deciding it now) otherwise."""
    use_host_name(settings.hostname)
    if load(store, check_id(schedule_id)) is None:
        raise NotFound(f"no schedule {schedule_id!r} (brainstem schedule list shows them)")
    ctx = _Ctx(settings, store, providers, listeners)
    result = _claim_and_run(ctx, schedule_id, manual=True)
    if result is None:
        raise BrainstemError(f"schedule {schedule_id}: another process is deciding its run right now; try again")
    return result


# --- one schedule -------------------------------------------------------------------------------------------

def _guarded(ctx: _Ctx, schedule_id: str, manual: bool) -> ScheduleRunResult | None:
    """:func:`_claim_and_run`, its trouble logged in one line: one schedule never stops the others."""
    try:
        return _claim_and_run(ctx, schedule_id, manual)
    except StoreUnavailable:
        raise
    except LeaseLost as exc:
        log.warning("schedule %s: its run lost its lease, and the next look records it: %s", schedule_id, exc)
    except Exception as exc:  # noqa: BLE001 - one schedule's trouble never stops the runner
        log.warning("schedule %s: not run: %s: %s", schedule_id, type(exc).__name__, exc)
    return None


def _claim_and_run(ctx: _Ctx, schedule_id: str, manual: bool) -> ScheduleRunResult | None:
    nonce = uuid.uuid4().hex[:8]
    claimed = _under_claim(ctx, schedule_id, lambda view: _decide(ctx, view, schedule_id, nonce, manual),
                           wait=SETTLE_WAIT if manual else 0.0)
    if not isinstance(claimed, _Claim):
        return claimed
    return _run(ctx, claimed)


def _under_claim(ctx: _Ctx, schedule_id: str, work, wait: float = 0.0):
    """``work(view)`` while holding the schedule's claim lease (``view`` fenced by it); None when another
    process holds it (waited for up to ``wait`` seconds)."""
    try:
        with claimed(ctx.store, [schedule_id], "claim", wait=wait, ttl_ms=ctx.ttl_ms) as held:
            return work(FencedStore(ctx.store, keys.SCHEDULE_CLAIM_LEASE + schedule_id, held[schedule_id]))
    except ScheduleBusy:
        return None


def _decide(ctx: _Ctx, view: Store, schedule_id: str, nonce: str,
            manual: bool) -> _Claim | ScheduleRunResult | None:
    """Under the claim: read the schedule again, and claim its run, record its skip, or leave it."""
    try:
        schedule = load(view, schedule_id)
    except ScheduleError:
        return None  # reported by the pass
    if schedule is None:
        return None
    now = now_utc()
    next_run: str | None
    if manual:
        scheduled, next_run, missed, action = iso(now), schedule.next_run or first_run(schedule.rule, now), 0, "run"
    else:
        d = decide(schedule, now)
        if d.action in ("off", "wait"):
            if d.action == "wait" and d.next_run != schedule.next_run:  # none yet: filled in
                save(view, schedule.model_copy(update={"next_run": d.next_run}))
            return None
        scheduled, next_run, missed, action = d.due or iso(now), d.next_run, d.missed, d.action
        soonest = _soonest(ctx, schedule)
        if action == "run" and soonest is not None and now < soonest:
            # The agent's runs stay the operator's minimum interval apart whatever its schedule says (a clock
            # change years ahead, a schedule made again): this one waits, and is not missed.
            save(view, schedule.model_copy(update={"next_run": iso(soonest)}))
            return None
    run_lease = keys.SCHEDULE_RUN_LEASE + schedule_id
    holder = held_alive(view, run_lease)
    marker = _marker(view, schedule_id)
    if holder is None and marker is not None:  # its previous run died: recorded before anything else
        _close_one(ctx, view, schedule_id, marker)
        schedule = load(view, schedule_id) or schedule
    if holder is not None:
        return _skip(ctx, view, schedule, SKIPPED_OVERLAP, scheduled, next_run, missed,
                     f"its previous run is still running ({holder})")
    if action == "skip":
        late = "" if schedule.missed == "skip" else f", later than its catchup of {schedule.catchup}s"
        return _skip(ctx, view, schedule, SKIPPED_MISSED, scheduled, next_run, missed,
                     f"due while nothing ran{late} (missed: {schedule.missed})")
    token = owner_token(f"sched-{nonce}")
    if not acquire(ctx.store, run_lease, token, ctx.ttl_ms):  # taken since it was looked at: running
        return _skip(ctx, view, schedule, SKIPPED_OVERLAP, scheduled, next_run, missed,
                     "its previous run is still running")
    try:
        last_run = scheduled  # the time it was due (now, for a run asked for now)
        save(view, schedule.model_copy(update={"next_run": next_run, "last_run": last_run, "last_outcome": None}))
        run_id = _run_id(view, schedule_id, scheduled)
        view.put(keys.schedule_running(schedule_id), {"run": run_id, "owner": token, "scheduled": scheduled,
                                                      "last_run": last_run, "missed": missed})
    except BaseException:
        _release(ctx.store, run_lease, token)
        raise
    return _Claim(schedule, run_id, token, scheduled, last_run, missed)


def _soonest(ctx: _Ctx, schedule: Schedule) -> datetime | None:
    """The soonest an agent's schedule may run again (its last run plus the operator's minimum interval)."""
    last = parse_iso(schedule.last_run) if schedule.created_by == "agent" and schedule.last_run else None
    return last + timedelta(seconds=ctx.settings.schedule_min_interval) if last is not None else None


def _skip(ctx: _Ctx, view: Store, schedule: Schedule, outcome: str, scheduled: str, next_run: str | None,
          missed: int, reason: str) -> ScheduleRunResult:
    """A due run not run (overlap, or missed): ``next_run`` moved on and the decision recorded."""
    save(view, schedule.model_copy(update={"next_run": next_run, "last_outcome": outcome}))
    run_id = _run_id(view, schedule.id, scheduled)
    _record(ctx.karma(view, run_id), schedule.id, scheduled, outcome, 0.0, missed, {"reason": reason})
    ctx.kept(view, run_id)
    return ScheduleRunResult(schedule.id, run_id, outcome, scheduled, 0.0, missed, reason)


def _run(ctx: _Ctx, claim: _Claim) -> ScheduleRunResult:
    """The claimed run, under its renewed run lease; its end recorded in its karma, then on the schedule."""
    schedule, store = claim.schedule, ctx.store
    run_lease = keys.SCHEDULE_RUN_LEASE + schedule.id
    lease = Lease(store, claim.token, ctx.settings.lease_seconds, name=run_lease).start()
    view = FencedStore(store, run_lease, claim.token)
    karma = ctx.karma(view, claim.run_id)
    try:
        try:
            with pool.use(ctx.settings.sandbox_pool):
                done = perform(ctx.settings, view, karma, schedule, claim.run_id, ctx.providers)
        except (LeaseLost, StoreUnavailable):
            raise
        except Exception as exc:  # noqa: BLE001 - the run's end is recorded whatever happened
            done = Done(FAILED, f"{type(exc).__name__}: {exc}"[:300])
        _record(karma, schedule.id, claim.scheduled, done.outcome, done.cost, claim.missed, describe(done))
        ctx.kept(view, claim.run_id)
    finally:
        lease.stop()
        _release(store, run_lease, claim.token)
    _under_claim(ctx, schedule.id, lambda v: _settle(v, schedule.id, claim.run_id, claim.last_run, done.outcome),
                 wait=SETTLE_WAIT)  # not settled now: the next look settles it from the karma
    return ScheduleRunResult(schedule.id, claim.run_id, done.outcome, claim.scheduled, done.cost, claim.missed,
                             done.reason, done.notified, done.notify_error)


def _settle(view: Store, schedule_id: str, run_id: str, last_run: str, outcome: str) -> None:
    """A run's outcome on its schedule (unless another run has claimed it since), its marker gone."""
    try:
        schedule = load(view, schedule_id)
    except ScheduleError:
        schedule = None
    if schedule is not None and schedule.last_run == last_run and schedule.last_outcome != outcome:
        save(view, schedule.model_copy(update={"last_outcome": outcome}))
    marker = _marker(view, schedule_id)
    if marker is not None and marker.get("run") == run_id:
        view.delete(keys.schedule_running(schedule_id))


def _record(karma: Karma, schedule_id: str, scheduled: str, outcome: str, cost: float, missed: int,
            extra: dict) -> None:
    fields = {"id": schedule_id, "scheduled": scheduled, "outcome": outcome, "cost": cost,
              "missed": missed or None, **extra}
    karma.record(events.SCHEDULE_RUN, **{k: v for k, v in fields.items() if v is not None})


def _run_id(store: Store, schedule_id: str, scheduled: str) -> str:
    """``sched-ID-YYYYMMDDTHHMMSSZ`` for its scheduled time; a suffix when that karma exists already."""
    t = parse_iso(scheduled) or now_utc()
    base = f"sched-{schedule_id}-{t.strftime('%Y%m%dT%H%M%SZ')}"
    run_id, n = base, 1
    while store.log_length(keys.karma(run_id)):
        n += 1
        run_id = f"{base}-{n}"
    return run_id


def _release(store: Store, name: str, token: str) -> None:
    try:
        store.release_lease(name, token)
    except StoreUnavailable:
        pass  # it runs out on its own
    finally:
        forget_token(token)


# --- runs that died, and values that are not schedules --------------------------------------------------

def _marker(store: Store, schedule_id: str) -> dict | None:
    """The marker of the schedule's run under way; {} for one that cannot be read (its run is unknown)."""
    try:
        value = store.get(keys.schedule_running(schedule_id), "json")
    except MalformedValue:
        return {}
    if value is None:
        return None
    return value if isinstance(value, dict) else {}


def _close_dead(ctx: _Ctx, ids: Sequence[str] | None = None) -> None:
    """Record each run whose process died (its marker there, its run lease gone) and clear its marker; of
    the schedules ``ids`` only, when given."""
    if ids is None:
        markers = [(i.name[len(keys.SCHEDULE_RUNNING_PREFIX):], i.is_log)
                   for i in ctx.store.list_all(keys.SCHEDULE_RUNNING_PREFIX)]
    else:
        markers = [(i, False) for i in ids if _marker(ctx.store, i) is not None]
    for schedule_id, is_log in markers:
        if is_log or held_alive(ctx.store, keys.SCHEDULE_RUN_LEASE + schedule_id) is not None:
            continue

        def close(view: Store, schedule_id: str = schedule_id) -> None:
            marker = _marker(view, schedule_id)
            if marker is not None:
                _close_one(ctx, view, schedule_id, marker)
        _under_claim(ctx, schedule_id, close)


def _close_one(ctx: _Ctx, view: Store, schedule_id: str, marker: dict) -> None:
    """Under the claim: a run that ended without settling. Its own ``schedule_run`` entry, when it wrote one
    (it ended, then its bookkeeping did not finish), stands; else it died, and is recorded ``failed``, the
    run lease taken first so a run that is only stalled can write nothing more."""
    run_id = marker.get("run") if isinstance(marker.get("run"), str) else None
    entries = karma_mod.read(view, run_id) if run_id else []
    ended = [e for e in entries if e.get("event") == events.SCHEDULE_RUN]
    outcome = ended[-1].get("outcome") if ended else FAILED
    if run_id and not ended:
        run_lease = keys.SCHEDULE_RUN_LEASE + schedule_id
        token = owner_token(f"close-{uuid.uuid4().hex[:8]}")
        if not acquire(ctx.store, run_lease, token, ctx.ttl_ms):
            return  # running after all
        try:
            spent = sum(e["cost"] for e in entries if e.get("event") in (events.LLM_CALL, events.SPEND_SETTLED)
                        and isinstance(e.get("cost"), (int, float)) and not isinstance(e.get("cost"), bool))
            owner = marker.get("owner") or "unknown"
            _record(ctx.karma(view, run_id), schedule_id, str(marker.get("scheduled") or ""), FAILED,
                    round(spent, 10), _count(marker.get("missed")),
                    {"reason": f"it ended without recording its end: the process running it ({owner}) died "
                               "or lost its run lease; not run again"})
            ctx.kept(view, run_id)
        finally:
            _release(ctx.store, run_lease, token)
    if isinstance(outcome, str):
        _settle(view, schedule_id, run_id or "", str(marker.get("last_run") or ""), outcome)
    view.delete(keys.schedule_running(schedule_id))


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _report(ctx: _Ctx, problems: list[Problem]) -> None:
    """Each value under ``schedule:`` that is not a schedule, reported once (until it changes): a
    ``config_rejected`` entry in a karma log of its own, and a log line. One process at a time reports
    (under a claim lease no schedule id can name), so two wakes at once do not both report it."""
    store = ctx.store
    if not problems and not reported_problems(store):
        return
    logs = {i.name for i in store.list_all(keys.SCHEDULE_PREFIX) if i.is_log} if problems else set()
    found = {p.key: _fingerprint(store, p.key, p.key in logs) for p in problems}
    if found == reported_problems(store):
        return

    def report(view: Store) -> None:
        reported = reported_problems(view)
        for p in problems:
            if reported.get(p.key) == found[p.key]:
                continue
            try:
                name = check_id(p.key[len(keys.SCHEDULE_PREFIX):])
            except ScheduleError:
                name = "invalid"
            run_id = _run_id(view, name, iso(now_utc()))
            ctx.karma(view, run_id).record(events.CONFIG_REJECTED, key=p.key, reason=p.reason,
                                           note="not a schedule: it never runs until it is mended")
            ctx.kept(view, run_id)
            log.warning("%s (not run; brainstem karma %s)", p.reason, run_id)
        view.put(keys.SCHEDULE_PROBLEMS, found)
    _under_claim(ctx, PROBLEMS_CLAIM, report)


def _fingerprint(store: Store, key: str, is_log: bool) -> str:
    if is_log:
        return digest(None, is_log=True)
    try:
        return digest(store.get_text(key))
    except BrainstemError:
        return digest(None)
