"""Running the agent's schedules (:mod:`brainstem.session.schedule_run`): each due run claimed once, never
overlapping itself, what downtime missed recorded as one entry, a run that died recorded once and never run
again, and what is not a schedule reported once.

In-process against real stores (Redis and SQLite, seeded), the tool a real agent tool run in the sandbox.
The same through ``brainstem wake`` and ``brainstem run`` processes is in tests/e2e/test_schedules.py.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, parse_iso
from brainstem.core.errors import NotFound
from brainstem.session.schedule_run import due_soon, run_due, run_now
from brainstem.state.schedules import ScheduleError, load
from brainstem.store import karma, open_store
from brainstem.store.lease import host_name
from tests.helpers import dead_pid, ok, run_cli
from tests.session.conftest import ago, put_schedule
from tests.wake_helpers import event_names


def sched_karma(store) -> dict[str, list[dict]]:
    """Every schedule's karma log: run id -> its entries."""
    return {k.name[len("karma:"):]: karma.read(store, k.name[len("karma:"):])
            for k in store.list_all("karma:sched-")}


def entries_of(store, event: str) -> list[dict]:
    return [e for entries in sched_karma(store).values() for e in entries if e.get("event") == event]


# --- one due run --------------------------------------------------------------------------------------------

def test_a_due_run_runs_once_recorded_in_its_own_karma(st, configure, hello, real_store_url):
    settings = configure()
    due = ago(30)
    put_schedule(st, "prices", next_run=due)
    assert due_soon(st)
    [result] = run_due(settings, st)
    assert (result.outcome, result.scheduled, result.missed, result.cost) == ("ok", due, 0, 0.0)
    assert result.run_id == f"sched-prices-{parse_iso(due).strftime('%Y%m%dT%H%M%SZ')}"
    entries = karma.read(st, result.run_id)
    assert event_names(entries) == ["tool_start", "kv_write", "tool_complete", "schedule_run"]
    end = entries[-1]
    assert {k: end[k] for k in ("id", "scheduled", "outcome", "cost")} == {"id": "prices", "scheduled": due,
                                                                          "outcome": "ok", "cost": 0.0}
    assert "price" in end["message"] and "missed" not in end
    schedule = load(st, "prices")
    assert schedule.next_run == iso(parse_iso(due) + timedelta(hours=1))  # on the grid, not from now
    assert schedule.last_outcome == "ok" and schedule.last_run == due  # the time it was due
    assert st.get(keys.schedule_running("prices")) is None
    assert st.lease_owner(keys.SCHEDULE_RUN_LEASE + "prices") is None
    assert hello.runs() == 1
    assert not due_soon(st) and run_due(settings, st) == []  # not again
    assert hello.runs() == 1
    shown = ok(run_cli("karma", result.run_id, env={"BRAINSTEM_KV": real_store_url}))
    assert "schedule_run" in shown and "outcome=ok" in shown and "id=prices" in shown


def test_a_schedule_not_due_or_paused_is_left_alone(st, configure, hello):
    settings = configure()
    put_schedule(st, "later", next_run=iso(datetime.now(timezone.utc) + timedelta(minutes=5)))
    put_schedule(st, "paused", enabled=False)
    assert not due_soon(st)
    assert run_due(settings, st) == []
    assert hello.runs() == 0 and sched_karma(st) == {}
    assert load(st, "paused").last_run is None


def test_a_schedule_with_no_next_run_yet_gets_one_and_does_not_run(st, configure, hello):
    body = put_schedule(st, "fresh")
    del body["next_run"]
    st.put(keys.schedule("fresh"), body)
    assert due_soon(st)  # the runner fills it in
    assert run_due(configure(), st) == []
    assert parse_iso(load(st, "fresh").next_run) > datetime.now(timezone.utc)
    assert not due_soon(st) and hello.runs() == 0


@pytest.mark.parametrize("present", ["none", "not_due", "paused"])
def test_the_sleep_paths_look_is_one_list_call_and_a_get_for_each_schedule(st, monkeypatch, present):
    if present == "not_due":
        put_schedule(st, "later", next_run=iso(datetime.now(timezone.utc) + timedelta(minutes=5)))
    elif present == "paused":
        put_schedule(st, "paused", enabled=False)
    calls: list[str] = []
    for name in ("_list", "_get_text", "_get_with_metadata", "_lease_owner", "_read_log", "_log_length"):
        original = getattr(st, name)
        monkeypatch.setattr(st, name, lambda *a, _name=name, _original=original: (calls.append(_name),
                                                                                 _original(*a))[1])
    assert not due_soon(st)
    assert calls == (["_list"] if present == "none" else ["_list", "_get_text"])


@pytest.mark.parametrize("present", ["none", "not_due", "paused"])
def test_once_looked_at_the_sleep_paths_look_is_one_read_of_the_due_index(st, monkeypatch, present):
    if present == "not_due":
        put_schedule(st, "later", next_run=iso(datetime.now(timezone.utc) + timedelta(minutes=5)))
    elif present == "paused":
        put_schedule(st, "paused", enabled=False)
    assert not due_soon(st)  # the first look is a full one: it sets the index
    calls: list[str] = []
    for name in ("_list", "_get_text", "_get_with_metadata", "_lease_owner", "_read_log", "_log_length",
                 "_due_range", "_due_at", "_set_due", "_due_agents"):
        original = getattr(st, name)
        monkeypatch.setattr(st, name, lambda *a, _name=name, _original=original: (calls.append(_name),
                                                                                 _original(*a))[1])
    assert not due_soon(st)
    assert calls == ["_due_range"]


# --- downtime -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "extra", "outcome", "missed"), [
    ("skip", {}, "skipped_missed", 5),  # five runs due, the latest 5 minutes late: all missed
    ("once", {}, "ok", 4),  # within the hour of catchup: the latest runs, late, the other four missed
    ("once", {"catchup": 120}, "skipped_missed", 5),  # later than its catchup
])
def test_downtime_that_missed_several_runs_is_one_entry(st, configure, hello, policy, extra, outcome, missed):
    first = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=45)
    put_schedule(st, "tick", every="10m", next_run=iso(first), missed=policy, **extra)
    [result] = run_due(configure(), st)
    assert (result.outcome, result.missed) == (outcome, missed)
    assert result.scheduled == iso(first + timedelta(minutes=40))  # the latest run due
    [end] = entries_of(st, "schedule_run")
    assert end["outcome"] == outcome and end["missed"] == missed
    assert hello.runs() == (1 if outcome == "ok" else 0)
    schedule = load(st, "tick")
    assert schedule.next_run == iso(first + timedelta(minutes=50)) and schedule.last_outcome == outcome
    assert run_due(configure(), st) == [] and len(entries_of(st, "schedule_run")) == 1


# --- overlap, and runs that died ----------------------------------------------------------------------------

def test_a_run_due_while_the_previous_still_runs_is_skipped_and_recorded(st, configure, hello):
    holder = "otherhost:4242:sched-live"
    assert st.acquire_lease(keys.SCHEDULE_RUN_LEASE + "tick", holder, 60_000)
    due = ago(10)
    put_schedule(st, "tick", next_run=due)
    try:
        [result] = run_due(configure(), st)
    finally:
        st.release_lease(keys.SCHEDULE_RUN_LEASE + "tick", holder)
    assert result.outcome == "skipped_overlap" and holder in result.reason
    [end] = entries_of(st, "schedule_run")
    assert (end["outcome"], end["scheduled"], end["cost"]) == ("skipped_overlap", due, 0.0)
    assert hello.runs() == 0
    schedule = load(st, "tick")
    assert schedule.last_outcome == "skipped_overlap" and parse_iso(schedule.next_run) > datetime.now(timezone.utc)
    assert run_due(configure(), st) == []


def dead_run(st, schedule_id: str, **marker) -> dict:
    """What a run whose process died leaves: its run lease (held by a pid gone on this host), its marker,
    ``last_run`` set and no outcome, and whatever its karma holds."""
    owner = f"{host_name()}:{dead_pid()}:sched-dead"
    assert st.acquire_lease(keys.SCHEDULE_RUN_LEASE + schedule_id, owner, 600_000)
    started = ago(5)
    put_schedule(st, schedule_id, next_run=iso(datetime.now(timezone.utc) + timedelta(minutes=50)),
                 last_run=started)
    record = {"run": f"sched-{schedule_id}-20260101T000000Z", "owner": owner, "scheduled": ago(10),
              "last_run": started, **marker}
    st.put(keys.schedule_running(schedule_id), record)
    return record


def test_a_run_whose_process_died_is_recorded_once_and_not_run_again(st, configure, hello):
    marker = dead_run(st, "tick")
    karma.Karma(st, marker["run"]).record("tool_start", tool="hello", input={})
    assert due_soon(st)  # asleep or not, the next wake records it
    assert run_due(configure(), st) == []
    entries = karma.read(st, marker["run"])
    assert event_names(entries) == ["tool_start", "schedule_run"]
    end = entries[-1]
    assert (end["outcome"], end["scheduled"], end["cost"]) == ("failed", marker["scheduled"], 0.0)
    assert "died" in end["reason"] and marker["owner"] in end["reason"]
    assert load(st, "tick").last_outcome == "failed"
    assert st.get(keys.schedule_running("tick")) is None
    assert st.lease_owner(keys.SCHEDULE_RUN_LEASE + "tick") is None
    assert not due_soon(st) and run_due(configure(), st) == []
    assert len(entries_of(st, "schedule_run")) == 1 and hello.runs() == 0


def test_a_run_that_ended_but_did_not_settle_keeps_its_own_outcome(st, configure, hello):
    marker = dead_run(st, "tick")
    karma.Karma(st, marker["run"]).record("schedule_run", id="tick", scheduled=marker["scheduled"], outcome="ok",
                                          cost=0.0)
    assert run_due(configure(), st) == []
    assert [e["outcome"] for e in karma.read(st, marker["run"])] == ["ok"]  # no false "failed"
    assert load(st, "tick").last_outcome == "ok" and st.get(keys.schedule_running("tick")) is None


def test_a_live_run_is_never_taken_for_dead(st, configure, hello):
    dead_run(st, "tick")
    live = "otherhost:1:sched-live"  # another host's: its lease is the word
    st.release_lease(keys.SCHEDULE_RUN_LEASE + "tick", st.lease_owner(keys.SCHEDULE_RUN_LEASE + "tick"))
    assert st.acquire_lease(keys.SCHEDULE_RUN_LEASE + "tick", live, 60_000)
    try:
        assert not due_soon(st)
        assert run_due(configure(), st) == []
        assert entries_of(st, "schedule_run") == [] and st.get(keys.schedule_running("tick")) is not None
    finally:
        st.release_lease(keys.SCHEDULE_RUN_LEASE + "tick", live)


# --- two at once --------------------------------------------------------------------------------------------

def test_two_runners_at_once_run_a_due_run_once_and_record_no_skip(st, configure, hello, real_store_url):
    put_schedule(st, "tick", input={"seconds": 0.5})
    settings = configure()
    results: list = []
    stores = [open_store(real_store_url) for _ in range(2)]
    start = threading.Barrier(2)

    def runner(store):
        start.wait()
        results.extend(run_due(settings, store))
    threads = [threading.Thread(target=runner, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in stores:
        s.close()
    assert [r.outcome for r in results] == ["ok"]
    assert [e["outcome"] for e in entries_of(st, "schedule_run")] == ["ok"]
    assert hello.runs() == 1


# --- run now --------------------------------------------------------------------------------------------------

def test_run_now_runs_once_whatever_its_timing(st, configure, hello):
    later = iso(datetime.now(timezone.utc) + timedelta(minutes=30))
    put_schedule(st, "paused", next_run=later, enabled=False)
    result = run_now(configure(), st, "paused")
    assert result.outcome == "ok" and hello.runs() == 1
    assert "schedule paused: ok" in result.message and result.run_id in result.message
    schedule = load(st, "paused")
    assert schedule.next_run == later and schedule.last_outcome == "ok" and not schedule.enabled
    assert karma.read(st, result.run_id)[-1]["outcome"] == "ok"


def test_run_now_of_what_is_not_there_or_not_a_schedule_is_one_error(st, configure, hello):
    with pytest.raises(NotFound, match="no schedule 'nope'"):
        run_now(configure(), st, "nope")
    st.put(keys.schedule("bad"), "not json")
    with pytest.raises(ScheduleError, match="schedule:bad: not valid JSON"):
        run_now(configure(), st, "bad")
    with pytest.raises(ScheduleError):
        run_now(configure(), st, "no spaces")
    assert hello.runs() == 0


def test_run_now_while_it_runs_is_an_overlap(st, configure, hello):
    put_schedule(st, "tick", next_run=iso(datetime.now(timezone.utc) + timedelta(minutes=30)))
    holder = "otherhost:1:sched-live"
    assert st.acquire_lease(keys.SCHEDULE_RUN_LEASE + "tick", holder, 60_000)
    try:
        result = run_now(configure(), st, "tick")
    finally:
        st.release_lease(keys.SCHEDULE_RUN_LEASE + "tick", holder)
    assert result.outcome == "skipped_overlap" and hello.runs() == 0


# --- values that are not schedules ------------------------------------------------------------------------

def test_what_is_not_a_schedule_is_reported_once_and_the_rest_still_run(st, configure, hello):
    st.put(keys.schedule("notjson"), "every day, please")
    st.put(keys.schedule("badcron"), {"tool": "hello", "cron": "61 * * * *", "next_run": ago(60)})
    st.append(keys.schedule("alog"), "x")
    put_schedule(st, "good")
    assert due_soon(st)
    [result] = run_due(configure(), st)
    assert result.id == "good" and result.outcome == "ok"
    rejected = entries_of(st, "config_rejected")
    assert sorted(e["key"] for e in rejected) == ["schedule:alog", "schedule:badcron", "schedule:notjson"]
    assert all("\n" not in e["reason"] and e["reason"].startswith(e["key"]) for e in rejected)
    # reported: not due, not reported again, whatever the sleep path or the runner looks
    assert not due_soon(st)
    assert run_due(configure(), st) == [] and len(entries_of(st, "config_rejected")) == 3
    st.put(keys.schedule("notjson"), "every day, really")  # changed: reported again
    assert due_soon(st)
    run_due(configure(), st)
    assert len(entries_of(st, "config_rejected")) == 4 and hello.runs() == 1


def test_the_agents_runs_stay_the_minimum_interval_apart_whatever_its_schedule_says(st, configure, hello):
    """A cron the write-time check let through (a clock change years ahead brings two runs a minute apart)
    or a next run edited to now: the agent's run waits until the operator's minimum interval has passed since
    its last run, and then runs; it is not counted missed. The operator's own schedules are not held so."""
    settings = configure(schedule_min_interval=600)
    put_schedule(st, "mine", created_by="agent", every=None, cron="0,1 * * * *", last_run=ago(60), next_run=ago(1))
    assert run_due(settings, st) == [] and hello.runs() == 0
    waits = parse_iso(load(st, "mine").next_run) - parse_iso(load(st, "mine").last_run)
    assert waits == timedelta(seconds=600)
    assert not entries_of(st, "schedule_run")  # waiting is not a missed run
    put_schedule(st, "theirs", created_by="operator", every=None, cron="0,1 * * * *", last_run=ago(60),
                 next_run=ago(1))
    assert [r.outcome for r in run_due(settings, st)] == ["ok"] and hello.runs() == 1
    st.put(keys.schedule("mine"), {**st.get(keys.schedule("mine"), "json"), "last_run": ago(700),
                                    "next_run": ago(1)})
    assert [r.id for r in run_due(settings, st)] == ["mine"] and hello.runs() == 2


def test_a_run_in_the_same_process_never_takes_the_agents_claim_and_runs_a_due_time_twice(st, configure, hello,
                                                                                         monkeypatch):
    """The daemon runs sessions and schedules in one process: a pass landing while the agent's batch is checked
    and written finds the agent's claim (a live one, not a dead holder's), leaves the schedule, and the due
    time runs once, after the batch."""
    from brainstem.state import schedules as schedules_mod
    from brainstem.state.guarded import AgentKV

    settings = configure()
    due = ago(5)
    put_schedule(st, "race", created_by="agent", next_run=due)
    monkeypatch.setattr(schedules_mod, "CLAIM_WAIT", 0.2)
    original = AgentKV._perform

    def perform_with_a_pass(self, writes, source):
        assert run_due(settings, st) == []  # the claim is the agent's: this pass runs nothing
        return original(self, writes, source)

    monkeypatch.setattr(AgentKV, "_perform", perform_with_a_pass)
    AgentKV(st, limits=schedules_mod.Limits(300, 20)).apply_operations(
        [{"op": "put", "key": "schedule:race", "value": {"tool": "hello", "input": {"who": "bob"}, "every": "1h",
                                                          "notify": "inbox"}}])
    monkeypatch.setattr(AgentKV, "_perform", original)
    assert load(st, "race").next_run == due and hello.runs() == 0
    assert [r.scheduled for r in run_due(settings, st)] == [due]
    assert run_due(settings, st) == [] and hello.runs() == 1
