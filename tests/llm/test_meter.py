"""The meter on the wire reserves, for every request it lets reach the LLM host, at least what the host can
bill for it; whatever it cannot price never leaves.

The host here bills as a host does: every byte it is sent is read as prompt (a third of a token each, the
price list's assumption), every allowed output token is spent, and every content part that is not text (an
image, audio, a file, anywhere in the messages) costs the operator's price for a part. Hypothesis draws the
requests: any method, any path, any body, parts of any type in messages of any role.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st_

from brainstem.llm.meter import FREE_READS, MeterRefused, WireMeter
from brainstem.state.budget import Budget
from brainstem.state.config import Models, floor_models, shipped_models
from tests.doubles.llm_server import billed_parts

BASE = "https://llm.example/api/v1"
HAIKU, SONNET = "anthropic/claude-haiku-4.5", "anthropic/claude-sonnet-4.5"
PART_PRICE = 0.0048  # the operator's price of one image for haiku; sonnet's parts are not priced


def operator_list() -> Models:
    raw = json.loads(shipped_models().model_dump_json())
    for m in raw["models"]:
        if m["id"] == HAIKU:
            m["input_cost_per_part"] = PART_PRICE
    return Models.model_validate(raw)


def agent_list(part_prices: dict[str, float | None]) -> Models:
    """The agent's own config:models: the same models, with part prices of its choosing."""
    raw = json.loads(shipped_models().model_dump_json())
    for m in raw["models"]:
        m["input_cost_per_part"] = part_prices.get(m["alias"])
    return Models.model_validate(raw)


def host_bill(operator: Models, sent: bytes) -> float:
    req = json.loads(sent)
    p_in, p_out = operator.prices(req["model"])
    parts = billed_parts(req)
    if parts:
        assert operator.part_price(req["model"]) is not None, "a part the host bills for no known price went out"
    return (math.ceil(len(sent) / 3) * p_in + req["max_tokens"] * p_out) / 1e6 + parts * (
        operator.part_price(req["model"]) or 0.0)


text = st_.text(max_size=40)
non_text_type = st_.sampled_from(["image_url", "input_audio", "file", "video_url", "image", "Text", "TEXT", ""])
part = st_.one_of(
    st_.builds(lambda t: {"type": "text", "text": t}, text),
    st_.builds(lambda k, t: {"type": k, k or "data": {"url": "https://img.example/" + t}}, non_text_type, text),
    st_.builds(lambda t: {"text": t}, text),  # no type at all
    text, st_.integers(), st_.none(), st_.lists(st_.builds(lambda t: {"type": "image_url", "image_url": t}, text),
                                                max_size=2),
)
content = st_.one_of(text, st_.none(), st_.lists(part, max_size=6), part)
message = st_.builds(
    lambda role, c, extra: {"role": role, "content": c, **extra},
    st_.sampled_from(["system", "user", "assistant", "tool", "developer", "function", "x"]), content,
    st_.one_of(st_.just({}), st_.just({}), st_.just({"tool_call_id": "c1"}), st_.just({"name": "n"}),
               st_.builds(lambda t: {"images": [t]}, text), st_.builds(lambda t: {"audio": {"id": t}}, text)),
)
chat = st_.fixed_dictionaries(  # a request that could go: what matters is that its parts are priced
    {"model": st_.sampled_from(["haiku", "sonnet", HAIKU]), "messages": st_.lists(message, min_size=1, max_size=5)},
    optional={"max_tokens": st_.integers(1, 10**12), "temperature": st_.floats(0, 2)},
)
request = st_.fixed_dictionaries(  # anything at all
    {"model": st_.sampled_from(["haiku", "sonnet", HAIKU, "opus", "nobody/knows", 7])},
    optional={"messages": st_.one_of(st_.lists(message, max_size=5), text, st_.dictionaries(text, text, max_size=2)),
              "max_tokens": st_.one_of(st_.integers(-5, 10**12), st_.booleans(), text),
              "max_completion_tokens": st_.integers(0, 10**6),
              "prompt": text, "stream": st_.booleans(), "n": st_.integers(0, 3),
              "modalities": st_.sampled_from([["text"], ["image", "text"], ["audio"]]),
              "tools": st_.just([{"type": "function", "function": {"name": "f", "parameters": {}}}]),
              "temperature": st_.floats(allow_nan=False)},
)
body = st_.one_of(chat.map(lambda r: json.dumps(r).encode()), st_.none(), st_.just(b""), st_.binary(max_size=30),
                  text.map(str.encode), request.map(lambda r: json.dumps(r).encode()),
                  request.map(lambda r: json.dumps(r, separators=(",", ":")).encode()))
path = st_.one_of(st_.sampled_from(["/api/v1/chat/completions", "/api/v1/chat/completions/", "/chat/completions",
                                    "/api/v1/key", "/api/v1/credits", "/api/v1/models", "/api/v1/embeddings",
                                    "/api/v1/key/../chat/completions", "/api/v1/responses", "/", "/api/v1/generation"]),
                  text.map(lambda t: "/api/v1/" + t))
method = st_.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
exchange = st_.one_of(  # (method, path, query, body): half of them a chat request that could go, half anything
    st_.tuples(st_.just("POST"), st_.just("/api/v1/chat/completions"), st_.just(""),
               chat.map(lambda r: json.dumps(r).encode())),
    st_.tuples(method, path, st_.sampled_from(["", "q=1"]), body))
agent_parts = st_.fixed_dictionaries({a: st_.one_of(st_.none(), st_.floats(0, 0.1))
                                      for a in ("haiku", "sonnet", "opus")})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exchange, agent_parts, st_.floats(0, 5))
def test_what_reaches_the_llm_host_never_bills_above_its_reservation(exchange, parts, ceiling):
    method, path, query, body = exchange
    operator = operator_list()
    models = floor_models(agent_list(parts), operator)
    budget = Budget(max_cost=ceiling, max_steps=1, max_duration=60, reserve_fraction=0.0)
    meter = WireMeter(models=models, budget=budget, record=lambda *a, **k: None, llm_base_url=BASE,
                      operator_ids=frozenset(m.id for m in operator.models))
    note: dict = {}
    try:
        sent = meter.before(method, path, body, note, query=query)
    except MeterRefused:
        return  # refused before it left: the host bills nothing
    if "worst_case" not in note:  # a free read: no body, no query, one of the named few
        assert (method, path.removeprefix("/api/v1")) in FREE_READS and not sent and not query
        return
    assert method == "POST"
    event(f"sent, {'with' if billed_parts(json.loads(sent)) else 'without'} parts")
    assert note["worst_case"] >= host_bill(operator, sent) - 1e-12
    assert budget.held <= ceiling + 1e-9  # and what it held stays within the ceiling


def test_the_agent_cannot_price_parts_the_operator_does_not():
    operator = operator_list()
    models = floor_models(agent_list({"haiku": 0.0, "sonnet": 0.001}), operator)
    assert models.part_price(HAIKU) == PART_PRICE  # raised to the operator's, never lowered
    assert models.part_price(SONNET) is None  # the operator prices no part for it: still refused
    assert floor_models(agent_list({"haiku": 0.5}), operator).part_price(HAIKU) == 0.5  # a raise counts


@pytest.mark.parametrize("model", [HAIKU + ":online", "openai/gpt-4o-mini-search-preview"])
def test_code_calls_only_models_the_operator_listed(model):
    """What a model bills beside tokens (a search per request, a variant's surcharge) is known only to
    whoever chose it: a model the agent added, or a variant of a listed one, never leaves."""
    operator = operator_list()
    agent = operator.model_copy(deep=True)
    agent.models.append(agent.models[0].model_copy(update={"id": model}))
    models = floor_models(agent, operator)
    meter = WireMeter(models=models, budget=Budget(max_cost=5, max_steps=1, max_duration=60, reserve_fraction=0.0),
                      record=lambda *a, **k: None, llm_base_url=BASE,
                      operator_ids=frozenset(m.id for m in operator.models))
    body = json.dumps({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with pytest.raises(MeterRefused, match="operator"):
        meter.before("POST", "/api/v1/chat/completions", body, {})
    tools = {"model": HAIKU, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
             "tools": [{"type": "web_search"}]}
    with pytest.raises(MeterRefused, match="not a function"):
        meter.before("POST", "/api/v1/chat/completions", json.dumps(tools).encode(), {})
