"""``brainstem replay --since`` over every kind of session the runtime makes: real sessions against the
loopback LLM double on a real store, then replayed through the CLI. On an unchanged agent each says
``same behaviour``; after one prompt edit the ones that asked with that prompt differ, with the diff."""

from __future__ import annotations

import json
import socket

import pytest

from brainstem.core import keys
from brainstem.state import history as session_history
from brainstem.state.budget import daily_spent
from tests.helpers import dead_pid, ok, run_cli
from tests.session.conftest import put_schedule
from tests.wake_helpers import (
    action,
    answers,
    finished,
    is_deep,
    iso_in,
    plan,
    reflection,
    run_wake,
    think,
    wake_env,
)

DEEP = {"reflection": "looked back", "note_to_future_self": "keep it small", "updated_wisdom": "small steps",
        # a change the gate refuses (every recorded plan cut short): its verdict is part of the recording
        "updated_defaults": {"orient": {"max_output_tokens": 16}}}


def _respond(req: dict):
    if is_deep(req):
        return json.dumps(DEEP)
    return answers("ok", reflect=reflection("did it", load_keys=["wisdom"]))(req)


def _every_kind(st, llm, env) -> dict[str, str]:
    """One session of each kind; their ids by kind."""
    llm.responder = _respond
    made = {}
    llm.queue(plan(think("Say hi", id="hi", store_result_as="hi")))
    made["plain"], _ = finished(run_wake(env, "--force"), st, "clean")

    ok(run_cli("tell", "What is two and two?", env=env))
    llm.queue(plan(think("Answer my operator: what is two and two?", id="answer")))
    made["message"], entries = finished(run_wake(env, "--force"), st, "clean")
    assert any(e["event"] == "inbox_read" for e in entries)  # read then, and read now: the replay must not care

    llm.queue(plan({"type": "agent", "id": "look", "prompt": "Read your wisdom.", "tools": ["kv_read"],
                    "store_result_as": "found"}),
              {"tool_calls": [{"name": "kv_read", "arguments": {"keys": ["wisdom"]}, "id": "c1"}]}, "it says nothing")
    made["agent"], _ = finished(run_wake(env, "--force"), st, "clean")

    # A schedule of the operator's runs first in this wake (its notice to the inbox), and the session's
    # reflection makes one of the agent's own.
    put_schedule(st, "look", tool="kv_read", input={"keys": ["wisdom"]}, notify="inbox")
    llm.queue(plan(action("kv_write", {"key": "k", "value": "v"}, id="w")),
              reflection("scheduled a daily read", kv_operations=[
                  {"op": "put", "key": "schedule:daily",
                   "value": {"tool": "kv_read", "input": {"keys": ["wisdom"]}, "every": "1d"}}]))
    made["schedule"], _ = finished(run_wake(env, "--force"), st, "clean")
    assert st.get("schedule:daily", "json")["created_by"] == "agent"
    assert st.get_json(keys.schedule("look"))["last_outcome"] == "ok"

    dead = f"{len(session_history.read(st)) + 1}-dead01"
    st.put(keys.SESSION_COUNTER, str(len(session_history.read(st)) + 1))
    st.append(keys.karma(dead), json.dumps({"event": "session_start", "session_id": dead}))
    st.put(keys.SESSION_CURRENT, {"id": dead, "started_at": iso_in(-600), "pid": dead_pid(),
                                  "host": socket.gethostname()})  # its process gone on this host: a crash
    made["dead"] = dead
    llm.queue(plan(think("What happened last time?", id="why")))
    made["crash"], entries = finished(run_wake(env, "--force"), st, "clean")
    assert any(e["event"] == "crash_detected" for e in entries)

    st.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 0, "after_sessions": 1, "after_days": 7})
    made["deep"], entries = finished(run_wake(env, "--force"), st)
    gate = next(e for e in entries if e["event"] == "replay_gate")
    assert gate["refused"]  # refused then: the replay is given that verdict, never judges again
    assert st.get(keys.WISDOM) == "small steps"
    made.update(_calls_that_did_not_happen(st, llm, env))
    return made


def _calls_that_did_not_happen(st, llm, env) -> dict[str, str]:
    """Sessions whose model calls failed or were refused: their failures are part of the recording."""
    made = {}
    for kind, status, outcome in (("orient_down", 503, "llm_unavailable"), ("no_credit", 402, "llm_no_credit")):
        llm.responder = lambda req, status=status: {"status": status, "message": "double: not now"}
        made[kind], entries = finished(run_wake(env, "--force"), st, outcome)
        assert any(e["event"] == "llm_failed" and e["fault"] == outcome for e in entries)
    llm.credit += 20  # credit added after the 402: the next wake's free balance read closes the breaker
    llm.responder = _respond

    # The last deep reflection two sessions back (never two in a row), one due each session.
    deep_due = {"last_session": len(session_history.read(st)) - 1, "after_sessions": 1, "after_days": 7}
    st.put(keys.DEEP_REFLECT_SCHEDULE, deep_due)
    ceiling = f"{daily_spent(st) + 0.0001:.6f}"  # today's spend so far leaves too little for the call
    made["deep_refused"], entries = finished(run_wake({**env, "BRAINSTEM_MAX_DAILY_COST": ceiling}, "--force"), st,
                                             "budget_exhausted")
    assert any(e["event"] == "budget_exceeded" and e["purpose"] == "deep_reflect" for e in entries)

    llm.responder = lambda req: "I thought about it at length, and here is no JSON." if is_deep(req) else \
        _respond(req)
    made["deep_unusable"], _ = finished(run_wake(env, "--force"), st, "no_reflection")
    llm.responder = _respond
    return made


@pytest.fixture
def env(real_store_url, llm):
    return wake_env(real_store_url, llm)


def test_every_kind_of_session_replays_the_same_then_a_prompt_edit_differs_with_its_diff(st, llm, env):
    made = _every_kind(st, llm, env)
    wisdom, history = st.get(keys.WISDOM), session_history.read(st)
    llm.reset()
    r = run_cli("replay", "--since", "1", env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line and line.split()[0] in
             made.values()}
    for kind, sid in made.items():
        if kind == "dead":
            assert "skipped:" in lines[sid] and "crashed" in lines[sid], lines[sid]
        else:
            assert lines[sid].endswith("same behaviour"), (kind, lines[sid], r.stdout)
    assert llm.requests == []  # every answer from the recordings
    assert st.get(keys.WISDOM) == wisdom and session_history.read(st) == history  # nothing written

    rows = json.loads(ok(run_cli("replay", "--since", "1", "--json", env=env, timeout=240)))["sessions"]
    assert {r["id"]: r["verdict"] for r in rows} == {
        sid: "skipped" if kind == "dead" else "same" for kind, sid in made.items()}
    assert all(r["differences"] == [] for r in rows)
    last = json.loads(ok(run_cli("replay", "--since", made["deep_unusable"], "--json", env=env)))["sessions"]
    assert [r["id"] for r in last] == [made["deep_unusable"]]  # from an id on: its number

    edit = "\nAlways say which message you answer.\n"
    ok(run_cli("kv", "put", keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + edit, env=env))
    r = run_cli("replay", "--since", "1", env=env, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DIFFERS in plan" in r.stdout
    assert f"{made['plain']}: changed request: orient" in r.stdout
    assert "+Always say which message you answer." in r.stdout and "--- recorded" in r.stdout
    assert f"{made['deep']}: changed request: deep_reflect" in r.stdout  # it is shown the orient prompt
    for kind in ("orient_down", "no_credit"):  # a call that failed then is still a request to compare
        line = next(line for line in r.stdout.splitlines() if line.startswith(made[kind] + " "))
        assert "DIFFERS" in line and f"{made[kind]}: changed request: orient" in r.stdout, (kind, line)
    assert f"{made['deep_unusable']}: changed request: deep_reflect" in r.stdout
    rows = json.loads(run_cli("replay", "--since", "1", "--json", env=env, timeout=240).stdout)["sessions"]
    diffs = [d for d in rows[0]["differences"] if d["part"] == "request"]
    assert diffs and diffs[0]["purpose"] == "orient" and "+Always say which message you answer." in diffs[0]["diff"]
    assert llm.requests == []


def test_a_dry_run_replays_as_a_dry_run_and_is_no_session_to_replay_since(st, llm, env):
    llm.queue(plan(action("kv_write", {"key": "k", "value": "v"}, id="w"), think("Say hi", id="hi")))
    llm.responder = answers("hi", reflect=reflection())
    r = ok(run_wake(env, "--dry-run", "--quiet"))
    dry = r.split()[2].rstrip(":")
    llm.reset()
    out = run_cli("replay", dry, "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["steps"][0]["now"]["not_run"] == "dry_run"  # its tools do not run in the replay either
    assert report["writes"]["now"] == [] and llm.requests == [] and st.get("tooldata:kv_write:k") is None
    out = run_cli("replay", "--since", "1", env=env)
    assert out.returncode == 2 and "no session from '1' on" in out.stderr, out.stderr  # a dry run is no session
    both = run_cli("replay", "1", "--since", "1", env=env)
    assert both.returncode == 2 and "name one session" in both.stderr
