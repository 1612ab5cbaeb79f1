"""Fast unit tests (no subprocess, no server) for the pieces the wake cycle is built from."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest

from brainstem.core.clock import parse_iso
from brainstem.core.plan import (
    ConditionalStep,
    PlanError,
    SubPlan,
    ThinkStep,
    UnknownStep,
    first_json_object,
    parse_plan,
)
from brainstem.core.templates import references, render, substitute
from brainstem.llm.chokepoint import LLM, MIN_USEFUL_TOKENS, LLMError
from brainstem.llm.openrouter import LLMResponse, ProviderError
from brainstem.session.ending import MAX_SLEEP, clamp_sleep
from brainstem.session.executor import match_branch, normalise_answer
from brainstem.state.budget import Budget, BudgetExceeded
from brainstem.state.config import Models

# --- conditional answers ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("Yes!\n", "yes"), ("  NO.  ", "no"), ('"yes"', "yes"), ("**Yes**", "yes"), ("(no)", "no"),
    ("Maybe?!", "maybe"), ("", ""), ("yes, definitely", "yes, definitely"),
])
def test_normalise_answer(raw, expected):
    assert normalise_answer(raw) == expected


def test_match_branch():
    branches = {"yes": [], "no": [], "Needs Review": [], "default": []}
    assert match_branch("Yes!\n", branches) == "yes"
    assert match_branch("NO", branches) == "no"
    assert match_branch("needs review.", branches) == "Needs Review"
    assert match_branch("Yes, because the balance is low.", branches) == "yes"  # first word names a branch
    assert match_branch("maybe", branches) is None
    assert match_branch("", branches) is None
    assert match_branch("default", branches) is None  # "default" is the fallback, never an answer
    assert match_branch("yesterday", branches) is None


# --- templates ------------------------------------------------------------------------------------

VARS = {"a": {"b": {"c": "deep"}}, "items": ["zero", {"name": "one"}], "n": 3, "obj": {"x": [1, 2]},
        "flag": None, "text": "plain"}


def test_render_dotted_paths_and_list_index():
    assert render("{{a.b.c}} / {{ items.0 }} / {{items.1.name}}", VARS) == "deep / zero / one"


def test_render_leaves_unknown_as_is_and_reports_it():
    missing = []
    out = render("{{a.b.nope}} {{items.7}} {{ghost}} {{text}}", VARS, on_missing=missing.append)
    assert out == "{{a.b.nope}} {{items.7}} {{ghost}} plain"
    assert missing == ["a.b.nope", "items.7", "ghost"]


def test_render_json_encodes_non_strings():
    assert render("n={{n}} obj={{obj}} flag={{flag}} b={{a.b}}", VARS) == \
        'n=3 obj={"x": [1, 2]} flag=null b={"c": "deep"}'


def test_render_does_not_recurse_into_values():
    assert render("{{text}}", {"text": "{{secret}}", "secret": "s3cret"}) == "{{secret}}"


def test_substitute_whole_placeholder_keeps_the_type():
    step = {"input": {"data": "{{obj}}", "count": " {{n}} ", "msg": "got {{n}} of {{obj}}", "keep": 5,
                      "list": ["{{items.1}}", "{{nope}}"]}}
    out = substitute(step, VARS)
    assert out["input"]["data"] == {"x": [1, 2]}
    assert out["input"]["count"] == 3
    assert out["input"]["msg"] == 'got 3 of {"x": [1, 2]}'
    assert out["input"]["keep"] == 5
    assert out["input"]["list"] == [{"name": "one"}, "{{nope}}"]
    assert step["input"]["data"] == "{{obj}}"  # the original is not modified


def test_substitute_never_splices_into_json():
    # A value full of quotes stays one string value: it cannot break out of the structure.
    out = substitute({"text": "say {{evil}}"}, {"evil": '", "tool": "rm -rf'})
    assert out == {"text": 'say ", "tool": "rm -rf'}


def test_references():
    obj = {"prompt": "Use {{page.body}} and {{ summary }}", "input": {"{{keyname}}": ["{{x.0}}", 4]},
           "other": "no placeholders {single}"}
    assert references(obj) == {"page", "summary", "keyname", "x"}
    assert references("plain") == set()


# --- plan parsing ---------------------------------------------------------------------------------

PLAN = {"steps": [{"type": "think", "prompt": "hi", "id": "t"}], "next_wake_config": {"sleep_seconds": 60}}


def test_parse_plan_plain_fenced_and_with_prose():
    text = json.dumps(PLAN)
    for answer in (text, f"```json\n{text}\n```", f"```\n{text}\n```", f"Sure! Here is my plan:\n{text}\nCheers.",
                   f"Plan follows.\n```json\n{text}\n```\nThat is all."):
        plan = parse_plan(answer)
        assert isinstance(plan.steps[0], ThinkStep) and plan.steps[0].prompt == "hi"


@pytest.mark.parametrize("prose", [
    "Let me think { about it. ",                      # a stray brace that never closes
    'He said "use {x} carefully. ',                    # an unmatched quote, then a brace pair
    "Options: {a, b} or {c}. Plan:\n",                # brace pairs that are not JSON
])
def test_parse_plan_skips_stray_braces_and_quotes_in_prose(prose):
    plan = parse_plan(prose + json.dumps(PLAN) + " Done.")
    assert plan.steps[0].prompt == "hi"


def test_parse_plan_takes_the_first_balanced_object_even_with_braces_in_strings():
    text = 'Thinking {briefly}. {"steps": [{"type": "think", "prompt": "use {{page}} } here"}]} and {"x": 1}'
    plan = parse_plan(text)
    assert plan.steps[0].prompt == "use {{page}} } here"


@pytest.mark.parametrize("answer, message", [
    ('[{"type": "think", "prompt": "x"}]', "JSON list"),
    ('{"steps": [{"type": "think", "prompt": "x"}', "never closed"),
    ("I would rather rest today.", "no JSON object"),
    ("", "empty"),
    ('{"steps": [{"type": "think", "prompt": 42}]}', "prompt"),
    ('{"steps": "think"}', "steps"),
    ('{"no_steps": []}', "steps"),
    ('{"steps": [{"type": "action"}]}', "tool"),
])
def test_parse_plan_rejects(answer, message):
    with pytest.raises(PlanError) as exc:
        parse_plan(answer)
    assert message in str(exc.value)


def test_parse_plan_truncated_answer_is_not_a_plan():
    with pytest.raises(PlanError, match="cut off"):
        parse_plan(json.dumps(PLAN), truncated=True)


def test_parse_plan_nested_conditional_branches():
    raw = {"steps": [{"type": "conditional", "prompt": "q?", "default": "no", "branches": {
        "yes": [{"type": "conditional", "prompt": "q2?", "branches": {"a": [{"type": "think", "prompt": "deep"}],
                                                                      "b": [{"type": "mystery"}]}}],
        "no": []}}]}
    plan = parse_plan(json.dumps(raw))
    outer = plan.steps[0]
    assert isinstance(outer, ConditionalStep) and outer.default == "no"
    inner = outer.branches["yes"][0]
    assert isinstance(inner, ConditionalStep)
    assert isinstance(inner.branches["a"][0], ThinkStep) and inner.branches["a"][0].prompt == "deep"
    assert isinstance(inner.branches["b"][0], UnknownStep)
    assert outer.branches["no"] == []


def test_unknown_step_type_parses_as_unknown_step():
    plan = parse_plan('{"steps": [{"type": "dance", "moves": 3, "id": "u"}, {"type": "reflect"}]}')
    assert isinstance(plan.steps[0], UnknownStep) and plan.steps[0].type == "dance" and plan.steps[0].id == "u"
    assert plan.steps[1].type == "reflect"


def test_step_fields():
    plan = parse_plan(json.dumps({"steps": [{"type": "think", "prompt": "p", "depends_on": "s1",
                                             "failure": {"retries": 2, "on_fail": "stop_session"}}]}))
    step = plan.steps[0]
    assert step.depends_on == ["s1"] and step.failure.retries == 2 and step.failure.on_fail == "stop_session"
    with pytest.raises(PlanError):
        parse_plan(json.dumps({"steps": [{"type": "think", "prompt": "p", "failure": {"on_fail": "explode"}}]}))
    with pytest.raises(PlanError):
        parse_plan(json.dumps({"steps": [{"type": "think", "prompt": "p", "store_result_as": "has space"}]}))


def test_subplan_model():
    sub = parse_plan('{"steps": [{"type": "think", "prompt": "x"}]}', model=SubPlan)
    assert len(sub.steps) == 1


def test_first_json_object_skips_an_unparsable_candidate():
    assert first_json_object('{not json} then {"a": 1}') == {"a": 1}


# --- budget ---------------------------------------------------------------------------------------

def test_budget_reserve_slice():
    b = Budget(max_cost=1.0, max_steps=10, max_duration=100, reserve_fraction=0.2)
    assert b.cost_ceiling() == pytest.approx(0.8) and b.cost_ceiling(use_reserve=True) == 1.0
    assert b.time_ceiling() == pytest.approx(80) and b.time_ceiling(use_reserve=True) == 100
    b.spent = 0.79
    b.before_step()  # still under the steps' share
    b.spent = 0.8
    with pytest.raises(BudgetExceeded) as exc:
        b.before_step()
    assert exc.value.limit == "cost"


def test_budget_step_cap():
    b = Budget(max_cost=1.0, max_steps=2, max_duration=100)
    b.before_step()
    b.steps = 2
    with pytest.raises(BudgetExceeded) as exc:
        b.before_step()
    assert exc.value.limit == "steps"


def test_budget_time_cap():
    b = Budget(max_cost=1.0, max_steps=10, max_duration=10, reserve_fraction=0.5)
    b.t0 -= 6  # 6 s of 10 elapsed: past the steps' 5 s share, inside the reserve
    with pytest.raises(BudgetExceeded) as exc:
        b.before_step()
    assert exc.value.limit == "time"
    assert 3.5 < b.time_left(use_reserve=True) <= 4


def test_budget_nested_caps():
    b = Budget(max_cost=1.0, max_steps=20, max_duration=100, reserve_fraction=0.2)
    b.spent, b.steps = 0.1, 3
    with b.cap(cost=0.05, steps=2):
        assert b.cost_ceiling() == pytest.approx(0.15) and b.binding_limit() == "subplan"
        with b.cap(cost=0.5, steps=5):  # an inner cap cannot loosen the outer one
            assert b.cost_ceiling() == pytest.approx(0.15)
        b.steps = 5
        with pytest.raises(BudgetExceeded) as exc:
            b.before_step()
        assert exc.value.limit == "subplan"
    assert b.caps == [] and b.cost_ceiling() == pytest.approx(0.8) and b.binding_limit() == "cost"
    b.before_step()


# --- sleep times ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (-5, 21600.0), (1e12, MAX_SLEEP), ("abc", 21600.0), (None, 21600.0), (True, 21600.0),
    (float("nan"), 21600.0), (float("inf"), MAX_SLEEP), (3600, 3600.0), (0, 60.0), (7200.5, 7200.5),
])
def test_clamp_sleep(value, expected):
    assert clamp_sleep(value, 21600) == expected


def test_clamp_sleep_bounds():
    assert MAX_SLEEP == 30 * 86400
    assert clamp_sleep(-1, 1e12) == MAX_SLEEP  # even a silly default is clamped


@pytest.mark.parametrize("text", ["2026-11-22T06:00:00Z", "2026-11-22T06:00:00+00:00", "2026-11-22T06:00:00",
                                  " 2026-11-22T07:00:00+01:00 "])
def test_parse_iso_accepts_utc_forms(text):
    t = parse_iso(text)
    assert t == datetime(2026, 11, 22, 6, 0, tzinfo=timezone.utc) and t.tzinfo is not None


@pytest.mark.parametrize("value", ["tomorrow", "", "2026-13-40T99:00:00Z", None, 12345, ["2026-11-22T06:00:00Z"]])
def test_parse_iso_rejects_garbage(value):
    assert parse_iso(value) is None


# --- the LLM chokepoint -----------------------------------------------------------------------------

MODELS = Models.model_validate({
    "models": [
        {"id": "cheap/model", "alias": "cheap", "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 2.0},
        {"id": "dear/model", "alias": "dear", "input_cost_per_mtok": 10.0, "output_cost_per_mtok": 40.0,
         "max_output_tokens": 8000},
        {"id": "unpriced/model", "alias": "unpriced"},
    ],
    "alias_map": {"ghost": "ghost/model"},  # resolvable, but not in the price list at all
    "fallback_model": "cheap",
})
SOUL = "I am a test soul."


class FakeProvider:
    """A provider that answers with fixed token counts and records what it was asked."""

    def __init__(self, tier="hardcoded", prompt_tokens=1000, completion_tokens=1000, cost=None, fail=None,
                 content="answer"):
        self.tier = tier
        self.requests: list[dict] = []
        self.prompt_tokens, self.completion_tokens, self.cost = prompt_tokens, completion_tokens, cost
        self.fail, self.content = fail, content

    def complete(self, request, timeout, deadline=None):
        self.requests.append(request)
        if self.fail:
            raise ProviderError(self.fail)
        return LLMResponse(content=self.content, usage={"prompt_tokens": self.prompt_tokens,
                                                        "completion_tokens": self.completion_tokens,
                                                        "reasoning_tokens": 0, "cost": self.cost},
                           finish_reason="stop", truncated=False, model=request["model"], raw={})


def make_llm(providers, max_cost=10.0, fallback="cheap"):
    recorded = []
    budget = Budget(max_cost=max_cost, max_steps=10, max_duration=600, reserve_fraction=0.2)
    llm = LLM(models=MODELS, budget=budget, record=lambda ev, **f: recorded.append({"event": ev, **f}) or f,
              soul=SOUL, providers=providers, fallback_model=fallback)
    return llm, budget, recorded


@pytest.mark.parametrize("model", ["unpriced", "ghost"])
def test_a_model_without_a_price_costs_the_highest_known_price(model):
    p = FakeProvider(prompt_tokens=1_000_000, completion_tokens=1_000_000)
    llm, budget, recorded = make_llm([p], max_cost=1000)
    result = llm.call(purpose="think", model=model, prompt="x", max_tokens=100)
    assert result.cost == pytest.approx(10.0 + 40.0)  # the dearest input and output prices, never free
    assert budget.spent == pytest.approx(50.0)
    assert llm.worst_case(MODELS.resolve(model), 3000, 1000) == pytest.approx(((1000 + 16) * 10 + 1000 * 40) / 1e6)


def test_provider_reported_cost_wins_and_is_what_karma_and_the_budget_get():
    p = FakeProvider(cost=0.0123456789123)
    llm, budget, recorded = make_llm([p])
    llm.call(purpose="think", model="cheap", prompt="x", max_tokens=100)
    call = [r for r in recorded if r["event"] == "llm_call"][0]
    assert call["cost_source"] == "provider" and call["cost"] == budget.spent
    assert call["cost"] == pytest.approx(0.0123456789123, abs=1e-10)
    assert call["request"]["messages"][0]["content"] == f"[soul: {len(SOUL)} chars]"  # not the soul each time


def test_the_soul_is_always_the_system_message():
    p = FakeProvider()
    llm, _, _ = make_llm([p])
    llm.call(purpose="think", model="cheap", prompt="hello", max_tokens=100,
             history=[{"role": "user", "content": "before"}, {"role": "assistant", "content": "ok"}])
    msgs = p.requests[0]["messages"]
    assert msgs[0] == {"role": "system", "content": SOUL}
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"] and msgs[-1]["content"] == "hello"


def test_max_tokens_shrunk_to_fit_the_budget():
    p = FakeProvider(prompt_tokens=10, completion_tokens=10)
    # dear: 40 USD per Mtok out. Budget 0.05 -> 0.04 for steps; 1000 tokens would cost 0.04 + input.
    llm, budget, recorded = make_llm([p], max_cost=0.05)
    prompt = "p" * 300  # (300 + soul) / 3 + 16 tokens of input at 10 USD per Mtok
    llm.call(purpose="think", model="dear", prompt=prompt, max_tokens=1000)
    sent = p.requests[0]["max_tokens"]
    input_cost = (math.ceil((len(prompt) + len(SOUL)) / 3) + 16) * 10 / 1e6
    assert sent == math.floor((0.04 - input_cost) * 1e6 / 40)
    assert MIN_USEFUL_TOKENS <= sent < 1000
    assert [r for r in recorded if r["event"] == "llm_call"][0]["max_tokens_reduced_to_fit_budget"] is True


def test_model_max_output_tokens_caps_the_request():
    p = FakeProvider()
    llm, _, _ = make_llm([p], max_cost=1000)
    llm.call(purpose="think", model="dear", prompt="x", max_tokens=50_000)
    assert p.requests[0]["max_tokens"] == 8000


def test_refused_when_not_even_256_tokens_fit():
    p = FakeProvider()
    llm, budget, recorded = make_llm([p], max_cost=0.01)  # 0.008 for steps: 200 tokens of dear output
    with pytest.raises(BudgetExceeded) as exc:
        llm.call(purpose="think", model="dear", prompt="x", max_tokens=1000)
    assert exc.value.limit == "cost"
    assert p.requests == [] and budget.spent == 0
    refused = [r for r in recorded if r["event"] == "budget_exceeded"]
    assert len(refused) == 1 and refused[0]["purpose"] == "think" and refused[0]["model"] == "dear/model"
    # ...while the reserve (reflection) may still use the last slice
    cheap = make_llm([FakeProvider(prompt_tokens=10, completion_tokens=10)], max_cost=0.01)[0]
    cheap.budget.spent = 0.0095
    with pytest.raises(BudgetExceeded):
        cheap.call(purpose="think", model="cheap", prompt="x", max_tokens=1000)
    cheap.call(purpose="reflect", model="cheap", prompt="x", max_tokens=100, use_reserve=True)


def test_a_small_request_under_256_tokens_is_not_refused_for_being_small():
    p = FakeProvider(prompt_tokens=10, completion_tokens=10)
    llm, _, _ = make_llm([p], max_cost=0.0002)
    llm.call(purpose="conditional", model="cheap", prompt="yes or no?", max_tokens=50)
    assert p.requests[0]["max_tokens"] == 50


def test_providers_in_order_then_the_fallback_model():
    bad1, bad2 = FakeProvider("dynamic", fail="adapter broke"), FakeProvider("last_working", fail="also broke")
    good = FakeProvider("hardcoded")
    llm, _, recorded = make_llm([bad1, bad2, good])
    result = llm.call(purpose="think", model="dear", prompt="x", max_tokens=100)
    assert result.tier == "hardcoded"
    assert [r["tier"] for r in recorded if r["event"] == "provider_fallback"] == ["dynamic", "last_working"]
    # every provider failing: the fallback model is tried once, then LLMError
    down = FakeProvider(fail="down")
    llm, _, recorded = make_llm([down])
    with pytest.raises(LLMError):
        llm.call(purpose="think", model="dear", prompt="x", max_tokens=100)
    assert [r["model"] for r in down.requests] == ["dear/model", "cheap/model"]
    assert len([r for r in recorded if r["event"] == "model_fallback"]) == 1


def test_unknown_model_is_an_error_not_a_free_call():
    p = FakeProvider()
    llm, _, recorded = make_llm([p])
    with pytest.raises(LLMError, match="unknown model"):
        llm.call(purpose="think", model="nonexistent", prompt="x", max_tokens=100)
    assert p.requests == []
