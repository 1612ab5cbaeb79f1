"""Schedules at the boundary (the JSON an operator or the agent writes), in the store, within the operator's
limits, and what a schedule that is due (or long overdue) does now."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from brainstem.core import keys, recurrence
from brainstem.core.clock import iso
from brainstem.core.errors import KVWriteRefused
from brainstem.state import schedules as sch
from brainstem.state.schedules import Decision, Inventory, Limits, ScheduleError, ScheduleRefused

UTC = timezone.utc
NOW = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def make(**fields) -> sch.Schedule:
    return sch.parse(fields.pop("id", "s1"), {"tool": "fetch", **fields})


# --- the boundary ---------------------------------------------------------------------------------------


def test_what_the_agent_leaves_out_is_filled_with_the_defaults():
    s = sch.parse("s1", {"tool": "fetch", "every": "30m"})
    assert sch.dump(s) == {"id": "s1", "tool": "fetch", "input": {}, "every": "30m", "tz": "UTC", "notify": "none",
                           "missed": "once", "catchup": 3600, "enabled": True, "created_by": "agent"}
    assert s.next_run is s.last_run is s.last_outcome is s.synthesize is None
    assert s.rule == recurrence.Every("30m", 1800)


def test_a_full_schedule_survives_the_round_trip():
    raw = {"id": "daily-report", "tool": "report", "input": {"pairs": ["ETH", "BTC"], "depth": 2},
           "cron": "0 9 * * MON-FRI", "tz": "Europe/London", "notify": "telegram",
           "synthesize": "Summarise the prices in one line.", "missed": "skip", "catchup": 600, "enabled": False,
           "created_by": "operator", "next_run": "2026-05-04T08:00:00Z", "last_run": "2026-05-01T08:00:00Z",
           "last_outcome": "ok"}
    s = sch.parse("daily-report", raw)
    assert sch.dump(s) == raw
    assert sch.parse("daily-report", json.loads(json.dumps(sch.dump(s)))) == s
    assert isinstance(s.rule, recurrence.Cron) and s.rule.tz == "Europe/London"


def test_times_are_kept_as_iso_utc_to_the_second():
    s = make(every="1h", next_run="2026-05-04T12:00:00+02:00", last_run="2026-05-04T09:59:59.750Z")
    assert (s.next_run, s.last_run) == ("2026-05-04T10:00:00Z", "2026-05-04T09:59:59Z")


def test_the_id_comes_from_the_key_and_must_agree_with_it():
    assert sch.parse("abc", {"id": "abc", "tool": "t", "every": "1h"}).id == "abc"
    with pytest.raises(ScheduleError, match=r"^schedule:abc: id 'xyz' is not the key's id 'abc'$"):
        sch.parse("abc", {"id": "xyz", "tool": "t", "every": "1h"})


@pytest.mark.parametrize("bad_id", ["", "a:b", "a b", "-x", "_x", "x" * 65, "é", "a\n", "a/b", None, 7])
def test_an_id_that_cannot_name_a_key_is_refused(bad_id):
    with pytest.raises(ScheduleError, match="is not 1-64 letters, digits"):
        sch.parse(bad_id, {"tool": "t", "every": "1h"})


def test_new_ids_are_short_safe_and_fresh(monkeypatch):
    ids = {sch.new_id() for _ in range(50)}
    assert len(ids) == 50 and all(sch.check_id(i) == i and len(i) == 8 for i in ids)
    answers = iter(["aaaaaaaa", "bbbbbbbb", "cccccccc"])
    monkeypatch.setattr(sch.secrets, "token_hex", lambda n: next(answers))
    assert sch.new_id({"aaaaaaaa", "bbbbbbbb"}) == "cccccccc"


def test_keys_and_ids():
    assert keys.schedule("abc") == "schedule:abc" and keys.SCHEDULE_PREFIX == "schedule:"
    assert sch.id_of("schedule:abc") == "abc" and sch.id_of("config:x") is None
    assert "schedule" in keys.DEFAULT_AGENT_SEGMENTS  # no agent may be named "schedule"


@pytest.mark.parametrize("raw, says", [
    ([], "a schedule is a JSON object, got list"),
    ("every 5m", "a schedule is a JSON object, got str"),
    (None, "a schedule is a JSON object, got NoneType"),
    ({"every": "1h"}, "tool: missing"),
    ({"tool": "t"}, "give exactly one of every"),
    ({"tool": "t", "every": "1h", "cron": "0 * * * *"}, "give exactly one of every"),
    ({"tool": "t", "every": None, "cron": None}, "give exactly one of every"),
    ({"tool": "t", "every": "often"}, "every 'often' is not a duration"),
    ({"tool": "t", "every": "0s"}, "out of range"),
    ({"tool": "t", "every": 1800}, "every: Input should be a valid string"),
    ({"tool": "t", "cron": "0 9 * *"}, "has 4 fields"),
    ({"tool": "t", "cron": "0 25 * * *"}, "hour '25' is out of range 0-23"),
    ({"tool": "t", "cron": "0 0 31 2 *"}, "never runs"),
    ({"tool": "t", "cron": "0 9 * * *", "tz": "Mars/Olympus"}, "tz 'Mars/Olympus' is not a known time zone"),
    ({"tool": "t", "cron": "0 9 * * *", "tz": 5}, "tz: Input should be a valid string"),
    ({"tool": "t", "every": "1d", "tz": "Europe/London"}, "goes with cron only"),
    ({"tool": "t:x", "every": "1h"}, "tool: 't:x' is not a tool's name"),
    ({"tool": "", "every": "1h"}, "tool: '' is not a tool's name"),
    ({"tool": "a b", "every": "1h"}, "is not a tool's name"),
    ({"tool": 5, "every": "1h"}, "is not a tool's name"),
    ({"tool": "t", "every": "1h", "input": [1, 2]}, "input: the tool's input is a JSON object, got list"),
    ({"tool": "t", "every": "1h", "input": "x=1"}, "input: the tool's input is a JSON object, got str"),
    ({"tool": "t", "every": "1h", "notify": "email"}, "notify: Input should be 'none', 'inbox' or 'telegram'"),
    ({"tool": "t", "every": "1h", "missed": "all"}, "missed: Input should be 'skip' or 'once'"),
    ({"tool": "t", "every": "1h", "catchup": -1}, "catchup: Input should be greater than or equal to 0"),
    ({"tool": "t", "every": "1h", "catchup": 8 * 86400}, "catchup: Input should be less than or equal to 604800"),
    ({"tool": "t", "every": "1h", "catchup": "3600"}, "catchup: Input should be a valid integer"),
    ({"tool": "t", "every": "1h", "catchup": 3600.5}, "catchup: Input should be a valid integer"),
    ({"tool": "t", "every": "1h", "catchup": True}, "catchup: Input should be a valid integer"),
    ({"tool": "t", "every": "1h", "enabled": "yes"}, "enabled: Input should be a valid boolean"),
    ({"tool": "t", "every": "1h", "enabled": 1}, "enabled: Input should be a valid boolean"),
    ({"tool": "t", "every": "1h", "created_by": "root"}, "created_by: Input should be 'operator' or 'agent'"),
    ({"tool": "t", "every": "1h", "synthesize": ""}, "synthesize: String should have at least 1 character"),
    ({"tool": "t", "every": "1h", "synthesize": "x" * 4001}, "synthesize: String should have at most 4000"),
    ({"tool": "t", "every": "1h", "next_run": "tomorrow"}, "next_run: 'tomorrow' is not an ISO-8601 time"),
    ({"tool": "t", "every": "1h", "last_run": 1714816800}, "last_run: Input should be a valid string"),
    ({"tool": "t", "every": "1h", "last_outcome": "great"}, "last_outcome: Input should be 'ok', 'failed'"),
    ({"tool": "t", "evry": "1h"}, "evry: not a field of a schedule (id, tool, input, every, cron, tz"),
])
def test_a_bad_schedule_is_one_line_naming_the_key_and_the_field(raw, says):
    with pytest.raises(ScheduleError) as exc:
        sch.parse("s1", raw)
    message = str(exc.value)
    assert message.startswith("schedule:s1: ") and "\n" not in message, message
    assert says in message, message
    assert exc.value.exit_code == 2


def test_text_that_is_not_json_is_one_line():
    with pytest.raises(ScheduleError, match=r"^schedule:s1: not valid JSON \("):
        sch.parse_text("s1", "{tool: fetch}")


# --- the store ------------------------------------------------------------------------------------------


def test_a_schedule_saved_is_the_schedule_loaded(sqlite_store):
    s = make(id="abc", cron="*/30 * * * *", tz="America/New_York", next_run="2026-05-04T10:00:00Z")
    sch.save(sqlite_store, s)
    assert json.loads(sqlite_store.get_text("schedule:abc")) == sch.dump(s)
    assert sch.load(sqlite_store, "abc") == s
    assert sch.load(sqlite_store, "nope") is None


def test_loading_a_malformed_schedule_says_why(sqlite_store):
    sqlite_store.put("schedule:abc", {"tool": "fetch"})
    with pytest.raises(ScheduleError, match="^schedule:abc: give exactly one of every"):
        sch.load(sqlite_store, "abc")


def test_load_all_reports_what_is_malformed_and_keeps_the_rest(sqlite_store):
    store = sqlite_store
    sch.save(store, make(id="good1", every="1h"))
    sch.save(store, make(id="good2", cron="0 9 * * *", created_by="operator"))
    store.put("schedule:broken-json", "{not json")
    store.put("schedule:a-list", [1, 2])
    store.put("schedule:no-timing", {"tool": "fetch", "created_by": "operator"})
    store.put("schedule:bad:id", {"tool": "fetch", "every": "1h"})
    store.put("schedule:wrong-id", {"id": "other", "tool": "fetch", "every": "1h"})
    store.append("schedule:a-log", {"tool": "fetch"})
    store.put("schedules_note", "not under the prefix")
    inventory = sch.load_all(store)
    assert [s.id for s in inventory.schedules] == ["good1", "good2"]
    problems = {p.key: p for p in inventory.problems}
    assert sorted(problems) == ["schedule:a-list", "schedule:a-log", "schedule:bad:id", "schedule:broken-json",
                                "schedule:no-timing", "schedule:wrong-id"]
    assert "not valid JSON" in problems["schedule:broken-json"].reason
    assert "a schedule is a JSON object, got list" in problems["schedule:a-list"].reason
    assert "a log, not a schedule" in problems["schedule:a-log"].reason
    assert "is not 1-64 letters" in problems["schedule:bad:id"].reason
    assert all("\n" not in p.reason for p in inventory.problems)
    # a malformed schedule that says it is the operator's is still the operator's
    assert problems["schedule:no-timing"].operator and not problems["schedule:a-list"].operator
    assert inventory.operators("no-timing") and inventory.operators("good2") and not inventory.operators("good1")
    assert inventory.agent_count() == 1


def test_load_all_of_an_empty_store_is_empty(sqlite_store):
    assert sch.load_all(sqlite_store) == Inventory()


def test_each_agent_sees_only_its_own_schedules(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    path = tmp_path / "store.db"
    with SQLiteStore(path, prefix="alice") as alice, SQLiteStore(path, prefix="bob") as bob:
        sch.save(alice, make(id="a1", every="1h"))
        sch.save(bob, make(id="b1", every="2h"))
        assert [s.id for s in sch.load_all(alice).schedules] == ["a1"]
        assert [s.id for s in sch.load_all(bob).schedules] == ["b1"]
        assert sch.load(bob, "a1") is None


def test_when_a_schedule_runs_reads_as_a_person_writes_it():
    assert make(every="30m").when == "every 30m"
    assert make(cron="0 9 * * MON-FRI").when == "cron 0 9 * * MON-FRI"
    assert make(cron="@daily", tz="Europe/London").when == "cron @daily (Europe/London)"


def test_its_next_run_is_the_stored_one_or_the_first_after_now_and_none_while_paused():
    assert sch.upcoming(make(every="1h", next_run="2026-05-04T09:00:00Z"), NOW) == "2026-05-04T09:00:00Z"
    assert sch.upcoming(make(every="1h"), NOW) == "2026-05-04T11:00:00Z"
    assert sch.upcoming(make(cron="0 12 * * *"), NOW) == "2026-05-04T12:00:00Z"
    assert sch.upcoming(make(every="1h", enabled=False, next_run="2026-05-04T09:00:00Z"), NOW) is None


def test_an_inventory_after_a_write_or_a_removal():
    a, b = make(id="a", every="1h"), make(id="b", every="1h")
    broken = sch.Problem("schedule:c", "schedule:c: bad")
    inventory = Inventory([a, b], [broken])
    assert inventory.replaced("b", None) == Inventory([a], [broken])
    c = make(id="c", every="2h")
    assert inventory.replaced("c", c) == Inventory([a, b, c], [])  # a schedule there now, not a broken value
    assert inventory.replaced("a", make(id="a", every="3h")).get("a").every == "3h"
    assert inventory == Inventory([a, b], [broken])  # unchanged itself


def test_the_limits_come_from_the_operators_settings():
    from brainstem.core.settings import load_settings

    assert Limits.from_settings(load_settings(schedule_min_interval=60, schedule_max=2)) == Limits(60, 2)
    assert Limits.from_settings(load_settings()) == Limits()


# --- the agent's limits ---------------------------------------------------------------------------------

LIMITS = Limits(min_interval=300, max_count=3)


def agent_write(inventory: Inventory, raw, schedule_id: str = "mine", limits: Limits = LIMITS, now=NOW):
    return sch.check_agent_write(inventory, schedule_id, raw, limits, now)


def test_the_agents_schedule_is_checked_and_filled_in():
    s = agent_write(Inventory(), {"tool": "fetch", "every": "30m", "input": {"q": 1}})
    assert s.created_by == "agent" and s.next_run == "2026-05-04T10:30:00Z" and s.last_run is None
    c = agent_write(Inventory(), {"tool": "fetch", "cron": "0 9 * * *", "tz": "America/New_York"})
    assert c.next_run == "2026-05-04T13:00:00Z"


def test_a_refusal_is_a_write_refused_in_one_line():
    with pytest.raises(KVWriteRefused) as exc:
        agent_write(Inventory(), {"tool": "fetch", "every": "1m"})
    assert isinstance(exc.value, ScheduleRefused) and "\n" not in str(exc.value)


@pytest.mark.parametrize("raw, says", [
    ({"every": "1m"}, "would run as often as every 1m; the operator's minimum is 5m"),
    ({"every": "299s"}, "as often as every 299s"),
    ({"cron": "*/2 * * * *"}, "as often as every 2m"),
    ({"cron": "0,1 9 * * *"}, "as often as every 1m"),
    # 01:30 and 02:30 an hour apart, but half an hour on the day New York's clocks go forward
    ({"cron": "30 1,2 * * *", "tz": "America/New_York"}, "as often as every 30m; the operator's minimum is 1h"),
])
def test_the_agent_may_not_schedule_more_often_than_the_operator_allows(raw, says):
    limits = Limits(min_interval=3600 if "tz" in raw else 300, max_count=20)
    with pytest.raises(ScheduleRefused, match="BRAINSTEM_SCHEDULE_MIN_INTERVAL") as exc:
        agent_write(Inventory(), {"tool": "fetch", **raw}, limits=limits)
    assert says in str(exc.value)


@pytest.mark.parametrize("raw", [{"every": "5m"}, {"cron": "*/5 * * * *"}, {"cron": "30 1,2 * * *", "tz": "UTC"}])
def test_as_often_as_the_minimum_is_allowed(raw):
    agent_write(Inventory(), {"tool": "fetch", **raw}, limits=Limits(min_interval=300 if "every" in raw
                                                                     or "*/5" in raw["cron"] else 3600))


def inventory_of(*schedules: sch.Schedule) -> Inventory:
    return Inventory(schedules=list(schedules))


def test_the_agent_may_have_at_most_max_count_schedules_of_its_own():
    full = inventory_of(*(make(id=f"a{i}", every="1h") for i in range(3)),
                        make(id="op1", every="1h", created_by="operator"))
    with pytest.raises(ScheduleRefused, match=r"the agent has 3 schedules, the most the operator allows "
                                              r"\(BRAINSTEM_SCHEDULE_MAX 3\)"):
        agent_write(full, {"tool": "fetch", "every": "1h"}, "a3")
    assert agent_write(full, {"tool": "fetch", "every": "2h"}, "a1").every == "2h"  # rewriting one of them is fine
    two = inventory_of(make(id="a0", every="1h"), make(id="a1", every="1h"),
                       *(make(id=f"op{i}", every="1h", created_by="operator") for i in range(5)))
    assert agent_write(two, {"tool": "fetch", "every": "1h"}, "a2").id == "a2"  # the operator's are not counted


def test_the_agent_may_never_change_or_remove_the_operators_schedule():
    operators = make(id="ops", every="1h", created_by="operator")
    inventory = inventory_of(operators)
    for raw in ({"tool": "fetch", "every": "2h"}, {"tool": "fetch", "every": "2h", "created_by": "operator"},
                {"tool": "fetch", "every": "1h", "enabled": False}, {"bad": "value"}):
        with pytest.raises(ScheduleRefused, match="^schedule:ops is the operator's schedule"):
            agent_write(inventory, raw, "ops")
    with pytest.raises(ScheduleRefused, match="^schedule:ops is the operator's schedule"):
        sch.check_agent_delete(inventory, "ops")
    sch.check_agent_delete(inventory, "other")  # its own, or one that is not there: fine
    broken = Inventory(problems=[sch.Problem("schedule:ops", "broken", operator=True)])
    with pytest.raises(ScheduleRefused):
        agent_write(broken, {"tool": "fetch", "every": "1h"}, "ops")
    with pytest.raises(ScheduleRefused):
        sch.check_agent_delete(broken, "ops")
    # a malformed value that is not the operator's the agent may put right
    assert agent_write(Inventory(problems=[sch.Problem("schedule:mine", "broken")]),
                       {"tool": "fetch", "every": "1h"}).every == "1h"


def test_the_agent_may_not_claim_a_schedule_is_the_operators():
    with pytest.raises(ScheduleRefused, match="created_by is 'agent' for a schedule the agent writes, got 'operator'"):
        agent_write(Inventory(), {"tool": "fetch", "every": "1h", "created_by": "operator"})
    assert agent_write(Inventory(), {"tool": "fetch", "every": "1h", "created_by": "agent"}).created_by == "agent"


def test_a_malformed_write_from_the_agent_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="^schedule:mine: give exactly one of every"):
        agent_write(Inventory(), {"tool": "fetch"})
    with pytest.raises(ScheduleError, match="is not 1-64 letters"):
        agent_write(Inventory(), {"tool": "fetch", "every": "1h"}, "bad:id")


def test_the_runtimes_fields_are_the_runtimes():
    """Whatever the agent says of next_run, last_run and last_outcome, the stored schedule's stand; a new
    timing gets a next run computed afresh."""
    old = make(id="mine", every="1h", next_run="2026-05-04T10:20:00Z", last_run="2026-05-04T09:20:00Z",
               last_outcome="failed")
    inventory = inventory_of(old)
    forged = {"next_run": "2026-05-04T10:00:00Z", "last_run": "2020-01-01T00:00:00Z", "last_outcome": "ok"}
    same = agent_write(inventory, {"tool": "fetch", "every": "1h", "notify": "inbox", **forged})
    assert (same.next_run, same.last_run, same.last_outcome, same.notify) == (
        "2026-05-04T10:20:00Z", "2026-05-04T09:20:00Z", "failed", "inbox")
    retimed = agent_write(inventory, {"tool": "fetch", "every": "2h", **forged})
    assert (retimed.next_run, retimed.last_run, retimed.last_outcome) == (
        "2026-05-04T12:00:00Z", "2026-05-04T09:20:00Z", "failed")
    fresh = agent_write(Inventory(), {"tool": "fetch", "every": "1h", **forged})
    assert (fresh.next_run, fresh.last_run, fresh.last_outcome) == ("2026-05-04T11:00:00Z", None, None)


def test_a_schedule_retimed_right_after_it_ran_waits_out_the_minimum():
    """Rewriting a cron just after a run does not buy a second run inside the operator's minimum."""
    old = make(id="mine", cron="*/10 * * * *", next_run="2026-05-04T10:10:00Z", last_run="2026-05-04T09:59:00Z")
    s = agent_write(inventory_of(old), {"tool": "fetch", "cron": "*/5 * * * *"}, limits=Limits(300, 20))
    assert s.next_run == "2026-05-04T10:05:00Z"
    assert sch.first_run(recurrence.parse_cron("* * * * *"), NOW, "2026-05-04T09:59:00Z", 600) == \
        "2026-05-04T10:09:00Z"


def test_an_operators_schedule_gets_its_next_run_filled():
    s = sch.filled(make(every="1h", created_by="operator"), NOW)
    assert s.next_run == "2026-05-04T11:00:00Z"
    kept = make(every="1h", next_run="2026-06-01T00:00:00Z")
    assert sch.filled(kept, NOW) is kept


def test_the_agents_checked_schedule_stores_and_loads(sqlite_store):
    s = sch.check_agent_write(sch.load_all(sqlite_store), "mine", {"tool": "fetch", "every": "1h"}, LIMITS, NOW)
    sch.save(sqlite_store, s)
    assert sch.load(sqlite_store, "mine") == s
    assert sch.load_all(sqlite_store).agent_count() == 1


# --- what is due ----------------------------------------------------------------------------------------


def decide(now: str, grace: float = sch.GRACE, **fields) -> Decision:
    return sch.decide(make(**fields), at(now), grace)


def test_a_schedule_not_yet_due_waits():
    assert decide("2026-05-04T09:59:59Z", every="30m", next_run="2026-05-04T10:00:00Z") == \
        Decision("wait", "2026-05-04T10:00:00Z")


def test_a_schedule_with_no_next_run_waits_for_its_first():
    assert decide("2026-05-04T10:00:00Z", every="30m") == Decision("wait", "2026-05-04T10:30:00Z")
    assert decide("2026-05-04T10:00:00Z", cron="0 12 * * *") == Decision("wait", "2026-05-04T12:00:00Z")


def test_a_disabled_schedule_is_off():
    assert decide("2026-05-05T10:00:00Z", every="30m", next_run="2026-05-04T10:00:00Z", enabled=False) == \
        Decision("off", "2026-05-04T10:00:00Z")


@pytest.mark.parametrize("missed", ["once", "skip"])
def test_a_run_on_time_runs_whatever_missed_says_and_keeps_to_its_grid(missed):
    d = decide("2026-05-04T10:00:45Z", every="30m", next_run="2026-05-04T10:00:00Z", missed=missed)
    assert d == Decision("run", "2026-05-04T10:30:00Z", "2026-05-04T10:00:00Z", 0)
    d = decide("2026-05-04T09:00:59Z", cron="0 9 * * *", next_run="2026-05-04T09:00:00Z", missed=missed)
    assert d == Decision("run", "2026-05-05T09:00:00Z", "2026-05-04T09:00:00Z", 0)


def test_after_downtime_once_runs_once_late_within_catchup():
    """Down from 09:50 to 12:10: five runs were due (10:00 ... 12:00); the latest is ten minutes late."""
    d = decide("2026-05-04T12:10:00Z", every="30m", next_run="2026-05-04T10:00:00Z")
    assert d == Decision("run", "2026-05-04T12:30:00Z", "2026-05-04T12:00:00Z", missed=4)


def test_after_downtime_skip_skips_every_run_due():
    d = decide("2026-05-04T12:10:00Z", every="30m", next_run="2026-05-04T10:00:00Z", missed="skip")
    assert d == Decision("skip", "2026-05-04T12:30:00Z", "2026-05-04T12:00:00Z", missed=5)


def test_once_outside_catchup_skips():
    d = decide("2026-05-04T12:10:00Z", every="30m", next_run="2026-05-04T10:00:00Z", catchup=300)
    assert d == Decision("skip", "2026-05-04T12:30:00Z", "2026-05-04T12:00:00Z", missed=5)
    d = decide("2026-05-04T12:10:00Z", every="30m", next_run="2026-05-04T10:00:00Z", catchup=600)
    assert d.action == "run"  # exactly catchup late still runs


@pytest.mark.parametrize("now, action, missed", [
    ("2026-05-04T09:40:00Z", "run", 0),  # 40 minutes late, within the hour of catchup
    ("2026-05-04T10:00:00Z", "run", 0),  # exactly an hour
    ("2026-05-04T10:30:00Z", "skip", 1),  # past it
    ("2026-05-06T09:30:00Z", "run", 2),  # down two days: the 4th and 5th missed, the 6th half an hour late
    ("2026-05-06T10:30:00Z", "skip", 3),
])
def test_a_daily_cron_after_downtime(now, action, missed):
    d = decide(now, cron="0 9 * * *", tz="UTC", next_run="2026-05-04T09:00:00Z")
    assert (d.action, d.missed, d.counted_all) == (action, missed, True)
    assert d.next_run == iso(recurrence.next_after(recurrence.parse_cron("0 9 * * *"), at(now)))


def test_catchup_zero_still_runs_what_is_on_time():
    assert decide("2026-05-04T10:00:30Z", every="1h", next_run="2026-05-04T10:00:00Z", catchup=0).action == "run"
    assert decide("2026-05-04T10:05:00Z", every="1h", next_run="2026-05-04T10:00:00Z", catchup=0).action == "skip"
    assert decide("2026-05-04T10:05:00Z", every="1h", next_run="2026-05-04T10:00:00Z", catchup=0,
                  grace=600).action == "run"


def test_a_year_down_is_counted_quickly_and_bounded():
    """An every-minute cron a year overdue: at most MISSED_CAP counted one by one, then a floor."""
    import time

    began = time.perf_counter()
    d = decide("2027-05-04T10:00:20Z", cron="* * * * *", next_run="2026-05-04T10:00:00Z", created_by="operator")
    assert time.perf_counter() - began < 1.0
    assert d == Decision("run", "2027-05-04T10:01:00Z", "2027-05-04T10:00:00Z", sch.MISSED_CAP - 1,
                         counted_all=False)
    d = decide("2027-05-04T10:00:20Z", cron="* * * * *", next_run="2026-05-04T10:00:00Z", missed="skip", grace=10)
    assert (d.action, d.missed, d.counted_all, d.due) == ("skip", sch.MISSED_CAP, False, "2027-05-04T10:00:00Z")
    # every: counted exactly, however many
    d = decide("2027-05-04T10:00:20Z", every="1m", next_run="2026-05-04T10:00:00Z")
    assert (d.action, d.missed, d.counted_all) == ("run", 365 * 1440, True)


def test_exactly_at_the_cap_is_still_counted_all():
    first = at("2026-05-04T10:00:00Z")
    now = first + timedelta(minutes=sch.MISSED_CAP - 1, seconds=5)
    d = sch.decide(make(cron="* * * * *", next_run="2026-05-04T10:00:00Z"), now)
    assert (d.missed, d.counted_all) == (sch.MISSED_CAP - 1, True)
    d = sch.decide(make(cron="* * * * *", next_run="2026-05-04T10:00:00Z"), now + timedelta(minutes=1))
    assert (d.missed, d.counted_all) == (sch.MISSED_CAP - 1, False)


def test_an_operators_next_run_off_the_cron_counts_as_the_first_due():
    d = decide("2026-05-04T10:20:00Z", cron="0 * * * *", next_run="2026-05-04T09:17:00Z")
    assert d == Decision("run", "2026-05-04T11:00:00Z", "2026-05-04T10:00:00Z", missed=1)


@hyp_settings(max_examples=300, deadline=None)
@given(seconds=st.integers(60, 7 * 86400), late=st.integers(0, 30 * 86400), catchup=st.integers(0, 7 * 86400),
       missed=st.sampled_from(["skip", "once"]))
def test_decide_for_every(seconds, late, catchup, missed):
    first = at("2026-05-04T10:00:00Z")
    now = first + timedelta(seconds=late)
    s = make(every=f"{seconds}s", next_run="2026-05-04T10:00:00Z", catchup=catchup, missed=missed)
    d = sch.decide(s, now)
    due = late // seconds + 1
    latest = first + timedelta(seconds=(due - 1) * seconds)
    allowed = sch.GRACE if missed == "skip" else max(sch.GRACE, catchup)
    assert d.due == iso(latest) and d.counted_all
    assert (d.action, d.missed) == (("run", due - 1) if (now - latest).total_seconds() <= allowed else ("skip", due))
    nxt = at(d.next_run)
    assert now < nxt <= now + timedelta(seconds=seconds) and (nxt - first).total_seconds() % seconds == 0


@hyp_settings(max_examples=100, deadline=None)
@given(cron=st.sampled_from(["*/5 * * * *", "0 9 * * MON-FRI", "30 1,2 * * *", "0 0 1 * *", "15 */3 * * *"]),
       tz=st.sampled_from(["UTC", "America/New_York", "Europe/London"]),
       first=st.datetimes(datetime(2025, 1, 1), datetime(2027, 1, 1)), late=st.integers(0, 20 * 86400),
       catchup=st.integers(0, 7 * 86400), missed=st.sampled_from(["skip", "once"]))
def test_decide_for_cron(cron, tz, first, late, catchup, missed):
    rule = recurrence.parse_cron(cron, tz)
    start = recurrence.next_after(rule, first.replace(tzinfo=UTC))
    now = start + timedelta(seconds=late)
    s = make(cron=cron, tz=tz, next_run=iso(start), catchup=catchup, missed=missed)
    d = sch.decide(s, now)
    due = [start, *recurrence.runs(rule, start, now, cap=100_000)]
    allowed = sch.GRACE if missed == "skip" else max(sch.GRACE, catchup)
    assert d.due == iso(due[-1])
    expected = ("run", len(due) - 1) if (now - due[-1]).total_seconds() <= allowed else ("skip", len(due))
    if len(due) < sch.MISSED_CAP:
        assert (d.action, d.missed, d.counted_all) == (*expected, True)
    else:
        assert d.action == expected[0] and not d.counted_all
    assert d.next_run == iso(recurrence.next_after(rule, now))
