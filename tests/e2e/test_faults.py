"""Faults told truthfully and never paid for, black box: ``brainstem wake`` against the LLM double
(or a worse server) and a real store."""

from __future__ import annotations

import time

import pytest

from tests.doubles.hostile import Drip
from tests.wake_helpers import answers, events_of, finished, llm_calls, plan, run_wake, think, wake_env


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_stray_brace_in_prose_before_the_plan_costs_no_repair_call(real_store_url, st, llm):
    llm.queue('Let me think { about this. Options: {a, b}. He said "go. Here it is:\n'
              + plan(think("hello", store_result_as="h")) + "\nThat's all.")
    llm.responder = answers()
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st)
    assert not events_of(entries, "orient_parse_error")
    assert len(llm_calls(entries, "orient")) == 1 and len(llm_calls(entries, "think")) == 1


# --- the time budget is hard -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_slow_model_cannot_stretch_the_session_past_its_time_ceiling(real_store_url, st, llm):
    ceiling = 3
    llm.queue(plan(*[think(f"step {i}") for i in range(20)]))
    llm.responder = answers(lambda req: {"content": "ok", "delay": 1.25}, reflect=None)
    env = wake_env(real_store_url, llm, BRAINSTEM_MAX_SESSION_SECONDS=ceiling, BRAINSTEM_LLM_TIMEOUT=120)
    t0 = time.monotonic()
    r = run_wake(env, "--force")
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert took < ceiling + 3, f"the wake took {took:.1f} s under a {ceiling} s ceiling"
    _, entries = finished(r, st)
    assert entries[-1]["outcome"] == "budget_exhausted"
    assert any(e["limit"] == "time" for e in events_of(entries, "budget_exceeded"))


@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_an_endpoint_that_drips_bytes_cannot_hold_the_wake(real_store_url, st):
    drip = Drip(every=0.5)
    try:
        env = {"BRAINSTEM_KV": st.display_url if "sqlite" in st.display_url else real_store_url,
               "OPENROUTER_BASE_URL": drip.base + "/api/v1", "OPENROUTER_API_KEY": "sk-test",
               "BRAINSTEM_MAX_SESSION_SECONDS": "3", "BRAINSTEM_LLM_BACKOFF": "0.01"}
        t0 = time.monotonic()
        r = run_wake(env, "--force")
        took = time.monotonic() - t0
    finally:
        drip.close()
    assert took < 3 + 3, f"the wake took {took:.1f} s under a 3 s ceiling"
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_tool_and_its_fetch_end_with_the_session_deadline(real_store_url, st, llm):
    """A tool that allows itself 60 s, fetching from a server that drips a byte every half second: the
    session's 3 s ceiling ends both, and the wake, within a few seconds of it."""
    import json

    from brainstem.core import keys
    from tests.wake_helpers import action

    ceiling = 3
    drip = Drip(every=0.5)
    try:
        st.put(keys.tool_code("slow_fetch"), "def execute(args, ctx):\n    return ctx.fetch(args['url'])['status']\n")
        st.put(keys.tool_meta("slow_fetch"), json.dumps({"timeout_ms": 60000}))
        llm.queue(plan(action("slow_fetch", {"url": drip.base + "/x"}, id="f"),
                       action("slow_fetch", {"url": drip.base + "/y"}, id="g")))
        llm.responder = answers(reflect=None)
        env = wake_env(real_store_url, llm, BRAINSTEM_MAX_SESSION_SECONDS=ceiling,
                       BRAINSTEM_FETCH_ALLOW="127.0.0.1")
        t0 = time.monotonic()
        r = run_wake(env, "--force")
        took = time.monotonic() - t0
    finally:
        drip.close()
    assert took < ceiling + 3, f"the wake took {took:.1f} s under a {ceiling} s ceiling"
    _, entries = finished(r, st)
    done = [e for e in events_of(entries, "tool_complete") if e.get("tool") == "slow_fetch"]
    assert done and not any(e["ok"] for e in done)
    assert entries[-1]["outcome"] == "budget_exhausted"
    # The fetch and the tool end at the same deadline: the tool sees its fetch time out or, on a busy machine,
    # its own time is up first and it is stopped. Either way neither ran on (the wake's time above says so).
    assert "fetch timed out" in done[0]["error"] or done[0]["error"].startswith("timed out after"), done[0]


# --- an invalid config falls back to its last valid version ----------------------------------------------

@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_an_invalid_config_models_falls_back_to_its_last_valid_version_and_status_names_it(real_store_url, st, llm):
    from tests.helpers import run_cli

    env = wake_env(real_store_url, llm)
    r = run_cli("kv", "put", "config:models", '{"models": "not a list"}', "--force", env=env)
    assert r.returncode == 0, r.stderr
    llm.queue(plan(think("hello", model="haiku")))
    llm.responder = answers()
    _, entries = finished(run_wake(env, "--force"), st, "clean")  # not no_plan: the last valid price list ran
    (rejected,) = [e for e in events_of(entries, "config_rejected") if "config:models" in e.get("reason", "")]
    assert "last valid" in rejected["reason"] and "brainstem rollback config:models" in rejected["reason"]
    assert llm_calls(entries, "think")[0]["model"] == "anthropic/claude-haiku-4.5"
    r = run_cli("status", env=env)
    assert r.returncode == 0 and "config:models is invalid" in r.stdout, r.stdout


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_balance_that_cannot_be_read_says_why_in_karma(real_store_url, st, llm):
    llm.key_status = 500
    llm.credits_status = 403
    llm.queue(plan())
    llm.responder = answers()
    env = wake_env(real_store_url, llm, WALLET_ADDRESS="0x123", BASE_RPC_URL="http://127.0.0.1:9/")
    _, entries = finished(run_wake(env, "--force"), st)
    (gt,) = events_of(entries, "ground_truth")
    assert gt["balances"] == {"openrouter": None, "wallet_usdc": None}
    assert "/key: HTTP 500" in gt["errors"]["openrouter"] and "/credits: HTTP 403" in gt["errors"]["openrouter"]
    assert "not a valid address" in gt["errors"]["wallet_usdc"]
