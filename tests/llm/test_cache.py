"""Prompt caching through the real chokepoint and client, against the loopback double billing as Anthropic does.

Markers go out only for a model whose cache prices the price list gives, and only where a reuse is
expected; a cached call is priced with the tokens the server says it read and wrote, never below the
operator's prices for them; the worst case held before a call assumes no hit, and a marked request
written whole at the write price.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from brainstem.llm.cache import Reuse, cache_tokens, marked_ttls, ttl_that_pays, unmarked
from brainstem.llm.chokepoint import LLM
from brainstem.llm.meter import MeterRefused, WireMeter
from brainstem.llm.pricing import CHARS_PER_TOKEN_WORST, implausible_prompt, listed_cost
from brainstem.llm.providers import OpenRouterProvider
from brainstem.state.budget import Budget
from brainstem.state.config import Models, floor_models
from tests.doubles import LLMDouble

HAIKU, PLAIN = "anthropic/claude-haiku-4.5", "other/plain"
PRICES = {"input_cost_per_mtok": 1.0, "output_cost_per_mtok": 5.0}
CACHE = {"cache_read_cost_per_mtok": 0.1, "cache_write_cost_per_mtok": 1.25, "cache_write_1h_cost_per_mtok": 2.0}
MODELS = Models.model_validate({"models": [{"id": HAIKU, "alias": "haiku", **PRICES, **CACHE},
                                           {"id": PLAIN, "alias": "plain", **PRICES}]})
PREFIX = "You are a careful agent. " * 400  # about 2,500 tokens as the double counts: above its minimum


def chokepoint(double: LLMDouble, max_cost: float = 10.0, models: Models = MODELS):
    recorded: list[dict] = []
    budget = Budget(max_cost=max_cost, max_steps=50, max_duration=600, reserve_fraction=0.0)
    llm = LLM(models=models, budget=budget, record=lambda ev, **f: recorded.append({"event": ev, **f}) or f,
              soul="You are a test agent.", providers=[OpenRouterProvider(double.base_url, "k", max_attempts=1)])
    return llm, budget, recorded


def calls(recorded: list[dict]) -> list[dict]:
    return [r for r in recorded if r["event"] == "llm_call"]


@pytest.fixture
def billing():
    with LLMDouble(responder=lambda req: "ok") as d:
        d.cache_billing = {HAIKU: (1.0, 5.0), PLAIN: (1.0, 5.0)}
        yield d


def conversation(turns: int) -> list[dict]:
    out = [{"role": "user", "content": PREFIX}]
    for i in range(turns):
        out += [{"role": "assistant", "content": f"looking at part {i}"}, {"role": "user", "content": f"part {i}"}]
    return out


def test_markers_go_only_to_a_model_with_cache_prices_and_only_where_a_reuse_is_expected(billing):
    llm, _, _ = chokepoint(billing)
    llm.call(purpose="agent", model="plain", history=conversation(0), max_tokens=50, reuse=Reuse(0, 3))
    llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50)
    llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50, reuse=Reuse(7200, 3))
    llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50, reuse=Reuse(0, 3))
    plain, unasked, too_late, marked = billing.requests
    for req in (plain, unasked, too_late):
        assert "cache_control" not in json.dumps(req)
        assert req["messages"][-1] == {"role": "user", "content": PREFIX}  # sent exactly as before
    assert marked["messages"][-1]["content"] == [{"type": "text", "text": PREFIX,
                                                 "cache_control": {"type": "ephemeral"}}]
    assert unmarked(marked) == {**marked, "messages": [marked["messages"][0],
                                                       {"role": "user", "content": [{"type": "text", "text": PREFIX}]}]}


def test_a_prompt_in_parts_marks_its_stable_parts_and_sends_the_same_text():
    with LLMDouble(responder=lambda req: "ok") as d:
        llm, _, _ = chokepoint(d)
        llm.call(purpose="orient", model="haiku", prompt=[PREFIX, "wisdom: be kind\n", "now: 12:00"], max_tokens=50,
                 reuse=Reuse(60))
        llm.call(purpose="orient", model="haiku", prompt=[PREFIX, "wisdom: be kind\n", "now: 12:00"], max_tokens=50)
        marked, plain = d.requests
    parts = marked["messages"][-1]["content"]
    assert [p.get("cache_control") for p in parts] == [{"type": "ephemeral"}, {"type": "ephemeral"}, None]
    joined = "".join(p["text"] for p in parts)
    assert joined == plain["messages"][-1]["content"] == PREFIX + "wisdom: be kind\nnow: 12:00"


def test_a_cached_call_is_priced_with_the_tokens_read_and_written_and_karma_records_them(billing):
    llm, budget, recorded = chokepoint(billing)
    first = llm.call(purpose="agent", model="haiku", history=conversation(1), max_tokens=50, reuse=Reuse(0, 5))
    second = llm.call(purpose="agent", model="haiku", history=conversation(2), max_tokens=50, reuse=Reuse(0, 4))
    one, two = calls(recorded)
    assert one["cache_write_tokens"] > 2000 and one["cached_tokens"] is None
    assert two["cached_tokens"] == one["cache_write_tokens"] and two["cache_write_tokens"] < 50
    for call, result in ((one, first), (two, second)):
        expected = listed_cost(MODELS, HAIKU, call["input_tokens"], call["output_tokens"], call["cached_tokens"] or 0,
                               call["cache_write_tokens"] or 0, 1.25)
        assert call["cost"] == pytest.approx(expected, abs=1e-10) == result.cost
    uncached = listed_cost(MODELS, HAIKU, two["input_tokens"], two["output_tokens"])
    assert two["cost"] < 0.2 * uncached  # a hit: a tenth of the input price for most of the prompt
    assert budget.spent == pytest.approx(one["cost"] + two["cost"], abs=1e-9)
    # The second request read what the first wrote, and marked the first one's end too, so it is read even
    # where a conversation has grown past the provider's look-back.
    assert [len(marked_ttls(m)) for m in billing.requests[1]["messages"]] == [0, 0, 0, 1, 0, 1]


@pytest.mark.parametrize("reported", [0.0, 1e-9, None])
def test_a_cached_call_is_never_booked_below_its_reported_usage_at_the_operators_prices(reported):
    usage = {"prompt_tokens": 3000, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 2000,
                                                                                      "cache_write_tokens": 900}}
    if reported is not None:
        usage["cost"] = reported
    with LLMDouble({"content": "ok", "usage": usage}) as d:
        llm, budget, recorded = chokepoint(d)
        llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50, reuse=Reuse(0, 2))
    (call,) = calls(recorded)
    floor = (100 * 1.0 + 2000 * 0.1 + 900 * 1.25 + 20 * 5.0) / 1e6
    assert call["cost"] == pytest.approx(floor, abs=1e-12) and budget.spent == pytest.approx(floor, abs=1e-12)
    assert (call["cached_tokens"], call["cache_write_tokens"], call["input_tokens"]) == (2000, 900, 3000)


def test_a_server_billing_more_than_the_price_list_is_booked_as_billed(billing):
    with LLMDouble({"content": "ok", "usage": {"prompt_tokens": 3000, "completion_tokens": 20, "cost": 0.5,
                                               "prompt_tokens_details": {"cached_tokens": 2000}}}) as d:
        llm, _, recorded = chokepoint(d)
        llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50, reuse=Reuse(0, 2))
    assert calls(recorded)[0]["cost"] == 0.5


def test_the_worst_case_assumes_no_hit_and_a_marked_request_written_whole(billing):
    llm, _, _ = chokepoint(billing)
    chars = 30_000
    tokens = math.ceil(chars / CHARS_PER_TOKEN_WORST) + 16
    assert llm.worst_case(HAIKU, chars, 100) == pytest.approx((tokens * 1.0 + 100 * 5.0) / 1e6)
    assert llm.worst_case(HAIKU, chars, 100, frozenset({"5m"})) == pytest.approx((tokens * 1.25 + 100 * 5.0) / 1e6)
    assert llm.worst_case(HAIKU, chars, 100, frozenset({"5m", "1h"})) == pytest.approx(
        (tokens * 2.0 + 100 * 5.0) / 1e6)
    # A budget that affords the call unmarked but not written whole at the write price: the answer is shortened
    # so that the worst case still fits, though the prefix is in the cache already.
    llm.call(purpose="agent", model="haiku", history=conversation(0), max_tokens=50, reuse=Reuse(0, 2))
    history = conversation(0)
    marked_worst = llm.worst_case(HAIKU, len(PREFIX) + 21, 2000, frozenset({"5m"}))
    plain_worst = llm.worst_case(HAIKU, len(PREFIX) + 21, 2000)
    tight, _, recorded = chokepoint(billing, max_cost=(marked_worst + plain_worst) / 2)
    tight.call(purpose="agent", model="haiku", history=history, max_tokens=2000, reuse=Reuse(0, 2))
    (call,) = calls(recorded)
    assert call["max_tokens_reduced_to_fit_budget"] and call["request"]["max_tokens"] < 2000
    assert call["cost"] <= tight.worst_case(HAIKU, len(PREFIX) + 21, call["request"]["max_tokens"], frozenset({"5m"}))


@settings(max_examples=200, deadline=None)
@given(prompt=st_.integers(0, 10**6), read=st_.integers(0, 10**6), written=st_.integers(0, 10**6),
       out=st_.integers(0, 10**5))
def test_the_price_of_cache_tokens_never_falls_below_reading_all_of_them(prompt, read, written, out):
    """However a server splits its report, the prompt is never taken for fewer tokens than it reported."""
    cost = listed_cost(MODELS, HAIKU, prompt, out, read, written, 1.25)
    total = max(prompt, read + written)
    assert cost >= (total * 0.1 + out * 5.0) / 1e6 - 1e-12
    assert cost <= (max(prompt, 0) + read + written) * 1.25 / 1e6 + out * 5.0 / 1e6 + 1e-12


def test_cached_tokens_count_as_reported_prompt_tokens_for_the_usage_sanity_rule():
    chars = 40_000  # about 13,000 tokens by the runtime's estimate
    anthropic_style = {"prompt_tokens": 12, "completion_tokens": 5, "cache_read_input_tokens": 9000,
                       "cache_creation_input_tokens": 1000}
    assert cache_tokens(anthropic_style) == (9000, 1000)
    assert implausible_prompt(anthropic_style, chars) is None
    assert implausible_prompt({"prompt_tokens": 12, "completion_tokens": 5}, chars) is not None
    openrouter_style = {"prompt_tokens": 10_000, "prompt_tokens_details": {"cached_tokens": 9000}}
    assert cache_tokens(openrouter_style) == (9000, 0) and implausible_prompt(openrouter_style, chars) is None


def test_which_lifetime_pays():
    prices = MODELS.cache_prices(HAIKU)
    assert ttl_that_pays(prices, Reuse(10)) == "5m"
    assert ttl_that_pays(prices, Reuse(900, times=1)) is None  # an hour's write (2x) is not earned by one hit
    assert ttl_that_pays(prices, Reuse(900, times=4)) == "1h"
    assert ttl_that_pays(prices, Reuse(7200, times=100)) is None
    assert ttl_that_pays(prices, None) is None and ttl_that_pays(MODELS.cache_prices(PLAIN), Reuse(0)) is None
    dear = MODELS.model_copy(deep=True)
    dear.models[0].cache_write_cost_per_mtok = 3.0  # a write dearer than a hit saves: never worth it
    assert ttl_that_pays(dear.cache_prices(HAIKU), Reuse(10)) is None


def test_the_agent_cannot_give_itself_cache_prices_or_lower_the_operators():
    operator = Models.model_validate({"models": [{"id": HAIKU, "alias": "haiku", **PRICES, **CACHE},
                                                 {"id": PLAIN, "alias": "plain", **PRICES}]})
    agent = Models.model_validate({"models": [
        {"id": HAIKU, "alias": "haiku", **PRICES, "cache_read_cost_per_mtok": 0.0, "cache_write_cost_per_mtok": 0.0},
        {"id": PLAIN, "alias": "plain", **PRICES, "cache_read_cost_per_mtok": 0.01, "cache_write_cost_per_mtok": 1.0}]})
    problems: list[str] = []
    priced = floor_models(agent, operator, problems)
    got = priced.cache_prices(HAIKU)
    assert (got.read, got.write) == (0.1, {"5m": 1.25, "1h": 2.0})
    assert priced.cache_prices(PLAIN) is None  # the operator never priced caching for it: never marked
    assert problems and "caching" in problems[0]


def test_the_wire_meter_prices_a_marked_request_at_the_write_price_and_refuses_one_it_cannot_price():
    budget = Budget(max_cost=10.0, max_steps=10, max_duration=600, reserve_fraction=0.0)
    meter = WireMeter(models=MODELS, budget=budget, record=lambda *a, **k: None,
                      llm_base_url="https://llm.example/api/v1", operator_ids=frozenset({HAIKU, PLAIN}))
    body = {"model": "haiku", "max_tokens": 100, "messages": [
        {"role": "user", "content": [{"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral",
                                                                                          "ttl": "1h"}}]}]}
    note: dict = {}
    sent = meter.before("POST", "/api/v1/chat/completions", json.dumps(body).encode(), note)
    assert note["worst_case"] == pytest.approx(((math.ceil(len(sent) / 3) + 16) * 2.0 + 100 * 5.0) / 1e6, abs=1e-9)
    usage = {"prompt_tokens": 2600, "completion_tokens": 10, "cost": 0.0,
             "prompt_tokens_details": {"cache_write_tokens": 2500}}
    cost = meter.after(note, 200, json.dumps({"choices": [{"message": {"content": "ok"}}], "usage": usage}),
                       None, "t")
    assert cost == pytest.approx((100 * 1.0 + 2500 * 2.0 + 10 * 5.0) / 1e6) and cost <= note["worst_case"]
    with pytest.raises(MeterRefused, match="cache prices"):
        meter.before("POST", "/api/v1/chat/completions", json.dumps({**body, "model": "plain"}).encode(), {})


def test_a_model_without_cache_prices_that_a_server_caches_of_its_own_accord_is_booked_at_its_bill():
    """OpenAI's models cache long prompts unasked; with no cache prices listed, the bill stands as it did."""
    usage = {"prompt_tokens": 3000, "completion_tokens": 20, "cost": 0.0011,
             "prompt_tokens_details": {"cached_tokens": 2000}}
    with LLMDouble({"content": "ok", "usage": usage}) as d:
        llm, _, recorded = chokepoint(d)
        llm.call(purpose="think", model="plain", prompt=PREFIX, max_tokens=50, reuse=Reuse(0, 2))
    (call,) = calls(recorded)
    assert "cache_control" not in json.dumps(d.requests[0])
    assert call["cost"] == 0.0011 and call["cached_tokens"] == 2000
