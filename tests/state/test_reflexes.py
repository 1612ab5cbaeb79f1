"""Dry runs, tool modes and reflexes, end to end through the command line.

Each test seeds a real store (Redis and SQLite), scripts the LLM double, runs
``brainstem`` as a subprocess and reads karma and keys back:

* ``brainstem wake --dry-run``: a whole session with the real LLM, tools not run, nothing written but
  its karma, ``session:last_started`` and today's spend;
* a tool's meta ``mode``: ``manual`` never runs, ``supervised`` runs into the review inbox,
  ``automated`` runs; ``brainstem tool run`` (the operator) runs whatever the mode;
* ``config:reflexes``: rules that handle a wake with no LLM call, their cooldowns, their failures, and
  what happens to an invalid list however it is written.

The last part tests :mod:`brainstem.state.reflexes` directly.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.state import history as session_history
from brainstem.state import reflexes
from brainstem.store import karma
from tests.helpers import ok, one_line_error, run_cli
from tests.wake_helpers import (
    action,
    event_names,
    events_of,
    finished,
    history,
    is_orient,
    is_reflect,
    iso_in,
    last_session,
    llm_calls,
    plan,
    reflection,
    run_wake,
    think,
    user_text,
)

ALWAYS = {"fact": "hour", "gte": 0}  # every hour of the day: a condition that always holds


def set_mode(store, tool: str, mode: str) -> None:
    """The tool's stored meta, with ``mode`` changed and everything else as seeded."""
    meta = store.get_json(keys.tool_meta(tool))
    assert isinstance(meta, dict) and meta.get("mode") == "automated", meta
    store.put(keys.tool_meta(tool), {**meta, "mode": mode})


def set_reflexes(store, *rules: dict) -> None:
    store.put(keys.CONFIG_REFLEXES, json.dumps(list(rules)))


def rule(name: str, when: dict | None = None, cooldown: float = 0, **do) -> dict:
    return {"name": name, "when": when or ALWAYS, "do": do, "cooldown_seconds": cooldown}


def seconds_until(text: str) -> float:
    t = parse_iso(text)
    assert t is not None, text
    return (t - datetime.now(timezone.utc)).total_seconds()


def review_items(env: dict, *args: str) -> list[dict]:
    return [json.loads(line) for line in ok(run_cli("review", "--json", *args, env=env)).splitlines()]


def dry_id(stdout: str) -> str:
    found = re.findall(r"dry run (dry-[0-9a-f]{8}):", stdout)
    assert len(found) == 1, stdout
    return found[0]


def dump(store) -> dict:
    """Every key of the agent: a value's text, a log's length."""
    return {k.name: ("log", store.log_length(k.name)) if k.is_log else store.get_text(k.name)
            for k in store.list_all()}


def a_session(st, env, llm) -> str:
    """One normal session, so the schedule, the history and the last reflection exist."""
    llm.queue(plan(think("hello")), "hi", reflection("THE-REAL-SESSION"))
    sid, _ = finished(run_wake(env, "--force"), st, "clean")
    llm.reset()
    return sid


# --- dry run ------------------------------------------------------------------------------------

def test_a_dry_run_runs_a_whole_session_with_the_llm_and_changes_nothing_but_its_karma(st, env, llm):
    real = a_session(st, env, llm)
    watched = (keys.WAKE_CONFIG, keys.LAST_REFLECT, keys.SESSION_COUNTER, keys.SESSION_LAST_COMPLETED,
               keys.REFLEX_STATE)
    before = {k: st.get(k) for k in watched}
    history_before = session_history.read(st)
    assert before[keys.WAKE_CONFIG] and history_before and before[keys.LAST_REFLECT]
    everything = dump(st)
    spent_before = (st.get_json(keys.DAILY_COST) or {}).get("usd", 0)

    llm.default_cost = 0.0025
    llm.queue(plan(action("kv_write", {"key": "dry", "value": "would-be"}, id="w", store_result_as="w"),
                   think("ponder {{w}}", id="t")),
              "pondered",
              reflection("DRY-SUMMARY", kv_operations=[{"op": "put", "key": "notes:dry", "value": "x"}]))
    r = run_wake(env, "--dry-run")
    out = ok(r)
    sid = dry_id(out)
    assert sid != real

    # The LLM was really asked: orient, the think, reflection.
    reqs = llm.requests
    assert len(reqs) == 3 and is_orient(reqs[0]) and is_reflect(reqs[2])
    assert "ponder" in user_text(reqs[1])
    entries = karma.read(st, sid)
    assert [c["purpose"] for c in llm_calls(entries)] == ["orient", "think", "reflect"]

    # Its karma is in the store, marked as a dry run from start to end.
    assert entries[0]["event"] == "session_start" and entries[0]["dry_run"] is True
    end = entries[-1]
    assert end["event"] == "session_end" and end["dry_run"] is True and end["outcome"] == "clean"

    # The tool did not run: no tool_start, a tool_would_do with its input, and nothing written.
    assert events_of(entries, "tool_start") == []
    would = events_of(entries, "tool_would_do")
    assert len(would) == 1
    assert would[0]["tool"] == "kv_write" and would[0]["reason"] == "dry_run" and would[0]["step_id"] == "w"
    assert would[0]["input"] == {"key": "dry", "value": "would-be"}
    done = {e["step_id"]: e for e in events_of(entries, "step_complete")}
    assert done["w"]["result"]["not_run"] == "dry_run" and "t" in done
    assert st.get("tooldata:kv_write:dry") is None
    assert st.get("notes:dry") is None  # reflection's kv_operations went to the throwaway overlay

    # Nothing of the agent's state moved; the schedule, the history, the memory are as they were.
    assert {k: st.get(k) for k in watched} == before
    assert session_history.read(st) == history_before
    assert all(h["id"] != sid for h in history(st))
    assert json.loads(st.get(keys.LAST_REFLECT))["session_summary"] == "THE-REAL-SESSION"
    assert st.get(keys.SESSION_CURRENT) is None

    # Only its karma, session:last_started and today's spend (its money was real) reached the store.
    after = dump(st)
    changed = {k for k in set(everything) | set(after) if everything.get(k) != after.get(k)}
    assert changed == {keys.karma(sid), keys.SESSION_LAST_STARTED, keys.DAILY_COST, keys.SPEND_DAYS,
                       keys.UNLISTED_KARMA}, changed
    assert st.get(keys.SESSION_LAST_STARTED) == sid
    spent = sum(c["cost"] for c in llm_calls(entries))
    assert spent == pytest.approx(3 * 0.0025)
    assert st.get_json(keys.DAILY_COST)["usd"] == pytest.approx(spent_before + spent)

    # `brainstem karma` with no id shows the dry run; so does its printed id.
    shown = ok(run_cli("karma", env=env))
    assert shown.splitlines()[0] == f"session {sid}"
    assert "tool_would_do" in shown and "would-be" in shown and "reason=dry_run" in shown
    as_json = [json.loads(line) for line in ok(run_cli("karma", sid, "--json", env=env)).splitlines()]
    assert as_json == entries


def test_a_dry_run_needs_no_force_and_leaves_a_sleeping_agent_asleep(st, env, llm):
    stamp = iso_in(7200)
    st.put(keys.WAKE_CONFIG, {"next_wake_after": stamp})
    asleep = ok(run_wake(env, "--verbose"))
    assert "asleep until" in asleep and llm.requests == []

    llm.queue(plan(think("what now?")), "nothing", reflection())
    sid = dry_id(ok(run_wake(env, "--dry-run")))
    assert len(llm.requests) == 3 and is_orient(llm.requests[0])
    assert karma.read(st, sid)[-1]["outcome"] == "clean"
    assert st.get_json(keys.WAKE_CONFIG) == {"next_wake_after": stamp}
    assert history(st) == []

    # And the next tick still sleeps: the dry run did not wake the agent.
    n = len(llm.requests)
    assert "asleep until" in ok(run_wake(env, "--verbose"))
    assert len(llm.requests) == n


def test_a_dry_run_takes_no_lease_closes_no_crash_and_repairs_no_counter(st, env, llm):
    """It changes nothing another wake could trip over: a live wake's lock, a dead session's breadcrumb
    (the next real wake records that crash) and a malformed session counter stay as they are."""
    breadcrumb = {"id": "7-dead01", "started_at": iso_in(-600), "pid": 999999, "host": "elsewhere"}
    st.put(keys.SESSION_CURRENT, breadcrumb)
    st.put(keys.SESSION_COUNTER, "not-a-number")
    assert st.acquire_lease(keys.WAKE_LEASE, "otherhost:1:x", 60000)
    try:
        llm.queue(plan(think("hello")), "hi", reflection())
        sid = dry_id(ok(run_wake(env, "--dry-run")))
        entries = karma.read(st, sid)
        assert entries[-1]["outcome"] == "clean" and events_of(entries, "crash_detected") == []
        assert entries[0]["crashed_session"] is None
        assert st.lease_owner(keys.WAKE_LEASE) == "otherhost:1:x"
        assert st.get_json(keys.SESSION_CURRENT) == breadcrumb
        assert st.get(keys.SESSION_COUNTER) == "not-a-number"
        assert history(st) == []
    finally:
        st.release_lease(keys.WAKE_LEASE, "otherhost:1:x")
    llm.queue(plan(think("hello")), "hi", reflection())
    real, entries = finished(run_wake(env, "--force"), st, "clean")
    assert events_of(entries, "crash_detected")[0]["dead_session"] == "7-dead01"


def test_a_dry_run_handled_by_a_reflex_runs_no_tool_and_cools_nothing(st, env, llm):
    set_reflexes(st, rule("note", tools=[{"tool": "kv_write", "input": {"key": "r", "value": "v"}}],
                          sleep_seconds=3600, cooldown=86400))
    wake_before = st.get(keys.WAKE_CONFIG)
    sid = dry_id(ok(run_wake(env, "--dry-run")))
    entries = karma.read(st, sid)
    assert entries[-1]["outcome"] == "handled_by_reflex" and entries[-1]["dry_run"] is True
    assert [e["reflex"] for e in events_of(entries, "reflex_fired")] == ["note"]
    assert events_of(entries, "tool_start") == []
    assert events_of(entries, "tool_would_do")[0]["input"] == {"key": "r", "value": "v"}
    assert st.get("tooldata:kv_write:r") is None
    assert st.get(keys.REFLEX_STATE) is None  # a dry run does not start the real rule's cooldown
    assert st.get(keys.WAKE_CONFIG) == wake_before
    assert llm.requests == []


# --- tool modes -----------------------------------------------------------------------------------

def test_a_manual_tool_never_runs_in_a_session_and_its_step_says_so(st, env, llm):
    set_mode(st, "kv_write", "manual")
    llm.queue(plan(action("kv_write", {"key": "m", "value": "v"}, id="w"), think("after", id="t")),
              "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert events_of(entries, "tool_start") == []
    would = events_of(entries, "tool_would_do")
    assert len(would) == 1 and would[0]["reason"] == "manual" and would[0]["tool"] == "kv_write"
    assert would[0]["input"] == {"key": "m", "value": "v"}
    assert st.get("tooldata:kv_write:m") is None
    done = {e["step_id"]: e for e in events_of(entries, "step_complete")}
    assert done["w"]["result"] == {"not_run": "manual", "tool": "kv_write", "input": {"key": "m", "value": "v"}}
    assert "t" in done and events_of(entries, "step_failed") == []
    assert events_of(entries, "review_queued") == [] and review_items(env) == []

    # The operator's own `brainstem tool run` runs it all the same.
    for floor in ("", "*=manual"):  # whatever the operator's own floor says, too
        out = ok(run_cli("tool", "run", "kv_write", "--input", json.dumps({"key": "op", "value": f"by hand{floor}"}),
                         env={**env, "BRAINSTEM_TOOL_MODES": floor}))
        assert json.loads(out)["stored_as"] == "tooldata:kv_write:op"
        assert st.get("tooldata:kv_write:op") == f"by hand{floor}"


def test_a_supervised_tool_runs_and_each_run_waits_for_the_operators_verdict(st, env, llm):
    set_mode(st, "kv_write", "supervised")
    llm.queue(plan(action("kv_write", {"key": "a", "value": "1"}, id="first"),
                   action("kv_write", {"key": "b", "value": "2"}, id="second")),
              reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [e["tool"] for e in events_of(entries, "tool_start")] == ["kv_write", "kv_write"]
    assert (st.get("tooldata:kv_write:a"), st.get("tooldata:kv_write:b")) == ("1", "2")
    assert events_of(entries, "tool_would_do") == []
    queued = events_of(entries, "review_queued")
    assert [(q["tool"], q["step_id"]) for q in queued] == [("kv_write", "first"), ("kv_write", "second")]
    # each is recorded after its run completed
    names = event_names(entries)
    assert names.index("review_queued") > names.index("tool_complete")

    pending = review_items(env)
    assert [p["id"] for p in pending] == [q["review_id"] for q in queued]
    assert {p["tool"] for p in pending} == {"kv_write"} and {p["session_id"] for p in pending} == {sid}
    assert {p["status"] for p in pending} == {"pending"}
    assert pending[0]["input"] == {"key": "a", "value": "1"} and pending[0]["ok"] is True
    assert pending[0]["result"]["stored_as"] == "tooldata:kv_write:a"

    first, second = pending[0]["id"], pending[1]["id"]
    assert "confirmed" in ok(run_cli("review", first, "--confirm", env=env))
    assert [p["id"] for p in review_items(env)] == [second]
    assert "corrected" in ok(run_cli("review", second, "--correct", "write under notes: instead", env=env))
    assert review_items(env) == []
    settled = {p["id"]: p for p in review_items(env, "--all")}
    assert settled[first]["status"] == "confirmed"
    assert settled[second]["status"] == "corrected" and settled[second]["correction"] == "write under notes: instead"


def test_past_its_cap_a_session_runs_no_more_supervised_tools_and_drops_them_from_review(st, env, llm):
    set_mode(st, "kv_write", "supervised")
    llm.queue(plan(*(action("kv_write", {"key": f"k{i}", "value": str(i)}, id=f"w{i}",
                            failure={"retries": 0}) for i in range(4))),
              reflection())
    sid, entries = finished(run_wake({**env, "BRAINSTEM_REVIEW_MAX_PER_SESSION": "2"}, "--force"), st)
    assert [q["step_id"] for q in events_of(entries, "review_queued")] == ["w0", "w1"]
    dropped = events_of(entries, "review_dropped")
    assert [d["step_id"] for d in dropped] == ["w2", "w3"]
    assert "BRAINSTEM_REVIEW_MAX_PER_SESSION" in dropped[0]["reason"]
    assert [e["step_id"] for e in events_of(entries, "tool_start")] == ["w0", "w1"]  # the rest never ran
    assert st.get("tooldata:kv_write:k2") is None and st.get("tooldata:kv_write:k3") is None
    assert [(p["step_id"], p["session_id"]) for p in review_items(env, "--all")] == [("w0", sid), ("w1", sid)]


def test_a_failed_run_of_a_supervised_tool_is_queued_with_its_error(st, env, llm):
    set_mode(st, "kv_write", "supervised")
    llm.queue(plan(action("kv_write", {"value": "no key"}, id="w", failure={"retries": 0})), reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [e["step_id"] for e in events_of(entries, "step_failed")] == ["w"]
    (item,) = review_items(env)
    assert item["ok"] is False and "needs 'key'" in item["error"] and item["session_id"] == sid


def test_an_automated_tool_runs_and_nothing_is_queued(st, env, llm):
    assert st.get_json(keys.tool_meta("kv_write"))["mode"] == "automated"
    llm.queue(plan(action("kv_write", {"key": "auto", "value": "yes"}, id="w")), reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [e["tool"] for e in events_of(entries, "tool_start")] == ["kv_write"]
    assert st.get("tooldata:kv_write:auto") == "yes"
    assert events_of(entries, "review_queued") == [] and events_of(entries, "tool_would_do") == []
    assert review_items(env) == []


@pytest.mark.parametrize("floor, expect", [("kv_write=manual", "manual"), ("*=manual", "manual"),
                                           ("*=supervised", "supervised"),
                                           ("*=manual,kv_write=automated", "automated")])
def test_the_operators_mode_floor_wins_over_a_laxer_meta(st, env, llm, floor, expect):
    """BRAINSTEM_TOOL_MODES: the least supervision a tool gets, whatever its meta (automated) says; a
    tool's own entry overrides ``*``."""
    llm.queue(plan(action("kv_write", {"key": "f", "value": "v"}, id="w")), reflection())
    sid, entries = finished(run_wake({**env, "BRAINSTEM_TOOL_MODES": floor}, "--force"), st, "clean")
    ran = st.get("tooldata:kv_write:f") == "v"
    assert ran == (expect != "manual")
    would = events_of(entries, "tool_would_do")
    assert len(would) == (expect == "manual")
    if would:  # karma says why a tool whose meta says automated did not run
        assert would[0]["reason"] == "manual" and would[0]["mode_floor"] == "manual"
    assert len(events_of(entries, "review_queued")) == (expect == "supervised")


def test_a_mode_floor_does_not_loosen_a_stricter_meta(st, env, llm):
    set_mode(st, "kv_write", "manual")
    llm.queue(plan(action("kv_write", {"key": "f", "value": "v"}, id="w")), reflection())
    sid, entries = finished(run_wake({**env, "BRAINSTEM_TOOL_MODES": "kv_write=supervised"}, "--force"),
                            st, "clean")
    assert st.get("tooldata:kv_write:f") is None
    would = events_of(entries, "tool_would_do")
    assert len(would) == 1 and would[0]["reason"] == "manual" and would[0]["mode_floor"] is None
    assert events_of(entries, "review_queued") == []


# --- reflexes -------------------------------------------------------------------------------------

def test_a_sleeping_reflex_handles_the_wake_with_no_llm_call(st, env, llm):
    ok(run_cli("kv", "put", keys.CONFIG_REFLEXES, json.dumps([
        {"name": "quiet", "when": {"fact": "hour", "gte": 0}, "do": {"sleep_seconds": 3600},
         "cooldown_seconds": 0}]), env=env))
    r = run_wake(env, "--force")
    out = ok(r)
    assert llm.requests == []  # not one chat completion
    sid, entries = last_session(st)
    assert sid in out and "handled_by_reflex" in out
    end = entries[-1]
    assert end["event"] == "session_end" and end["outcome"] == "handled_by_reflex" and end["kind"] == "reflex"
    assert end["cost"] == 0 and llm_calls(entries) == []
    fired = events_of(entries, "reflex_fired")
    assert [f["reflex"] for f in fired] == ["quiet"] and fired[0]["do"] == {"tools": [], "sleep_seconds": 3600}
    assert "context" not in event_names(entries) and "reflect" not in event_names(entries)
    assert all(h["id"] != sid for h in history(st))
    wc = st.get_json(keys.WAKE_CONFIG)
    assert 3500 < seconds_until(wc["next_wake_after"]) <= 3600
    assert st.get(keys.SESSION_CURRENT) is None
    assert set(st.get_json(keys.REFLEX_STATE)) == {"quiet"}

    # Handled means asleep: the next tick does not wake it.
    assert "asleep until" in ok(run_wake(env, "--verbose"))
    assert llm.requests == []


def test_a_reflex_runs_its_tools_in_order(st, env, llm):
    set_reflexes(st, rule("note", tools=[{"tool": "kv_write", "input": {"key": "reflexed", "value": "one"}},
                                         {"tool": "kv_write", "input": {"key": "reflexed2", "value": "two"}}],
                          sleep_seconds=600))
    ok(run_wake(env, "--force"))
    assert llm.requests == []
    sid, entries = last_session(st)
    assert entries[-1]["outcome"] == "handled_by_reflex"
    assert [e["step_id"] for e in events_of(entries, "tool_start")] == ["reflex:note:1", "reflex:note:2"]
    assert (st.get("tooldata:kv_write:reflexed"), st.get("tooldata:kv_write:reflexed2")) == ("one", "two")
    assert entries[-1]["steps"] == 2
    assert 500 < seconds_until(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 600


def test_reflexes_fire_in_order_and_the_first_that_sleeps_ends_the_list(st, env, llm):
    set_reflexes(st, rule("never", when={"fact": "weekday", "eq": 9}, sleep_seconds=60),
                 rule("push", effort="high"),
                 rule("sleeper", sleep_seconds=900),
                 rule("later", tools=[{"tool": "kv_write", "input": {"key": "later", "value": "x"}}],
                      sleep_seconds=60))
    ok(run_wake(env, "--force"))
    sid, entries = last_session(st)
    assert [f["reflex"] for f in events_of(entries, "reflex_fired")] == ["push", "sleeper"]
    assert entries[-1]["outcome"] == "handled_by_reflex" and llm.requests == []
    assert st.get("tooldata:kv_write:later") is None
    assert set(st.get_json(keys.REFLEX_STATE)) == {"push", "sleeper"}
    assert 800 < seconds_until(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 900


def test_a_reflex_within_its_cooldown_is_held_back_and_the_wake_goes_on_to_orient(st, env, llm):
    set_reflexes(st, rule("daily", sleep_seconds=3600, cooldown=86400))
    ok(run_wake(env, "--force"))
    first, entries = last_session(st)
    assert entries[-1]["outcome"] == "handled_by_reflex" and llm.requests == []
    fired_at = st.get_json(keys.REFLEX_STATE)["daily"]

    llm.queue(plan(think("hello"), next_wake={"sleep_seconds": 7200}), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert sid != first
    held = events_of(entries, "reflex_suppressed")
    assert len(held) == 1 and held[0]["reflex"] == "daily" and held[0]["last_fired"] == fired_at
    assert held[0]["cooldown_seconds"] == 86400
    assert events_of(entries, "reflex_fired") == []
    assert is_orient(llm.requests[0]) and len(llm.requests) == 3
    assert 7000 < seconds_until(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 7200
    assert st.get_json(keys.REFLEX_STATE)["daily"] == fired_at  # held back: its cooldown is not restarted


@pytest.mark.parametrize("call, error", [({"tool": "no_such_tool"}, "no tool named 'no_such_tool'"),
                                         ({"tool": "kv_write", "input": {"value": "no key"}}, "needs 'key'")])
def test_a_reflex_whose_tool_is_missing_or_fails_falls_through_to_a_normal_session(st, env, llm, call, error):
    set_reflexes(st, rule("broken", tools=[call, {"tool": "kv_write", "input": {"key": "after", "value": "x"}}],
                          sleep_seconds=3600))
    llm.queue(plan(think("hello"), next_wake={"sleep_seconds": 7200}), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [f["reflex"] for f in events_of(entries, "reflex_fired")] == ["broken"]
    failed = events_of(entries, "reflex_failed")
    assert len(failed) == 1 and failed[0]["tool"] == call["tool"] and error in failed[0]["error"]
    assert st.get("tooldata:kv_write:after") is None  # the calls after the failing one did not run
    assert is_orient(llm.requests[0]) and len(llm.requests) == 3
    assert 7000 < seconds_until(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 7200


def test_a_reflex_can_set_the_sessions_effort(st, env, llm):
    set_reflexes(st, rule("push", effort="high"))
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [f["reflex"] for f in events_of(entries, "reflex_fired")] == ["push"]
    assert "Effort for this session: **high**" in user_text(llm.requests[0])
    assert events_of(entries, "context")[0]["context"]["effort"] == "high"


def test_without_the_reflex_the_effort_is_low(st, env, llm):
    """The control of the test above: the seeded agent orients at low effort."""
    llm.queue(plan(think("hello")), "hi", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert "Effort for this session: **low**" in user_text(llm.requests[0])


@pytest.mark.parametrize("credit, fires", [(0.5, True), (5.0, False), (None, False)])
def test_a_reflex_over_the_llm_credit(st, env, llm, credit, fires):
    set_reflexes(st, rule("broke", when={"fact": "balances.openrouter", "lt": 1}, sleep_seconds=21600))
    if credit is None:  # the credit cannot be read: unknown satisfies no comparison
        llm.key_status = llm.credits_status = 500
    else:
        llm.credit = credit
    if not fires:
        llm.queue(plan(think("hello")), "hi", reflection())
    ok(run_wake(env, "--force"))
    sid, entries = last_session(st)
    assert events_of(entries, "ground_truth")[0]["balances"]["openrouter"] == credit
    assert len(events_of(entries, "reflex_fired")) == fires
    if fires:
        assert llm.requests == [] and entries[-1]["outcome"] == "handled_by_reflex"
        assert 21000 < seconds_until(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 21600
    else:
        assert entries[-1]["outcome"] == "clean" and is_orient(llm.requests[0])
        assert [h["id"] for h in history(st)] == [sid]


def test_an_unknown_credit_is_caught_by_exists_false(st, env, llm):
    set_reflexes(st, rule("blind", when={"fact": "balances.openrouter", "exists": False}, sleep_seconds=600))
    llm.key_status = llm.credits_status = 500
    ok(run_wake(env, "--force"))
    sid, entries = last_session(st)
    assert [f["reflex"] for f in events_of(entries, "reflex_fired")] == ["blind"]
    assert llm.requests == [] and entries[-1]["outcome"] == "handled_by_reflex"


# --- bad reflexes -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [
    ("not json", "not valid JSON"),
    ('{"name": "x"}', "must be a JSON list"),
    ('[{"name": "x", "when": {"fact": "moon", "eq": 1}, "do": {"sleep_seconds": 3600}, "cooldown_seconds": 0}]',
     "config:reflexes[0] (x)"),
    ('[{"name": "x", "when": {"fact": "hour", "gte": 0}, "do": {}, "cooldown_seconds": 0}]', "do nothing"),
])
def test_kv_put_refuses_an_invalid_reflex_list(st, env, llm, value, needle):
    line = one_line_error(run_cli("kv", "put", keys.CONFIG_REFLEXES, value, env=env))
    assert needle in line, line
    assert st.get(keys.CONFIG_REFLEXES) is None
    # and a valid list goes in
    good = json.dumps([rule("fine", sleep_seconds=600)])
    ok(run_cli("kv", "put", keys.CONFIG_REFLEXES, good, env=env))
    assert json.loads(st.get(keys.CONFIG_REFLEXES))[0]["name"] == "fine"


BAD_RULES = [{"name": "bad", "when": {"fact": "moon", "eq": 1}, "do": {"sleep_seconds": 3600}, "cooldown_seconds": 0}]
GOOD_RULES = [rule("good", when={"fact": "weekday", "eq": 9}, sleep_seconds=3600)]  # never holds


@pytest.mark.parametrize("valid", [False, True])
def test_reflection_writing_reflexes_is_validated_with_its_whole_batch(st, env, llm, valid):
    ops = [{"op": "put", "key": "notes:beside", "value": "written"},
           {"op": "put", "key": keys.CONFIG_REFLEXES, "value": GOOD_RULES if valid else BAD_RULES}]
    llm.queue(plan(think("hello")), "hi", reflection(kv_operations=ops))
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    rejected = events_of(entries, "kv_operations_rejected")
    if valid:
        assert rejected == []
        assert st.get("notes:beside") == "written"
        assert json.loads(st.get(keys.CONFIG_REFLEXES)) == GOOD_RULES
    else:
        assert len(rejected) == 1 and rejected[0]["source"] == "reflect"
        assert "config:reflexes[0] (bad)" in rejected[0]["reason"] and "moon" in rejected[0]["reason"]
        assert st.get("notes:beside") is None and st.get(keys.CONFIG_REFLEXES) is None


def test_a_direct_put_of_bad_reflexes_through_the_agents_view_raises(st):
    from brainstem.core.errors import KVWriteRefused
    from brainstem.state.guarded import AgentKV

    seen = []
    view = AgentKV(st, lambda event, **f: seen.append((event, f)))
    with pytest.raises(KVWriteRefused, match=r"config:reflexes\[0\] \(bad\)"):
        view.put(keys.CONFIG_REFLEXES, json.dumps(BAD_RULES))
    assert st.get(keys.CONFIG_REFLEXES) is None and seen[0][0] == "kv_write_refused"
    view.put(keys.CONFIG_REFLEXES, json.dumps(GOOD_RULES))
    assert json.loads(st.get(keys.CONFIG_REFLEXES)) == GOOD_RULES


@pytest.mark.parametrize("raw", ["not json", json.dumps(BAD_RULES),
                                 json.dumps([rule("quiet", sleep_seconds=3600), BAD_RULES[0]])])
def test_reflexes_written_around_brainstem_are_ignored_whole_and_recorded(st, env, llm, raw):
    st.put(keys.CONFIG_REFLEXES, raw)  # straight into the store, past every check
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    rejected = [e for e in events_of(entries, "config_rejected") if e.get("key") == keys.CONFIG_REFLEXES]
    assert len(rejected) == 1 and rejected[0]["reason"]
    assert events_of(entries, "reflex_fired") == []  # not even the valid rule beside the bad one
    assert is_orient(llm.requests[0])
    assert st.get(keys.REFLEX_STATE) is None
    assert st.get(keys.CONFIG_REFLEXES) == raw  # recorded, not repaired behind the operator's back


def test_reflexes_that_are_not_even_text_are_ignored_and_recorded(st, env, llm, real_store_url):
    from tests.store.test_store import BAD, write_raw

    write_raw(real_store_url, keys.CONFIG_REFLEXES, BAD)
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    rejected = [e for e in events_of(entries, "config_rejected") if e.get("key") == keys.CONFIG_REFLEXES]
    assert len(rejected) == 1 and "not text" in rejected[0]["reason"]
    assert events_of(entries, "fatal_error") == [] and is_orient(llm.requests[0])


# --- brainstem.state.reflexes, directly ----------------------------------------------------------------

def parse_error(raw) -> str:
    with pytest.raises(reflexes.ReflexError) as exc:
        reflexes.parse(raw)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_parse_accepts_a_valid_list_and_keeps_its_order():
    night = {"all": [{"fact": "hour", "lt": 6}, {"not": {"fact": "effort", "eq": "max"}}]}
    rules = reflexes.parse([rule("a", sleep_seconds=60), rule("b", effort="max", cooldown=10),
                            rule("c", when=night, tools=[{"tool": "kv_write", "input": {"key": "k"}}])])
    assert [r.name for r in rules] == ["a", "b", "c"]
    assert rules[1].do.effort == "max" and rules[1].cooldown_seconds == 10
    assert rules[2].do.tools[0].tool == "kv_write" and rules[2].do.sleep_seconds is None
    assert reflexes.parse([]) == []
    assert [r.name for r in reflexes.parse_text(json.dumps([rule("a", sleep_seconds=60)]))] == ["a"]


@pytest.mark.parametrize("raw, needles", [
    ("x", ["must be a JSON list", "str"]),
    ({"name": "a"}, ["must be a JSON list", "dict"]),
    ([rule(f"r{i}", sleep_seconds=60) for i in range(51)], ["51 rules", "limit is 50"]),
    (["text"], ["config:reflexes[0]"]),
    ([rule("a", sleep_seconds=60), {"name": "b", "when": ALWAYS, "do": {"sleep_seconds": 60}}],
     ["config:reflexes[1] (b)", "cooldown_seconds"]),
    ([rule("a", sleep_seconds=60), rule("a", effort="high")], ["config:reflexes[1] (a)", "used twice"]),
    ([rule("a", when={"fact": "moon", "lt": 1}, sleep_seconds=60)],
     ["config:reflexes[0] (a): when: unknown fact 'moon'"]),
    ([rule("a", when={"fact": "hour", "lt": 1, "gt": 0}, sleep_seconds=60)], ["(a)", "exactly one of"]),
    ([rule("a", when={"fact": "hour", "between": 1}, sleep_seconds=60)], ["(a)", "exactly one of"]),
    ([rule("a", when={"fact": "hour", "lt": "1"}, sleep_seconds=60)], ["(a)", "compares numbers"]),
    ([rule("a", when={"fact": "hour", "lt": True}, sleep_seconds=60)], ["(a)", "compares numbers"]),
    ([rule("a", when={"fact": "hour", "exists": 1}, sleep_seconds=60)], ["(a)", "exists takes true or false"]),
    ([rule("a", when={"all": []}, sleep_seconds=60)], ["(a)", "non-empty list"]),
    ([rule("a", when={"any": [ALWAYS, {"fact": "x", "eq": 1}]}, sleep_seconds=60)],
     ["(a): when.any[1]: unknown fact 'x'"]),
    ([rule("a", when={"maybe": ALWAYS}, sleep_seconds=60)], ["(a)", "unknown condition 'maybe'"]),
    ([rule("a", when={"fact": "hour", "lt": 1, "not": ALWAYS}, sleep_seconds=60)], ["(a)"]),
    ([rule("a")], ["(a)", "do nothing"]),
    ([rule("a", sleep_seconds=5)], ["(a)", "sleep_seconds"]),
    ([rule("a", sleep_seconds=60, cooldown=-1)], ["(a)", "cooldown_seconds"]),
    ([rule("a", effort="extreme")], ["(a)", "effort"]),
    ([rule("a b", sleep_seconds=60)], ["config:reflexes[0] (a b)", "name"]),
    ([rule("a", tools=[{"tool": "x:y"}])], ["(a)", "tool"]),
    ([rule("a", tools=[{"tool": "kv_write", "args": {}}])], ["(a)", "args"]),
    ([rule("a", tools=[{"tool": "kv_write"}] * 6)], ["(a)", "tools"]),
    ([{**rule("a", sleep_seconds=60), "extra": 1}], ["(a)", "extra"]),
])
def test_parse_names_the_rule_and_the_reason_on_one_line(raw, needles):
    message = parse_error(raw)
    for needle in needles:
        assert needle in message, message
    assert ": when: when" not in message  # the place is named once


def test_conditions_nest_at_most_ten_deep():
    deep = ALWAYS
    for _ in range(12):
        deep = {"not": deep}
    assert "10 deep" in parse_error([rule("a", when=deep, sleep_seconds=60)])


def test_parse_text_says_when_it_is_not_json():
    with pytest.raises(reflexes.ReflexError, match="not valid JSON"):
        reflexes.parse_text("[{")


FACTS = {"balances": {"openrouter": 0.5, "wallet_usdc": None}, "kvUsage": {"bytes": 2048}, "effort": "low",
         "last_outcome": "clean", "failing_streak": 0, "hour": 3, "weekday": 6}


@pytest.mark.parametrize("condition, expected", [
    ({"fact": "balances.openrouter", "lt": 1}, True),
    ({"fact": "balances.openrouter", "lt": 0.5}, False),
    ({"fact": "balances.openrouter", "lte": 0.5}, True),
    ({"fact": "balances.openrouter", "gt": 0.5}, False),
    ({"fact": "balances.openrouter", "gte": 0.5}, True),
    ({"fact": "hour", "eq": 3}, True),
    ({"fact": "hour", "eq": 4}, False),
    ({"fact": "hour", "ne": 4}, True),
    ({"fact": "effort", "eq": "low"}, True),
    ({"fact": "last_outcome", "ne": "clean"}, False),
    ({"fact": "kvUsage.bytes", "gt": 1024}, True),
    ({"fact": "balances.openrouter", "exists": True}, True),
    ({"fact": "balances.openrouter", "exists": False}, False),
    # unknown: a balance that could not be read (None) or a path that is not there
    ({"fact": "balances.wallet_usdc", "lt": 1}, False),
    ({"fact": "balances.wallet_usdc", "gte": 1}, False),
    ({"fact": "balances.wallet_usdc", "eq": None}, False),
    ({"fact": "balances.wallet_usdc", "ne": 5}, False),
    ({"fact": "balances.wallet_usdc", "exists": False}, True),
    ({"fact": "balances.wallet_usdc", "exists": True}, False),
    ({"fact": "balances.other", "exists": False}, True),
    ({"fact": "kvUsage.bytes.more", "gt": 0}, False),
    ({"fact": "effort", "lt": 3}, False),  # text compared as a number: satisfies nothing
    ({"all": [{"fact": "hour", "lt": 6}, {"fact": "weekday", "eq": 6}]}, True),
    ({"all": [{"fact": "hour", "lt": 6}, {"fact": "weekday", "eq": 5}]}, False),
    ({"any": [{"fact": "hour", "gt": 6}, {"fact": "weekday", "eq": 6}]}, True),
    ({"any": [{"fact": "hour", "gt": 6}, {"fact": "weekday", "eq": 5}]}, False),
    ({"not": {"fact": "hour", "gt": 6}}, True),
    ({"not": {"fact": "balances.wallet_usdc", "lt": 1}}, True),
    ({"not": {"not": {"fact": "hour", "eq": 3}}}, True),
])
def test_holds(condition, expected):
    reflexes.parse([rule("check", when=condition, sleep_seconds=60)])  # a valid condition, first
    assert reflexes.holds(condition, FACTS) is expected


def test_facts_from_ground_truth_and_history():
    now = datetime(2026, 3, 1, 23, 30, tzinfo=timezone.utc)  # a Sunday
    history_ = [{"outcome": "clean"}, {"outcome": "error"}, {"outcome": "crashed"}]
    fs = reflexes.facts({"openrouter": 2.0}, {"bytes": 10}, "medium", history_, now)
    assert fs["balances"] == {"openrouter": 2.0} and fs["kvUsage"] == {"bytes": 10} and fs["effort"] == "medium"
    assert fs["last_outcome"] == "crashed" and fs["failing_streak"] == 2
    assert (fs["hour"], fs["weekday"]) == (23, 6)
    empty = reflexes.facts(None, None, "low", [], now)
    assert empty["balances"] == {} and empty["last_outcome"] is None and empty["failing_streak"] == 0
    assert reflexes.holds({"fact": "balances.openrouter", "exists": False}, empty)


def test_cooling():
    now = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    daily = reflexes.parse([rule("daily", sleep_seconds=60, cooldown=86400)])[0]
    hourly = reflexes.parse([rule("hourly", sleep_seconds=60, cooldown=3600)])[0]
    never = reflexes.parse([rule("never", sleep_seconds=60, cooldown=0)])[0]
    two_hours_ago = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fired = {"daily": two_hours_ago, "hourly": two_hours_ago, "never": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert reflexes.cooling(daily, fired, now) == two_hours_ago
    assert reflexes.cooling(hourly, fired, now) is None
    assert reflexes.cooling(never, fired, now) is None
    assert reflexes.cooling(daily, {}, now) is None  # never fired
    assert reflexes.cooling(daily, {"daily": "yesterday-ish"}, now) is None  # an unreadable time: not held
    assert reflexes.cooling(daily, {"daily": 12}, now) is None
    assert reflexes.cooling(daily, "not a dict", now) is None
    assert reflexes.cooling(daily, {"daily": (now - timedelta(hours=25)).isoformat()}, now) is None


def test_a_sleeping_reflex_never_skips_a_due_deep_reflection(st, llm, env):
    """A rule that sleeps on every wake must not keep the agent from reconsidering its rules."""
    st.put(keys.CONFIG_REFLEXES, json.dumps([{"name": "always", "when": {"fact": "hour", "gte": 0},
                                               "do": {"sleep_seconds": 3600}, "cooldown_seconds": 0}]))
    st.put(keys.SESSION_COUNTER, "19")  # the next wake is the seed's first deep reflection
    llm.responder = lambda req: json.dumps({"reflection": "r", "note_to_future_self": "n"})
    r = run_wake(env, "--force")
    sid, entries = finished(r, st)
    held = [e for e in entries if e["event"] == "reflex_suppressed"]
    assert held and held[0]["reason"] == "deep_reflection_due"
    assert entries[-1]["kind"] == "deep_reflect" and len(llm.requests) == 1
