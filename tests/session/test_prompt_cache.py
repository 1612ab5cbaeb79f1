"""A session's prompts, laid out for the provider's prompt cache, through real wakes against the loopback double
billing as Anthropic does.

The stable part of a prompt is the same bytes whatever the session's volatile inputs are; an agent step's
turns each re-send the conversation before them byte for byte; and where the operator's config:models gives
cache prices, later calls read what earlier ones wrote, and are booked for it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st_

from brainstem.core.templates import render
from brainstem.core.untrusted import Untrusted
from brainstem.llm.cache import marked_ttls, unmarked
from brainstem.llm.messages import text_of
from brainstem.session.prompt_cache import orient_kind, reflect_kind, render_parts
from brainstem.state import inbox
from brainstem.state.shipped import seed_dirs
from tests.helpers import put_tool
from tests.wake_helpers import answers, events_of, finished, llm_calls, plan, price_caching, run_wake, wake_env

HAIKU, SONNET = "anthropic/claude-haiku-4.5", "anthropic/claude-sonnet-4.5"
CACHE_PRICES = {HAIKU: (1.0, 5.0, 0.1, 1.25, 2.0), SONNET: (3.0, 15.0, 0.3, 3.75, 6.0)}
LOOKUP_CODE = "def execute(args, ctx):\n    return {'page': args['n'], 'text': 'a line of the page ' * 60}\n"
LOOKUP_META = {"description": "Read one page of the ledger.",
               "input": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
               "kv_access": "none", "timeout_ms": 5000, "mode": "automated"}


def shipped(name: str) -> str:
    return (seed_dirs()[0] / name).read_text()


# --- the layout: a property of the shipped prompts ------------------------------------------------

volatile = st_.fixed_dictionaries({
    "sessionId": st_.text(min_size=1, max_size=12), "now": st_.text(max_size=25),
    "effort": st_.sampled_from(["low", "medium", "high"]),
    "balances": st_.dictionaries(st_.sampled_from(["openrouter", "wallet_usdc"]), st_.floats(0, 1e4)),
    "inbox": st_.text(max_size=200), "crashData": st_.one_of(st_.none(), st_.text(max_size=100)),
    "lastReflect": st_.one_of(st_.none(), st_.text(max_size=200)), "kvIndex": st_.lists(st_.text(max_size=20)),
    "schedules": st_.dictionaries(st_.text(max_size=8), st_.integers()), "deepReflectDue": st_.booleans(),
    "kvUsage": st_.dictionaries(st_.text(max_size=8), st_.integers()),
})


def orient_variables(context: dict[str, Any]) -> dict[str, Any]:
    return {"soul": "be kind", "models": [{"alias": "haiku", "input": 1.0}], "resources": {"wallet": "none"},
            "config": {"session_budget": {"max_cost": 0.1}}, "tools": {"kv_read": "read a key"},
            "context": {**context, "additionalContext": {"wisdom": Untrusted("be frugal", "kv:wisdom")}}}


@hyp_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one=volatile, two=volatile)
def test_the_stable_part_of_the_orient_prompt_is_the_same_bytes_whatever_changes_each_session(one, two):
    template = shipped("orient.md")
    a, b = (render_parts(template, orient_variables(c), orient_kind) for c in (one, two))
    assert len(a) == len(b) == 3
    assert a[:2] == b[:2]  # the instructions, tools, models and config; then the loaded keys (wisdom)
    assert "".join(a) == render(template, orient_variables(one))  # the text is the template rendered, exactly
    assert len(a[0]) > 4 * len(template) // 5  # most of the prompt is the stable part


@hyp_settings(max_examples=30, deadline=None)
@given(plan_=st_.text(max_size=100), cost=st_.floats(0, 1), karma=st_.text(max_size=200))
def test_the_stable_part_of_the_reflect_prompt_comes_first(plan_, cost, karma):
    template = shipped("reflect.md")
    parts = render_parts(template, {"plan": plan_, "sessionCost": cost, "karma": karma, "results": {},
                                    "context": {"balances": {}, "lastReflect": None, "schedules": {}}}, reflect_kind)
    assert parts[0] == render_parts(template, {}, reflect_kind)[0] and parts[0].startswith("# Reflect")
    assert "{{" not in parts[0] and len(parts[0]) > 2 * len(parts[-1])


# --- real wakes --------------------------------------------------------------------------------

@pytest.fixture
def billing(llm):
    llm.cache_billing = {m: prices[:2] for m, prices in CACHE_PRICES.items()}
    llm.cache_min_tokens = 256
    return llm


def agent_step(rounds: int) -> dict:
    return {"type": "agent", "id": "a1", "prompt": "Read the ledger, page by page, and sum it up.",
            "tools": ["lookup"], "max_turns": rounds + 2, "model": "haiku", "store_result_as": "sum"}


def script_rounds(llm, rounds: int, *extra) -> None:
    llm.queue(plan(agent_step(rounds)),
              *[{"tool_calls": [{"name": "lookup", "arguments": {"n": i}}]} for i in range(rounds)],
              "The ledger sums to nothing in particular.", *extra)
    llm.responder = answers()


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("priced", [True, False])
def test_an_agent_steps_turns_resend_their_prefix_byte_for_byte_and_read_it_from_the_cache(
        real_store_url, st, billing, priced):
    put_tool(st, "lookup", LOOKUP_CODE, LOOKUP_META)
    if priced:
        price_caching(st, CACHE_PRICES)
    rounds = 4
    script_rounds(billing, rounds)
    _, entries = finished(run_wake(wake_env(real_store_url, billing), "--force"), st, "clean")
    turns = [r for r in billing.requests if r.get("tools")]
    assert len(turns) == rounds + 1
    for before, after in zip(turns, turns[1:], strict=False):
        # The prefix: the same tools, and every message before, the same bytes once markers are out.
        assert unmarked(after["tools"]) == unmarked(before["tools"])
        sent_before = [json.dumps(unmarked(m), sort_keys=True) for m in before["messages"]]
        assert [json.dumps(unmarked(m), sort_keys=True)
                for m in after["messages"][:len(before["messages"])]] == sent_before
    agent_calls = llm_calls(entries, "agent")
    if not priced:
        assert not any(marked_ttls(r) for r in billing.requests)  # no cache prices: no marker anywhere
        assert not any(c.get("cached_tokens") for c in agent_calls)
        return
    assert all(marked_ttls(t["messages"][-1]) == {"5m"} for t in turns)  # each turn expects another
    assert [bool(c.get("cached_tokens")) for c in agent_calls] == [False] + [True] * rounds
    for call in agent_calls[1:]:
        # What the turn before wrote is read; only the new tail is written.
        assert call["cached_tokens"] > call["cache_write_tokens"]
        assert call["cost"] < (call["input_tokens"] * 1.0 + call["output_tokens"] * 5.0) / 1e6


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_session_an_urgent_message_later_reads_the_orient_prompt_the_one_before_wrote(real_store_url, st, billing):
    price_caching(st, CACHE_PRICES)
    env = wake_env(real_store_url, billing)
    inbox.post(st, "What did you find?")
    billing.queue(plan())
    billing.responder = answers()
    _, first = finished(run_wake(env, "--force"), st, "clean")
    inbox.post(st, "And now?", urgent=True)
    billing.queue(plan())
    _, second = finished(run_wake(env), st, "clean")  # woken by the urgent message
    assert events_of(second, "session_start")[0]["woke_for"] == "urgent_inbox"
    (o1,), (o2,) = llm_calls(first, "orient"), llm_calls(second, "orient")
    assert o1["cache_write_tokens"] > 1000 and not o1.get("cached_tokens")
    assert o2["cached_tokens"] >= o1["cache_write_tokens"] * 0.9  # the stable part, read at a tenth
    orients = [r for r in billing.requests if text_of(r["messages"][-1]["content"]).startswith("# Orient")]
    stable = [[p["text"] for p in r["messages"][-1]["content"] if p.get("cache_control")] for r in orients]
    assert stable[0] == stable[1] and stable[0]
    assert o2["cost"] < 0.5 * (o2["input_tokens"] * 3.0 + o2["output_tokens"] * 15.0) / 1e6
