"""The agent's guarded view: soul immutable on every path, batches all-or-nothing, schedules its own and within
the operator's limits."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from brainstem.core import events
from brainstem.core.errors import KVWriteRefused, SoulImmutable
from brainstem.state.guarded import AgentKV, check_key
from brainstem.state.schedules import Limits
from tests.helpers import Recorder


@pytest.fixture
def agent(store):
    store.put("soul", "I am the soul.")
    rec = Recorder()
    return AgentKV(store, rec), store, rec


def test_soul_cannot_be_put(agent):
    kv, store, rec = agent
    with pytest.raises(SoulImmutable):
        kv.put("soul", "I am someone else now.")
    assert store.get("soul") == "I am the soul."
    assert rec.of(events.KV_WRITE_REFUSED)[0]["key"] == "soul"


def test_soul_cannot_be_deleted(agent):
    kv, store, _ = agent
    with pytest.raises(SoulImmutable):
        kv.delete("soul")
    assert store.get("soul") == "I am the soul."


@pytest.mark.parametrize("old,new", [("soul", "elsewhere"), ("notes", "soul")])
def test_soul_cannot_be_renamed_from_or_onto(agent, old, new):
    kv, store, _ = agent
    store.put("notes", "overwrite the soul with me")
    with pytest.raises(SoulImmutable):
        kv.rename(old, new)
    assert store.get("soul") == "I am the soul."
    assert store.get("notes") == "overwrite the soul with me"


@pytest.mark.parametrize("batch", [
    [{"op": "put", "key": "wisdom", "value": "fine"}, {"op": "put", "key": "soul", "value": "evil"}],
    [{"op": "put", "key": "wisdom", "value": "fine"}, {"op": "delete", "key": "soul"}],
    [{"op": "put", "key": "x", "value": "evil"}, {"op": "rename", "key": "x", "value": "soul"}],
    [{"op": "rename", "key": "soul", "value": "old_soul"}],
])
def test_soul_cannot_change_through_a_batch_and_nothing_else_applies(agent, batch):
    kv, store, rec = agent
    with pytest.raises(SoulImmutable):
        kv.apply_operations(batch)
    assert store.get("soul") == "I am the soul."
    assert store.get("wisdom") is None and store.get("x") is None and store.get("old_soul") is None
    assert rec.of(events.KV_OPERATIONS_REJECTED)
    assert not rec.of(events.KV_WRITE)


def test_invalid_op_rejects_the_whole_batch_and_records_why(agent):
    kv, store, rec = agent
    batch = [{"op": "put", "key": "a", "value": 1}, {"operation": "set", "key": "b", "value": 2}]
    with pytest.raises(KVWriteRefused, match="invalid kv_operations"):
        kv.apply_operations(batch)
    assert store.get("a") is None and store.get("b") is None
    (rejected,) = rec.of(events.KV_OPERATIONS_REJECTED)
    assert "operation 1" in rejected["reason"] and rejected["operations"] == batch


@pytest.mark.parametrize("batch", [
    "not a list",
    [{"op": "put", "key": "a"}],                      # no value
    [{"op": "delete", "key": "a", "extra": 1}],       # unknown field
    [{"op": "rename", "key": "nope", "value": "b"}],  # source does not exist
    [{"op": "put", "key": "bad::key", "value": 1}],
    [{"op": "put", "key": "ok", "value": 1}] * 101,   # too many
])
def test_malformed_batches_are_rejected_whole(agent, batch):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused):
        kv.apply_operations(batch)
    assert [k.name for k in store.list_all()] == ["soul"]


def test_valid_batch_applies_in_order_including_rename_of_a_key_it_created(agent):
    kv, store, _ = agent
    done = kv.apply_operations([
        {"op": "put", "key": "draft", "value": {"n": 1}},
        {"op": "rename", "key": "draft", "value": "notes:final"},
        {"op": "put", "key": "gone", "value": "x"},
        {"op": "delete", "key": "gone"},
    ])
    assert len(done) == 4
    assert store.get("notes:final", "json") == {"n": 1}
    assert store.get("draft") is None and store.get("gone") is None


def test_rename_of_a_key_deleted_earlier_in_the_batch_is_caught_before_writing(agent):
    kv, store, _ = agent
    store.put("a", "1")
    with pytest.raises(KVWriteRefused, match="does not exist"):
        kv.apply_operations([{"op": "put", "key": "b", "value": 2}, {"op": "delete", "key": "a"},
                             {"op": "rename", "key": "a", "value": "c"}])
    assert store.get("a") == "1" and store.get("b") is None


@pytest.mark.parametrize("key", ["session_counter", "session:current", "karma:1", "wake_config",
                                 "provider:llm:last_working:code", "last_reflect", "deep_reflect_schedule"])
def test_runtime_owned_keys_are_refused(agent, key):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused, match="owned by the runtime"):
        kv.put(key, "x")
    assert store.get(key) is None


@pytest.mark.parametrize("key", ["", "a::b", ":a", "a:", "tab\there", "nl\nx", "zero\u200bwidth", " padded",
                                 "__meta__:x", "__lock__:wake", "x" * 600, 42])
def test_malformed_keys_are_refused(agent, key):
    kv, _, _ = agent
    with pytest.raises(KVWriteRefused):
        kv.put(key, "x")


def test_good_keys_pass():
    for key in ["wisdom", "tool:web_fetch:code", "tooldata:x:y z", "notes/2026-11-22", "ünïcode"]:
        assert check_key(key) == key


def test_privileged_write_records_the_previous_value(agent):
    kv, store, rec = agent
    store.put("prompt:orient", "old prompt")
    versions = []
    kv2 = AgentKV(store, rec, on_privileged_write=lambda k, old, new, src: versions.append((k, old, new, src)))
    kv2.put("prompt:orient", "new prompt")
    kv2.put("notes", "plain")
    writes = rec.of(events.KV_WRITE)
    assert writes[0]["key"] == "prompt:orient" and writes[0]["old_value"] == "old prompt"
    assert "old_value" not in writes[1]  # ordinary keys are not versioned
    assert versions == [("prompt:orient", "old prompt", "new prompt", "agent")]
    kv2.delete("prompt:orient")
    assert rec.of(events.KV_WRITE)[-1]["old_value"] == "new prompt"
    assert versions[-1] == ("prompt:orient", "new prompt", None, "agent")


def test_oversized_value_refused(agent):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused, match="limit"):
        kv.put("big", "x" * (600 * 1024))
    assert store.get("big") is None


# --- schedules: the agent's own, within the operator's limits, never the operator's ---------------------

NOW = datetime(2026, 5, 4, 10, 0, 0, tzinfo=timezone.utc)
LIMITS = Limits(min_interval=600, max_count=3)
OPERATORS = {"tool": "report", "every": "1m", "created_by": "operator", "next_run": "2026-05-04T10:01:00Z"}


@pytest.fixture
def scheduled(store):
    """An agent view with the operator's limits and a fixed clock, over a store holding one operator's schedule."""
    store.put("schedule:op", OPERATORS)
    rec = Recorder()
    return AgentKV(store, rec, limits=LIMITS, clock=lambda: NOW), store, rec


def stored_schedule(store, schedule_id):
    return json.loads(store.get(f"schedule:{schedule_id}"))


def test_the_agent_adds_a_schedule_and_the_runtime_fills_in_the_rest(scheduled):
    kv, store, rec = scheduled
    kv.put("schedule:prices", {"tool": "fetch", "input": {"pair": "ETH"}, "every": "30m",
                               "next_run": "2020-01-01T00:00:00Z", "last_run": "2026-05-04T09:00:00Z",
                               "last_outcome": "ok"})
    assert stored_schedule(store, "prices") == {
        "id": "prices", "tool": "fetch", "input": {"pair": "ETH"}, "every": "30m", "tz": "UTC", "notify": "none",
        "missed": "once", "catchup": 3600, "enabled": True, "created_by": "agent",
        "next_run": "2026-05-04T10:30:00Z"}  # the runtime's fields are the runtime's, whatever the agent says
    (write,) = rec.of(events.KV_WRITE)
    assert write["key"] == "schedule:prices" and write["op"] == "put"


def test_a_schedule_given_as_json_text_is_taken_too(scheduled):
    kv, store, _ = scheduled
    kv.put("schedule:daily", '{"tool": "fetch", "cron": "0 9 * * *", "tz": "Europe/London"}')
    assert stored_schedule(store, "daily")["next_run"] == "2026-05-05T08:00:00Z"  # 09:00 BST


def test_changing_a_schedule_keeps_its_runs_and_a_new_timing_moves_the_next(scheduled):
    kv, store, _ = scheduled
    store.put("schedule:mine", {"tool": "fetch", "every": "1h", "next_run": "2026-05-04T10:40:00Z",
                                "last_run": "2026-05-04T09:40:00Z", "last_outcome": "failed"})
    kv.put("schedule:mine", {"tool": "fetch", "every": "1h", "enabled": False})
    s = stored_schedule(store, "mine")
    assert (s["enabled"], s["next_run"], s["last_run"], s["last_outcome"]) == (
        False, "2026-05-04T10:40:00Z", "2026-05-04T09:40:00Z", "failed")
    kv.put("schedule:mine", {"tool": "fetch", "every": "2h"})
    assert stored_schedule(store, "mine")["next_run"] == "2026-05-04T12:00:00Z"


@pytest.mark.parametrize("op", [
    lambda kv: kv.put("schedule:op", {"tool": "report", "every": "1h", "enabled": False}),  # pausing it
    lambda kv: kv.put("schedule:op", {**OPERATORS, "tool": "other"}),
    lambda kv: kv.delete("schedule:op"),
    lambda kv: kv.rename("schedule:op", "notes:op"),
])
def test_the_operators_schedule_cannot_be_changed_paused_or_removed(scheduled, op):
    kv, store, rec = scheduled
    before = store.get("schedule:op")
    with pytest.raises(KVWriteRefused, match="is the operator's schedule: the agent may not change or remove it"):
        op(kv)
    assert store.get("schedule:op") == before and store.get("notes:op") is None
    (refused,) = rec.of(events.KV_WRITE_REFUSED)
    assert "operator's schedule" in refused["reason"]


@pytest.mark.parametrize("value, says", [
    ({"tool": "fetch", "every": "1h", "created_by": "operator"}, "created_by is 'agent' for a schedule the agent"),
    ({"tool": "fetch", "every": "5m"}, "would run as often as every 5m; the operator's minimum is 10m"),
    ({"tool": "fetch", "cron": "*/5 * * * *"}, "would run as often as every 5m"),
    ({"tool": "fetch", "cron": "0 25 * * *"}, "cron '0 25 * * *': hour '25' is out of range 0-23"),
    ({"tool": "fetch", "cron": "0 9 * * *", "tz": "Mars/Base"}, "tz 'Mars/Base' is not a known time zone"),
    ({"tool": "fetch"}, "give exactly one of every"),
    ({"tool": "fetch", "every": "1h", "colour": "red"}, "colour: not a field of a schedule"),
    ({"id": "other", "tool": "fetch", "every": "1h"}, "id 'other' is not the key's id 'new'"),
    ("{not json", "schedule:new: not valid JSON"),
    ("every hour", "schedule:new: not valid JSON"),
    ([1, 2], "a schedule is a JSON object, got list"),
])
def test_a_bad_schedule_is_refused_in_one_line_and_recorded(scheduled, value, says):
    kv, store, rec = scheduled
    with pytest.raises(KVWriteRefused) as exc:
        kv.put("schedule:new", value)
    assert says in str(exc.value) and "\n" not in str(exc.value)
    assert store.get("schedule:new") is None
    (refused,) = rec.of(events.KV_WRITE_REFUSED)
    assert refused["key"] == "schedule:new" and says in refused["reason"]


def test_a_key_that_cannot_name_a_schedule_is_refused(scheduled):
    kv, store, _ = scheduled
    with pytest.raises(KVWriteRefused, match="schedule id 'a:b' is not 1-64 letters"):
        kv.put("schedule:a:b", {"tool": "fetch", "every": "1h"})
    assert store.get("schedule:a:b") is None


def test_a_batch_past_the_most_schedules_is_rejected_whole(scheduled):
    kv, store, rec = scheduled
    batch = [{"op": "put", "key": f"schedule:s{i}", "value": {"tool": "fetch", "every": "1h"}} for i in range(4)]
    with pytest.raises(KVWriteRefused, match=r"schedule:s3: the agent has 3 schedules, the most the operator "
                                             r"allows \(BRAINSTEM_SCHEDULE_MAX 3\); remove one first"):
        kv.apply_operations([{"op": "put", "key": "notes:x", "value": "y"}, *batch])
    assert store.get("notes:x") is None and [k.name for k in store.list_all("schedule:")] == ["schedule:op"]
    (rejected,) = rec.of(events.KV_OPERATIONS_REJECTED)
    assert "BRAINSTEM_SCHEDULE_MAX" in rejected["reason"]
    # one removed earlier in the same batch makes room for one more
    kv.apply_operations(batch[:3])
    kv.apply_operations([{"op": "delete", "key": "schedule:s0"}, batch[3]])
    assert sorted(k.name for k in store.list_all("schedule:")) == ["schedule:op", "schedule:s1", "schedule:s2",
                                                                   "schedule:s3"]


def test_the_agent_removes_its_own_and_may_overwrite_a_broken_one_that_is_not_the_operators(scheduled):
    kv, store, _ = scheduled
    kv.put("schedule:mine", {"tool": "fetch", "every": "1h"})
    assert kv.delete("schedule:mine") and store.get("schedule:mine") is None
    assert kv.delete("schedule:never-was") is False
    store.put("schedule:junk", "{broken")
    kv.put("schedule:junk", {"tool": "fetch", "every": "1h"})
    assert stored_schedule(store, "junk")["created_by"] == "agent"
    store.put("schedule:ops-broken", {"tool": "report", "created_by": "operator"})  # no timing: still the operator's
    with pytest.raises(KVWriteRefused, match="operator's schedule"):
        kv.delete("schedule:ops-broken")


def test_a_copy_into_a_schedule_key_is_checked_like_a_put(scheduled):
    kv, store, _ = scheduled
    store.put("notes:plan", {"tool": "fetch", "every": "1h", "created_by": "operator"})
    with pytest.raises(KVWriteRefused, match="created_by is 'agent'"):
        kv.apply_operations([{"op": "copy", "key": "notes:plan", "value": "schedule:sneaky"}])
    with pytest.raises(KVWriteRefused, match="created_by is 'agent'"):
        kv.apply_operations([{"op": "copy", "key": "schedule:op", "value": "schedule:mine"}])
    kv.put("schedule:mine", {"tool": "fetch", "every": "1h"})
    with pytest.raises(KVWriteRefused, match="id 'mine' is not the key's id 'twin'"):  # its id is its key's
        kv.rename("schedule:mine", "schedule:twin")
    assert store.get("schedule:sneaky") is None and store.get("schedule:twin") is None
    assert stored_schedule(store, "mine")["id"] == "mine"


SCHEDULE_IDS = ["a", "b", "c", "d", "e", "op", "op-broken", "junk"]
good_timing = st.sampled_from([{"every": "10m"}, {"every": "1h"}, {"every": "1d"}, {"cron": "0 * * * *"},
                               {"cron": "*/10 * * * *"}, {"cron": "30 1,2 * * *", "tz": "America/New_York"},
                               {"cron": "@daily", "tz": "Europe/London"}])
bad_timing = st.sampled_from([{"every": "1s"}, {"every": "5m"}, {"every": "9m"}, {"cron": "* * * * *"},
                              {"cron": "*/5 * * * *"}, {"cron": "0 25 * * *"}, {"cron": "0 9 * * *", "tz": "Mars/X"},
                              {"every": "1h", "tz": "Europe/London"}, {"every": "soon"}, {}])
extra_fields = st.fixed_dictionaries({}, optional={
    "enabled": st.booleans(), "next_run": st.sampled_from(["2026-05-04T10:00:01Z", "soon"]),
    "last_outcome": st.just("ok"), "input": st.sampled_from([{}, {"pair": "ETH"}, [1]])})
good_value = st.builds(lambda t, extra: {"tool": "fetch", **t, **extra}, good_timing, extra_fields)
bad_value = st.one_of(
    st.builds(lambda t: {"tool": "fetch", **t}, bad_timing),
    st.builds(lambda v, who: {**v, "created_by": who}, good_value, st.sampled_from(["operator", "root"])),
    st.builds(lambda v, other: {**v, "id": other}, good_value, st.sampled_from(SCHEDULE_IDS)),
    st.sampled_from(["{not json", "[]", '{"tool": "fetch", "every": "1h", "created_by": "operator"}']))
schedule_value = st.sampled_from([good_value, good_value, good_value, bad_value]).flatmap(lambda v: v)  # weighted
ids = st.sampled_from(SCHEDULE_IDS)
schedule_put = st.builds(lambda i, v: {"op": "put", "key": f"schedule:{i}", "value": v}, ids, schedule_value)
schedule_op = st.sampled_from([  # weighted towards what can succeed, so the limits are reached
    schedule_put, schedule_put, schedule_put, schedule_put, schedule_put, schedule_put,
    st.builds(lambda i: {"op": "delete", "key": f"schedule:{i}"}, ids),
    st.builds(lambda op, a, b: {"op": op, "key": f"schedule:{a}", "value": f"schedule:{b}"},
              st.sampled_from(["rename", "copy"]), ids, ids),
    st.builds(lambda i, v: {"op": "put", "key": f"notes:{i}", "value": v}, ids, schedule_value),
    st.builds(lambda op, a, b: {"op": op, "key": f"notes:{a}", "value": f"schedule:{b}"},
              st.sampled_from(["rename", "copy"]), ids, ids)]).flatmap(lambda op: op)


@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
@given(batches=st.lists(st.lists(schedule_op, min_size=1, max_size=3), min_size=1, max_size=12))
def test_whatever_the_agent_writes_under_schedule_it_stays_within_the_operators_limits(sqlite_store, batches):
    """Any sequence of writes, deletes, renames and copies, one at a time or in batches: the operator's schedules
    are as the operator left them, no other schedule says it is the operator's, the agent has at most
    BRAINSTEM_SCHEDULE_MAX, none of its runs closer than BRAINSTEM_SCHEDULE_MIN_INTERVAL, each one valid and
    with its next run filled in."""
    from brainstem.core import recurrence
    from brainstem.state import schedules

    store = sqlite_store
    for info in store.list_all():
        store.delete(info.name)
    store.put("schedule:op", OPERATORS)
    store.put("schedule:op-broken", {"tool": "report", "created_by": "operator"})
    store.put("schedule:junk", "{broken")
    operators = {k: store.get(k) for k in ("schedule:op", "schedule:op-broken")}
    kv = AgentKV(store, Recorder(), limits=LIMITS, clock=lambda: NOW)
    for batch in batches:
        try:
            if len(batch) == 1 and batch[0]["op"] in ("put", "delete"):
                op = batch[0]
                kv.put(op["key"], op["value"]) if op["op"] == "put" else kv.delete(op["key"])
            else:
                kv.apply_operations(batch)
        except KVWriteRefused:
            pass
    assert {k: store.get(k) for k in operators} == operators
    inventory = schedules.load_all(store)
    agents = [s for s in inventory.schedules if s.created_by == "agent"]
    assert [s.id for s in inventory.schedules if s.created_by == "operator"] == ["op"]
    assert len(agents) <= LIMITS.max_count
    for s in agents:
        assert recurrence.min_interval(s.rule, NOW) >= LIMITS.min_interval, s
        assert s.next_run is not None and s.id == s.id.strip()
    assert {p.key for p in inventory.problems} <= {"schedule:op-broken", "schedule:junk"}


def test_a_schedule_made_again_never_first_runs_sooner_than_the_minimum_interval(scheduled):
    """Deleted and put back, or made under another id, in one batch: it has no last run to wait after, so it
    waits after the write (a cron at the next minute would otherwise run again a minute after its last run)."""
    kv, store, _ = scheduled
    store.put("schedule:hourly", {"id": "hourly", "tool": "fetch", "cron": "0 * * * *", "created_by": "agent",
                                  "next_run": "2026-05-04T11:00:00Z", "last_run": "2026-05-04T10:00:00Z"})
    kv.apply_operations([{"op": "delete", "key": "schedule:hourly"},
                         {"op": "put", "key": "schedule:hourly", "value": {"tool": "fetch", "cron": "1 * * * *"}}])
    assert stored_schedule(store, "hourly")["next_run"] >= "2026-05-04T10:10:00Z"  # NOW + 600 s at the soonest
    kv.apply_operations([{"op": "delete", "key": "schedule:hourly"},
                         {"op": "put", "key": "schedule:again", "value": {"tool": "fetch", "cron": "1 * * * *"}}])
    assert stored_schedule(store, "again")["next_run"] >= "2026-05-04T10:10:00Z"  # or under another id
    kv.put("schedule:fresh", {"tool": "fetch", "cron": "1 10 * * *"})  # 10:01 today is too soon: tomorrow
    assert stored_schedule(store, "fresh")["next_run"] == "2026-05-05T10:01:00Z"


def test_the_agents_write_of_a_schedule_waits_for_a_runs_claim_and_gives_up_without_writing(scheduled, monkeypatch):
    """A run deciding a schedule holds its claim; the agent's write waits for it (so neither undoes the other:
    a next run put back would run one due time twice, a deleted schedule would come back), and past the wait
    is refused, nothing written."""
    from brainstem.core.errors import KVWriteRefused
    from brainstem.state import schedules

    kv, store, rec = scheduled
    kv.put("schedule:mine", {"tool": "fetch", "every": "1h"})
    before = store.get("schedule:mine")
    monkeypatch.setattr(schedules, "CLAIM_WAIT", 0.2)
    assert store.acquire_lease("schedule_claim:mine", "otherhost:1:run", 60_000)
    for write in (lambda: kv.put("schedule:mine", {"tool": "fetch", "every": "2h"}),
                  lambda: kv.delete("schedule:mine"),
                  lambda: kv.apply_operations([{"op": "copy", "key": "schedule:mine", "value": "schedule:two"}])):
        with pytest.raises(KVWriteRefused, match="being claimed by a run"):
            write()
    assert store.get("schedule:mine") == before and store.get("schedule:two") is None
    assert rec.of(events.KV_OPERATIONS_REJECTED) and rec.of(events.KV_WRITE_REFUSED)
    store.release_lease("schedule_claim:mine", "otherhost:1:run")
    kv.put("schedule:mine", {"tool": "fetch", "every": "2h"})
    assert stored_schedule(store, "mine")["every"] == "2h"
    assert store.lease_owner("schedule_claim:mine") is None  # released after the write


def test_the_agent_holds_the_claim_while_it_checks_and_writes(scheduled):
    """What a run sees of the claim while the agent's batch is checked and written: held, by the agent."""
    kv, store, _ = scheduled
    seen = []
    put = store.put

    def watching_put(key, value, *a, **k):
        if key.startswith("schedule:"):
            seen.append(store.lease_owner(f"schedule_claim:{key.split(':', 1)[1]}"))
        return put(key, value, *a, **k)

    store.put = watching_put
    try:
        kv.apply_operations([{"op": "put", "key": "schedule:a", "value": {"tool": "fetch", "every": "1h"}}])
    finally:
        store.put = put
    assert len(seen) == 1 and seen[0] and ":agent-kv" in seen[0]
