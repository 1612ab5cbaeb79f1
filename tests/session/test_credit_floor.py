"""The credit floor, the 402 breaker and the runway's stretched sleep, in-process: a wake against the LLM
double (its ``/key`` answers as OpenRouter's) and a real store. The black-box journeys (what the double
received across wakes, the notice on Telegram) are tests/e2e/test_credit_floor.py."""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.core.errors import KVWriteRefused
from brainstem.operator.status import render, status
from brainstem.session import credit_floor
from brainstem.session.wake import wake
from brainstem.state import inbox
from brainstem.state.budget import today
from brainstem.state.guarded import AgentKV
from brainstem.store import karma
from tests.wake_helpers import answers, events_of, plan, reflection, think

# The agent's own balance checker, claiming a fortune: it must not lift the floor.
RICH_CHECKER = "def check(ctx):\n    return 1000000.0\n"


def entries_of(store, result) -> list[dict]:
    return karma.read(store, result.session_id)


def test_the_agents_own_balance_checker_cannot_lift_the_floor(configure, st, llm):
    st.put(keys.PROVIDER_LLM_BALANCE_CODE, RICH_CHECKER)
    llm.credit = 0.2
    llm.responder = answers()
    result = wake(configure(min_credit=1.0), st, force=True)
    assert result.outcome == "llm_no_credit" and llm.requests == []
    (held,) = events_of(entries_of(st, result), "credit_floor")
    assert held["credit"] == 0.2  # the runtime's own read, not the checker's million


def test_above_the_floor_the_runtimes_read_is_the_ground_truth_and_the_checker_is_not_asked(configure, st, llm):
    st.put(keys.PROVIDER_LLM_BALANCE_CODE, RICH_CHECKER)
    llm.credit = 3.0
    llm.queue(plan(think("hi")), "ok", reflection())
    result = wake(configure(min_credit=1.0), st, force=True)
    assert result.outcome == "clean" and len(llm.requests) == 3
    entries = entries_of(st, result)
    (gt,) = events_of(entries, "ground_truth")
    assert gt["balances"]["openrouter"] == 3.0
    assert sum(1 for path, _ in llm.get_requests if path.endswith("/key")) == 1  # one read for both


@pytest.mark.parametrize("key", [keys.LLM_CREDIT, keys.SPEND_DAYS])
def test_the_agent_cannot_clear_the_breaker_nor_touch_the_spend_it_is_judged_by(st, key):
    st.put(keys.LLM_CREDIT, {"breaker": {"opened_at": "2026-05-10T09:00:00Z", "trips": 1,
                                         "probe_after": "2099-01-01T00:00:00Z"}})
    agent = AgentKV(st)
    for write in (lambda: agent.put(key, "{}"), lambda: agent.delete(key),
                  lambda: agent.apply_operations([{"op": "delete", "key": key}])):
        with pytest.raises(KVWriteRefused):
            write()
    assert st.get_json(keys.LLM_CREDIT)["breaker"]["trips"] == 1
    assert credit_floor.blocked_now(st) is not None


def test_a_dry_run_below_the_floor_makes_no_call_and_tells_nobody(configure, st, llm):
    llm.credit = 0.2
    llm.responder = answers()
    result = wake(configure(min_credit=1.0), st, dry_run=True)
    assert result.outcome == "llm_no_credit" and llm.requests == []
    assert not [m for m in inbox.messages(st) if m.get("from") == "runtime"]


def test_a_generic_server_is_never_asked_for_a_balance_and_the_floor_holds_nothing_back(configure, st, llm,
                                                                                      real_store_url):
    from brainstem.core.settings import load_settings

    configure()  # the environment's own settings left out
    settings = load_settings(kv=real_store_url, llm_base_url=llm.base_url, llm_api_key="sk-generic",
                             llm_backoff=0.01, min_credit=1.0)
    assert settings.llm_server == "generic"
    llm.queue(plan(think("hi")), "ok", reflection())
    assert wake(settings, st, force=True).outcome == "clean"
    assert llm.get_requests == []


def test_a_short_runway_stretches_the_sleep_and_says_so(configure, st, llm):
    defaults_before = st.get(keys.CONFIG_DEFAULTS)
    llm.credit = 2.0
    st.put(keys.SPEND_DAYS, {"since": today(), "days": {today(): 1.0}})  # $1 today: two days left
    llm.queue(plan(think("hi"), next_wake={"sleep_seconds": 3600}), "ok", reflection())
    settings = configure(min_runway_days=7)
    result = wake(settings, st, force=True)
    assert result.outcome == "clean"
    wc = st.get_json(keys.WAKE_CONFIG)
    stretched = wc["stretched_for_runway"]
    assert stretched["asked_seconds"] == 3600 and stretched["min_runway_days"] == 7
    # The runway at the session's start: $2 over a day's $1 (the session's own spend came after).
    assert stretched["runway_days"] == pytest.approx(2.0) and stretched["factor"] == pytest.approx(3.5)
    assert wc["sleep_seconds"] == stretched["slept_seconds"] == pytest.approx(3600 * 3.5)
    (event,) = events_of(entries_of(st, result), "sleep_stretched")
    assert event["slept_seconds"] == wc["sleep_seconds"]
    assert st.get(keys.CONFIG_DEFAULTS) == defaults_before  # the agent's own config is never written
    report = status(st, settings)
    assert report["sleep_stretched"] == stretched and report["min_runway_days"] == 7
    assert any(line.startswith("sleep stretched") and "BRAINSTEM_MIN_RUNWAY_DAYS" in line for line in render(report))
    json.dumps(report)  # status --json prints it as it is


def test_a_long_runway_leaves_the_sleep_alone(configure, st, llm):
    llm.credit = 100.0
    st.put(keys.SPEND_DAYS, {"since": today(), "days": {today(): 1.0}})
    llm.queue(plan(think("hi"), next_wake={"sleep_seconds": 3600}), "ok", reflection())
    assert wake(configure(min_runway_days=7), st, force=True).outcome == "clean"
    wc = st.get_json(keys.WAKE_CONFIG)
    assert wc["sleep_seconds"] == 3600 and "stretched_for_runway" not in wc


def test_a_stretch_never_passes_the_longest_sleep():
    from brainstem.session.ending import MAX_SLEEP, stretch_sleep

    out = stretch_sleep(3600, {"stretch": float("inf"), "runway_days": 0.0, "min_runway_days": 7})
    assert out["slept_seconds"] == MAX_SLEEP and out["factor"] == 1e6
    json.dumps(out)  # no infinity in a stored value
