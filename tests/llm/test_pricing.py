"""Money told truthfully: a reply without usage is never free, and a reported cost beyond what the call
could cost is charged (it was billed) but flagged, in karma and in ``brainstem status``."""

from __future__ import annotations

import pytest

from brainstem.core import keys
from brainstem.llm.messages import request_chars
from brainstem.llm.pricing import estimated_tokens, listed_cost
from brainstem.state.budget import daily_spent
from brainstem.state.config import load_models
from tests.helpers import run_cli
from tests.wake_helpers import (
    answers,
    events_of,
    finished,
    llm_calls,
    plan,
    run_wake,
    set_defaults,
    think,
    verbose,
    wake_env,
)


def no_usage(content):
    def reply(req):
        text = content(req) if callable(content) else content
        return {"content": text if isinstance(text, str) else text["content"], "usage": None}
    return reply


@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_replies_without_usage_are_priced_and_the_ceiling_holds(real_store_url, st, llm):
    ceiling = 0.05
    set_defaults(st, orient={"model": "haiku"})  # no reasoning: priced from the text, not the worst case
    llm.queue({"content": plan(*[think(f"essay {i}", model="haiku", max_tokens=1500) for i in range(12)]),
               "usage": None})
    llm.responder = answers(no_usage(verbose), reflect=None)
    env = wake_env(real_store_url, llm, BRAINSTEM_MAX_SESSION_COST=ceiling)
    _, entries = finished(run_wake(env, "--force"), st, "budget_exhausted")
    calls = llm_calls(entries)
    thinks = llm_calls(entries, "think")
    assert all(c["cost"] > 0 for c in calls), [c["cost"] for c in calls]
    assert {c["cost_source"] for c in thinks} == {"estimated"}
    assert 1 <= len(thinks) < 12  # stopped by the ceiling, not run to the end for free
    total = sum(c["cost"] for c in calls)
    assert 0 < total <= ceiling
    assert entries[-1]["cost"] == pytest.approx(total, abs=1e-9)
    assert daily_spent(st) == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_reasoning_reply_without_usage_costs_its_worst_case(real_store_url, st, llm):
    set_defaults(st, orient={"model": "sonnet", "max_output_tokens": 2000})  # sonnet supports reasoning
    llm.queue({"content": plan(), "usage": None})
    llm.responder = answers()
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st)
    (o,) = llm_calls(entries, "orient")
    assert o["request"].get("reasoning")  # asked for, so hidden reasoning tokens may have been billed
    assert o["cost_source"] == "worst_case" and o["cost"] >= 2000 * 15 / 1e6


@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_a_reported_cost_beyond_the_worst_case_is_charged_and_flagged(real_store_url, st, llm):
    llm.queue(plan(think("one small thing", model="haiku", max_tokens=200)))
    llm.responder = answers(lambda req: {"content": "done", "usage": {"prompt_tokens": 20_000_000,
                                                                      "completion_tokens": 10, "cost": 180.0}}
                            if "one small thing" in str(req) else "ok")
    env = wake_env(real_store_url, llm)
    _, entries = finished(run_wake(env, "--force"), st)
    (a,) = events_of(entries, "cost_anomaly")
    assert a["reported"] == 180.0 and a["worst_case"] < 0.01 and a["model"] == "anthropic/claude-haiku-4.5"
    (t,) = llm_calls(entries, "think")
    assert t["cost"] == 180.0  # never less than the host billed
    (o,) = events_of(entries, "spend_overrun")  # a bill above its reservation, by any host
    assert o["cost"] == 180.0 and o["worst_case"] == a["worst_case"] and o["purpose"] == "think"
    assert daily_spent(st) >= 180.0
    r = run_cli("status", env=env)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("COST ANOMALY")]
    assert len(line) == 1 and "$180.0000" in line[0] and "brainstem anomaly 1 --billed" in line[0]
    r = run_cli("status", "--json", env=env)
    import json

    assert json.loads(r.stdout)["cost_anomalies_today"][0]["reported"] == 180.0
    assert st.get_json(keys.WAKE_CONFIG)  # the session itself ended normally

    # The provider's activity page shows it billed $0.0021: the operator corrects that call alone, and
    # the rest of the day's spend (the session's other calls) stays counted.
    before = daily_spent(st)
    r = run_cli("anomaly", "1", "--billed", "0.0021", env=env)
    assert r.returncode == 0, r.stderr
    assert daily_spent(st) == pytest.approx(before - 180.0 + 0.0021, abs=1e-6) and daily_spent(st) > 0.0021
    line = [ln for ln in run_cli("status", env=env).stdout.splitlines() if ln.startswith("COST ANOMALY")]
    assert "Corrected by the operator to $0.0021" in line[0]
    # Once only, and never more than was reported.
    r = run_cli("anomaly", "1", "--billed", "0", env=env)
    assert r.returncode != 0 and "corrected already" in r.stderr
    r = run_cli("anomaly", "2", "--billed", "0", env=env)
    assert r.returncode != 0 and "no cost anomaly number 2" in r.stderr


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_prompt_reported_at_a_few_tokens_is_priced_at_the_estimate_and_flagged(real_store_url, st, llm):
    """A mock server reporting 10 prompt tokens for a prompt of thousands (LiteLLM's mock does) is not believed:
    the call is priced at the runtime's own estimate of the prompt, with any reported cost as a floor."""
    set_defaults(st, orient={"model": "haiku"})
    llm.queue({"content": plan(think("one thought", model="haiku")),
               "usage": {"prompt_tokens": 10, "completion_tokens": 20, "cost": 1e-7}})
    llm.responder = answers()  # the rest report what they were sent (a quarter of the characters)
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st)
    (flag,) = events_of(entries, "usage_implausible")
    (o,) = llm_calls(entries, "orient")
    chars = request_chars({k: v for k, v in o["request"].items() if k != "messages"}
                          | {"messages": [{"role": "system", "content": st.get(keys.SOUL)},
                                          *o["request"]["messages"][1:]]})
    assert flag["purpose"] == "orient" and flag["reported_prompt_tokens"] == 10
    assert flag["estimated_prompt_tokens"] == estimated_tokens(chars) > 1000
    models = load_models(st, [])
    assert o["cost_source"] == "estimated" and o["input_tokens"] == 10
    assert o["cost"] == pytest.approx(listed_cost(models, o["model"], flag["estimated_prompt_tokens"], 20))
    assert o["cost"] > 1e-7 * 10  # far above what was reported
    assert [c["purpose"] for c in llm_calls(entries) if c["cost_source"] == "estimated"] == ["orient"]
