"""``brainstem replay`` end to end: a real session against the loopback LLM double, then replayed
through the CLI against the same store, with and without changes to the agent's prompts."""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.state import history as session_history
from brainstem.state.budget import daily_spent
from tests.helpers import run_cli
from tests.wake_helpers import action, answers, finished, plan, reflection, run_wake, think, user_text, wake_env


def _session(st, llm, env, **plan_extra):
    """One real session: a fetch (web_fetch against the double's /models), a think on its result, a write."""
    llm.queue(plan(action("web_fetch", {"url": f"{llm.base_url}/models"}, id="get", store_result_as="page"),
                   think("What model is listed in {{page}}?", id="ask", store_result_as="answer"),
                   action("kv_write", {"key": "notes:model", "value": "{{answer}}"}, id="note"),
                   **plan_extra))
    llm.responder = answers("double/model", reflect=reflection("listed the models", load_keys=["notes:model"]))
    r = run_wake(env, "--force")
    sid, entries = finished(r, st)
    return sid


@pytest.fixture
def fenv(real_store_url, llm):
    return wake_env(real_store_url, llm, BRAINSTEM_FETCH_ALLOW="127.0.0.1")


def test_an_unchanged_session_replays_the_same_and_twice_byte_for_byte(st, llm, fenv):
    sid = _session(st, llm, fenv)
    history_before = session_history.read(st)
    wake_before = st.get(keys.WAKE_CONFIG)
    spent_before = daily_spent(st)
    llm.reset()
    r1 = run_cli("replay", sid, env=fenv)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    assert "result: same behaviour" in r1.stdout
    assert "0 live, 0 changed request" in r1.stdout
    r2 = run_cli("replay", sid.split("-")[0], env=fenv)  # by number, too
    assert r2.stdout == r1.stdout
    # No side effects: no model call, no fetch to the world, nothing written.
    assert llm.requests == [] and llm.get_requests == []
    assert session_history.read(st) == history_before
    assert st.get(keys.WAKE_CONFIG) == wake_before
    assert daily_spent(st) == spent_before
    assert [k.name for k in st.list_all("karma:replay-")] == []


def test_replay_json_is_deterministic_and_names_every_part(st, llm, fenv):
    sid = _session(st, llm, fenv)
    outs = [run_cli("replay", sid, "--json", env=fenv) for _ in range(2)]
    assert outs[0].returncode == 0 and outs[0].stdout == outs[1].stdout
    report = json.loads(outs[0].stdout)
    assert report["same"] is True and report["session"] == sid
    assert [s["id"] for s in report["steps"]] == ["get", "ask", "note"]
    assert report["steps"][1]["before"]["result"] == "double/model"
    assert report["answers"] == {"recorded": 3, "live": 0, "assumed": 0, "changed_request": 0}
    assert ["put", "tooldata:kv_write:notes:model"] in [w[:2] for w in report["writes"]["now"]] or \
        any(w[1].endswith("notes:model") for w in report["writes"]["now"])


def test_after_a_prompt_change_replay_exits_1_and_shows_the_difference(st, llm, fenv):
    sid = _session(st, llm, fenv)
    st.put(keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + "\nAlways plan exactly one step.\n")
    llm.reset()
    r = run_cli("replay", sid, env=fenv)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "changed_request" in r.stdout and "DIFFERS" in r.stdout
    assert "0 recorded, 0 live, 1 changed request" in r.stdout  # no fallback model tried for it
    assert "result: DIFFERS in plan" in r.stdout
    assert llm.requests == []  # without --live, never the model


def test_a_changed_think_prompt_is_a_changed_step(st, llm, fenv):
    """A tool that now returns something else changes the think request downstream."""
    sid = _session(st, llm, fenv)
    code = st.get(keys.tool_code("web_fetch"))
    st.put(keys.tool_code("web_fetch"), code.replace("def execute(args, ctx):",
                                                     "def execute(args, ctx):\n    return 'changed'\n\n"
                                                     "def previous(args, ctx):"))
    r = run_cli("replay", sid, "--json", env=fenv)
    assert r.returncode == 1
    report = json.loads(r.stdout)
    steps = {s["id"]: s for s in report["steps"]}
    assert steps["get"]["now"]["result"] == "changed" and not steps["get"]["same"]
    assert steps["ask"]["now"]["status"] == "changed_request"
    assert "steps" in report["differs"]


def test_live_replay_is_priced_counted_and_recorded(st, llm, fenv):
    sid = _session(st, llm, fenv)
    st.put(keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + "\nKeep it short.\n")
    spent_before = daily_spent(st)
    llm.reset()
    llm.queue(plan(think("Say hi", id="hi")))
    llm.responder = answers("hi", reflect=reflection("said hi"))
    r = run_cli("replay", sid, "--live", "--json", env=fenv)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["answers"]["live"] >= 2  # orient and what followed it
    assert report["cost"]["now"] > 0
    assert daily_spent(st) > spent_before  # real money counts towards today
    kept = report["karma"]
    assert kept and kept.startswith("replay-")
    k = run_cli("karma", kept, "--json", env=fenv)
    calls = [json.loads(line) for line in k.stdout.splitlines() if '"llm_call"' in line]
    assert any(c.get("tier") == "replay" for c in calls)
    assert session_history.read(st)[-1]["id"] == sid  # the replay is no session


@pytest.mark.parametrize("ref, why", [("999", "no session"), ("nonsense-id", "no session")])
def test_unknown_sessions_are_one_line_exit_2(st, fenv, ref, why):
    r = run_cli("replay", ref, env=fenv)
    assert r.returncode == 2
    assert why in r.stderr and ref in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_trimmed_or_old_session_cannot_be_replayed(st, llm, fenv):
    sid = _session(st, llm, fenv)
    # Recorded by an older version: no context entry.
    entries = [e for e in st.read_log(keys.karma(sid)) if '"event":"context"' not in e]
    st.delete_log(keys.karma(sid))
    for e in entries:
        st.append(keys.karma(sid), e)
    r = run_cli("replay", sid, env=fenv)
    assert r.returncode == 2 and "older version" in r.stderr and sid in r.stderr
    st.delete_log(keys.karma(sid))  # trimmed by retention: still in the history
    r = run_cli("replay", sid, env=fenv)
    assert r.returncode == 2 and "trimmed" in r.stderr and sid in r.stderr


# --- the replay gate on deep reflection's proposals ---

def _deep_due(st):
    """The next wake is a deep reflection (the seed's first interval is 20 sessions)."""
    st.put(keys.SESSION_COUNTER, "19")


def _deep_wake(st, llm, env, deep: dict):
    def respond(req):
        text = req["messages"][-1]["content"].lstrip()
        if text.startswith("# Deep reflection"):
            return json.dumps({"reflection": "looked back", "note_to_future_self": "n", **deep})
        return "ok"
    llm.responder = respond
    r = run_wake(env, "--force")
    return finished(r, st)


def test_a_change_that_breaks_plan_parsing_on_recorded_sessions_is_refused(st, llm, fenv):
    sid = _session(st, llm, fenv)
    before = st.get_json(keys.CONFIG_DEFAULTS)
    _deep_due(st)
    # A smaller orient output limit cuts every recorded plan short: no usable plan any more.
    deep_sid, entries = _deep_wake(st, llm, fenv, {"updated_defaults": {"orient": {"max_output_tokens": 16}},
                                                   "updated_wisdom": "still applies"})
    gate = next(e for e in entries if e["event"] == "replay_gate")
    assert gate["refused"] and sid in gate["refused"] and "no usable plan" in gate["refused"]
    assert [row["session"] for row in gate["replayed"]] == [sid]
    assert st.get_json(keys.CONFIG_DEFAULTS) == before  # refused whole
    assert st.get("wisdom") == "still applies"  # what the gate does not cover still applies
    rejected = [e for e in entries if e["event"] == "config_rejected" and e.get("key") == keys.CONFIG_DEFAULTS]
    assert rejected and "replay gate" in rejected[0]["reason"]
    seen = st.get_json(keys.REPLAY_GATE)
    assert seen["refused"] == gate["refused"] and seen["session_id"] == deep_sid
    # The replays changed nothing: the history holds the two real sessions only.
    assert [h["id"] for h in session_history.read(st)] == [sid, deep_sid]


def test_a_change_that_still_plans_applies_and_the_next_deep_reflection_sees_the_result(st, llm, fenv):
    sid = _session(st, llm, fenv)
    _deep_due(st)
    new_orient = st.get(keys.PROMPT_ORIENT) + "\nPrefer one fetch per session.\n"
    deep_sid, entries = _deep_wake(st, llm, fenv, {"orient_prompt_proposals": [{"proposed_text": new_orient}]})
    gate = next(e for e in entries if e["event"] == "replay_gate")
    assert gate["refused"] is None and gate["replayed"][0]["session"] == sid
    assert gate["replayed"][0]["answers"]["assumed"] >= 1  # the changed orient request: assumed, never live
    assert st.get(keys.PROMPT_ORIENT) == new_orient
    # The next deep reflection is shown how the change fared.
    st.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 0, "after_sessions": 1, "after_days": 7})
    llm.reset()
    _deep_wake(st, llm, fenv, {})
    deep_prompt = next(r for r in llm.requests if r["messages"][-1]["content"].lstrip().startswith("# Deep"))
    assert deep_sid in deep_prompt["messages"][-1]["content"]  # stats:replay_gate names the proposing session


def test_a_context_too_large_to_record_is_named_not_replayed(st, llm, fenv):
    from tests.wake_helpers import set_defaults

    set_defaults(st, memory={"max_load_key_bytes": 200_000, "max_load_keys": 8,
                             "default_load_keys": [f"notes:big{i}" for i in range(6)]})
    for i in range(6):
        st.put(f"notes:big{i}", "x" * 200_000)
    llm.queue(plan(think("hi")))
    llm.responder = answers("ok")
    sid, entries = finished(run_wake(fenv, "--force"), st)
    ctx = next(e for e in entries if e["event"] == "context")
    assert ctx["context"] is None and ctx["too_large"] > ctx["limit"]
    r = run_cli("replay", sid, env=fenv)
    assert r.returncode == 2 and "too large" in r.stderr and sid in r.stderr


def test_an_ordinary_reflection_cannot_slip_a_breaking_change_past_the_gate(st, llm, fenv):
    """The gate sits on the keys, not on one path: kv_operations from every reflection go through it."""
    sid = _session(st, llm, fenv)
    before = st.get_json(keys.CONFIG_DEFAULTS)
    broken = {**before, "orient": {**before["orient"], "max_output_tokens": 16}}
    llm.queue(plan(action("kv_write", {"key": "k", "value": "v"}, id="w")))
    llm.responder = answers("ok", reflect=reflection(
        "cut costs", kv_operations=[{"op": "put", "key": keys.CONFIG_DEFAULTS, "value": broken},
                                    {"op": "put", "key": "notes:x", "value": "y"}]))
    second, entries = finished(run_wake(fenv, "--force"), st)
    gate = next(e for e in entries if e["event"] == "replay_gate")
    assert gate["refused"] and sid in gate["refused"]
    assert st.get_json(keys.CONFIG_DEFAULTS) == before and st.get("notes:x") is None  # the batch, whole


def test_a_plan_that_leaves_the_gate_no_time_cannot_slip_a_change_past_it(st, llm, fenv):
    """A plan asking for a 4.5 s session leaves its reflection less than the gate needs: the change is
    refused, not applied unjudged, and the next session still plans."""
    _session(st, llm, fenv)
    before = st.get(keys.PROMPT_ORIENT)
    llm.queue(plan(think("hi"), budget={"max_duration_seconds": 4.5}))
    llm.responder = answers("ok", reflect=reflection(
        "a shorter prompt", kv_operations=[{"op": "put", "key": keys.PROMPT_ORIENT, "value": "Answer in prose."}]))
    _, entries = finished(run_wake(fenv, "--force"), st)
    (rejected,) = [e for e in entries if e["event"] == "kv_operations_rejected"]
    assert rejected["reason"].startswith("replay_gate: not enough time left to replay"), rejected
    assert st.get(keys.PROMPT_ORIENT) == before
    llm.queue(plan(think("again")))
    _, entries = finished(run_wake(fenv, "--force"), st)
    assert any(e["event"] == "plan" for e in entries)


def test_the_agent_cannot_switch_its_own_gate_off(st, llm, fenv):
    _session(st, llm, fenv)
    _deep_due(st)
    before = st.get_json(keys.CONFIG_DEFAULTS)
    _, entries = _deep_wake(st, llm, fenv, {"updated_defaults": {"deep_reflect": {"replay_gate_sessions": 0}}})
    rejected = [e for e in entries if e["event"] == "config_rejected"]
    assert any("may not be lowered" in e["reason"] for e in rejected), rejected
    assert st.get_json(keys.CONFIG_DEFAULTS) == before
    # The operator can.
    from tests.helpers import run_cli as cli

    lowered = {**before, "deep_reflect": {**before["deep_reflect"], "replay_gate_sessions": 0}}
    assert cli("kv", "put", keys.CONFIG_DEFAULTS, json.dumps(lowered), env=fenv).returncode == 0


def test_replay_keeps_the_pool_of_workers_the_operator_set(st, llm, fenv):
    from brainstem.sandbox import pool

    sid = _session(st, llm, fenv)
    llm.reset()
    try:
        r = run_cli("replay", sid, env={**fenv, "BRAINSTEM_SANDBOX_POOL": "0"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert pool.size() == 0 and pool.ready() == []  # no worker kept ready
        r = run_cli("replay", sid, env={**fenv, "BRAINSTEM_SANDBOX_POOL": "2"})
        assert r.returncode == 0, r.stdout + r.stderr
        assert pool.size() == 2
    finally:
        pool.drain()
        pool.configure(pool.DEFAULT_SIZE)


def test_replay_shows_the_schedules_a_session_changed(st, llm, fenv):
    """Reflection adds a schedule of the agent's own: the session writes it, and its replay names that write
    (in an overlay: the store keeps the one schedule the session made)."""
    daily = {"tool": "kv_read", "input": {"keys": ["wisdom"]}, "every": "1d"}
    llm.queue(plan(think("Anything to do daily?", id="ask")))
    llm.responder = answers("yes: read my wisdom daily", reflect=reflection(
        "scheduled a daily read", kv_operations=[{"op": "put", "key": "schedule:daily", "value": daily}]))
    sid, _ = finished(run_wake(fenv, "--force"), st)
    made = st.get("schedule:daily", "json")
    assert made["tool"] == "kv_read" and made["created_by"] == "agent" and made["next_run"]
    llm.reset()
    r = run_cli("replay", sid, "--json", env=fenv)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert ["put", "schedule:daily"] in [w[:2] for w in report["writes"]["now"]]
    assert report["writes"]["same"] is True
    assert st.get("schedule:daily", "json") == made


# --- what the recording feeds back, and the diff of a changed request ---

def test_a_tool_reads_the_store_as_the_session_did_and_its_code_change_still_shows(st, llm, fenv):
    """The key a tool read changes after the session: the replay's tool reads the recorded value. A
    change of the tool's code is a change of the agent: it still shows."""
    st.put("notes:plan", "ship it")
    llm.queue(plan(action("kv_read", {"keys": ["notes:plan"]}, id="read", store_result_as="seen"),
                   think("What did I plan? {{seen}}", id="ask")))
    llm.responder = answers("ship it", reflect=reflection("read my plan"))
    sid, entries = finished(run_wake(fenv, "--force"), st)
    (reads,) = [e for e in entries if e["event"] == "tool_reads"]
    assert reads["values"] == {"notes:plan": "ship it"}
    st.put("notes:plan", "changed my mind")
    llm.reset()
    r = run_cli("replay", sid, "--json", env=fenv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert st.get("notes:plan") == "changed my mind" and llm.requests == []
    code = st.get(keys.tool_code("kv_read"))
    st.put(keys.tool_code("kv_read"), code.replace("def execute(args, ctx):",
                                                   "def execute(args, ctx):\n    return 'nothing'\n\n"
                                                   "def previous(args, ctx):"))
    report = json.loads(run_cli("replay", sid, "--json", env=fenv).stdout)
    assert not report["same"] and report["requests"][0]["purpose"] == "think"
    diff = report["requests"][0]["diff"].splitlines()
    assert "+nothing" in diff and '-{"ok": true, "values": {"notes:plan": "ship it"}, "missing": []}' in diff


def test_the_diff_shows_what_changed_and_not_the_clock():
    from brainstem.session.replay_report import prompt_diff

    def request(*lines):
        return {"model": "m", "messages": [{"role": "user", "content": "\n".join(lines)}]}

    before = request("# Orient", "now: 2026-01-01T10:00:00Z", "a", "b", "c", "d", "e", "f", "plan it")
    now = request("# Orient", "now: 2026-12-07T02:00:00Z", "a", "b", "c", "d", "e", "f", "plan it", "be brief")
    diff = prompt_diff(before, now).splitlines()
    assert diff[:2] == ["--- recorded", "+++ now"]
    assert [x for x in diff if x[:1] in "+-" and not x.startswith(("---", "+++"))] == ["+be brief"]
    assert " now: 2026-12-07T02:00:00Z" not in diff  # the clock line is no change, and too far to be context
    assert prompt_diff(None, now).splitlines()[0] == "--- recorded (no call here)"
    assert prompt_diff(before, {**before, "model": "other"}).splitlines()[3:5] == ["-model: m", "+model: other"]


def test_what_a_tool_read_of_the_agent_itself_is_never_put_back(st, llm, fenv):
    """A tool that read the orient prompt and the soul: the replay still runs today's prompt (so an edit
    shows) and never sees a recorded value of either in place of the store's."""
    llm.queue(plan(action("kv_read", {"keys": [keys.PROMPT_ORIENT, keys.SOUL, "notes:x"]}, id="read")))
    llm.responder = answers("ok", reflect=reflection("read myself"))
    sid, entries = finished(run_wake(fenv, "--force"), st)
    (reads,) = [e for e in entries if e["event"] == "tool_reads"]
    assert set(reads["values"]) == {keys.PROMPT_ORIENT, keys.SOUL, "notes:x"} and reads["values"]["notes:x"] is None
    st.put(keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + "\nOne step at most.\n")
    r = run_cli("replay", sid, "--json", env=fenv)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["requests"][0]["purpose"] == "orient" and "+One step at most." in report["requests"][0]["diff"]


def test_a_prompt_longer_than_karma_keeps_of_it_still_replays_the_same(st, llm, fenv):
    """Karma caps one text at 100,000 characters: the recorded orient request is cut, and the replay's is
    compared as karma would have recorded it, so a long prompt is no difference."""
    from tests.wake_helpers import set_defaults

    set_defaults(st, memory={"max_load_key_bytes": 60_000, "max_load_keys": 4,
                             "default_load_keys": ["notes:big0", "notes:big1"]}, session_budget={"max_cost": 0.5})
    for i in range(2):
        st.put(f"notes:big{i}", f"{i}" * 60_000)
    llm.queue(plan(think("hi", id="hi")))
    llm.responder = answers("ok", reflect=reflection(load_keys=["notes:big0", "notes:big1"]))
    env = {**fenv, "BRAINSTEM_MAX_SESSION_COST": "0.5"}
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    orient = next(e for e in entries if e["event"] == "llm_call" and e["purpose"] == "orient")
    assert "[truncated" in orient["request"]["messages"][-1]["content"]
    r = run_cli("replay", sid, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_call_that_failed_replays_failing_the_same_way_even_live_and_a_prompt_edit_still_shows(st, llm, fenv):
    """A think step's call meets a 503 (the fallback model then answers, or the step fails): the replay gives
    the same request the same failure, with no model asked even under ``--live``."""
    failed = []

    def respond(req: dict):
        if "Say hi" in user_text(req) and req["model"] in (failed or [req["model"]]):  # its retries too
            failed.append(req["model"])
            return {"status": 503, "message": "double: down"}
        return answers("hi", reflect=reflection("said hi"))(req)
    llm.queue(plan(think("Say hi", id="hi")))
    llm.responder = respond
    sid, entries = finished(run_wake(fenv, "--force"), st, "clean")
    lost = [e for e in entries if e["event"] == "llm_failed"]
    assert [(e["purpose"], e["fault"], e["status"]) for e in lost] == [("think", "llm_unavailable", 503)]
    assert "Say hi" in lost[0]["request"]["messages"][-1]["content"]
    line = next(li for li in run_cli("karma", sid, env=fenv).stdout.splitlines() if " llm_failed " in li)
    assert "fault=llm_unavailable status=503" in line and "request" not in line  # the request is replay's
    llm.reset()
    for live in ((), ("--live",)):
        r = run_cli("replay", sid, "--json", *live, env=fenv)
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads(r.stdout)
        assert report["same"] is True and report["answers"]["live"] == 0, report
    assert llm.requests == []

    st.put(keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + "\nSay hi twice.\n")
    r = run_cli("replay", sid, env=fenv)
    assert r.returncode == 1 and "changed request: orient" in r.stdout, r.stdout
