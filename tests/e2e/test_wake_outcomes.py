"""Outcomes that decide auto-restore, and steps that must not repeat work, through `brainstem wake`."""

from __future__ import annotations

from brainstem.core import keys
from tests.wake_helpers import events_of, finished, llm_calls, plan, reflection, run_wake, set_defaults, think, wake_env


def test_a_missing_tool_fails_once_without_retries(st, env, llm):
    llm.queue(plan({"id": "m", "type": "action", "tool": "no_such_tool", "failure": {"retries": 3}},
                   think("still runs")), "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert len(events_of(entries, "tool_start")) == 1
    assert "no tool named 'no_such_tool'" in events_of(entries, "step_failed")[0]["error"]
    assert not events_of(entries, "retry_failed")
    assert len(llm_calls(entries, "think")) == 1


def test_two_reflect_steps_reflect_once(st, env, llm):
    llm.queue(plan({"type": "reflect"}, think("between"), {"type": "reflect"}), reflection("first"), "ok")
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert len(llm_calls(entries, "reflect")) == 1
    assert st.get_json(keys.LAST_REFLECT)["session_summary"] == "first"


def test_subplan_planning_is_held_to_the_subplans_max_cost(st, env, llm):
    llm.queue(plan({"id": "sp", "type": "subplan", "goal": "g", "max_cost": 0.000001}, think("after")),
              "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert not llm_calls(entries, "subplan"), "the planner call would have cost more than the subplan may spend"
    (failed,) = [e for e in events_of(entries, "step_failed") if e["step_id"] == "sp"]
    assert "max_cost" in failed["error"]
    assert len(llm_calls(entries, "think")) == 1  # the session goes on after the subplan


def test_a_provider_outage_is_not_a_failing_session(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.responder = lambda req: {"status": 503, "message": "overloaded"}
    for _ in range(3):
        finished(run_wake(env, "--force"), st, "llm_unavailable")
    llm.responder = None
    llm.queue(plan(think("back")), "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert not events_of(entries, "auto_restore")


def test_a_self_inflicted_model_error_is_a_failing_session(st, env, llm):
    set_defaults(st, orient={"model": "no-such-alias"})
    sid, entries = finished(run_wake(env, "--force"), st, "no_plan")
    assert "unknown model" in events_of(entries, "orient_parse_error")[0]["error"]
    assert not llm.requests or all("# Orient" not in r["messages"][-1]["content"] for r in llm.requests)
