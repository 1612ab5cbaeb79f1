"""The agent does not set its own prices: every call is metered at no less than the operator's price list.

``config:models`` is the agent's to edit (aliases, new models, its own notes), but the prices and output
limits a call is metered by are floored by the list the operator last wrote (``kv put``, ``rollback``,
``seed``, or the value from before anything was recorded), else the shipped one. The agent may raise a
price, never lower one, and a model it adds costs at least the operator's dearest price.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.state.budget import daily_spent
from brainstem.state.config import OPERATOR_MODELS, effective_models, shipped_models
from brainstem.state.guarded import AgentKV
from brainstem.state.seed import seed
from brainstem.state.versions import MAX_VERSIONS, record_write, versions
from brainstem.store import open_store
from tests.helpers import run_cli
from tests.wake_helpers import answers, finished, llm_calls, plan, reflection, run_wake, seeded, think, wake_env

HAIKU = "anthropic/claude-haiku-4.5"


def priced(store, **prices: tuple[float, float]) -> dict:
    """The stored config:models with the given models' (input, output) prices per Mtok."""
    models = json.loads(store.get(keys.CONFIG_MODELS))
    for m in models["models"]:
        if m["alias"] in prices:
            m["input_cost_per_mtok"], m["output_cost_per_mtok"] = prices[m["alias"]]
    return models


def agent_writes(store, value, session_id: str = "7-abcdef", source: str = "reflect") -> None:
    """A write through the agent's guarded view, recorded as a session records it."""
    kv = AgentKV(store, lambda *a, **k: None, on_privileged_write=lambda key, old, new, src: record_write(
        store, key, old, new, source=src, session_id=session_id))
    kv.put(keys.CONFIG_MODELS, value, source=source)


def zeroed(store) -> dict:
    models = json.loads(store.get(keys.CONFIG_MODELS))
    for m in models["models"]:
        m["input_cost_per_mtok"] = m["output_cost_per_mtok"] = 0
        m["max_output_tokens"] = 200_000
    return models


# --- the floor -----------------------------------------------------------------------------------------

def test_prices_the_agent_lowers_are_the_operators(store):
    seed(store)
    agent_writes(store, zeroed(store))
    problems: list[str] = []
    m = effective_models(store, problems)
    assert m.prices(HAIKU) == (1.0, 5.0) and m.prices("anthropic/claude-opus-4.1") == (15.0, 75.0)
    assert m.info(HAIKU).max_output_tokens == 64000  # nor can it lift a model's output limit
    assert any("below the operator's" in p for p in problems)


def test_the_agent_may_raise_a_price_and_a_model_it_adds_costs_the_dearest(store):
    seed(store)
    models = priced(store, haiku=(2.0, 10.0))
    models["models"].append({"id": "cheap/new", "alias": "new", "input_cost_per_mtok": 0,
                             "output_cost_per_mtok": 0.01})
    models["models"].append({"id": "dear/new", "input_cost_per_mtok": 100, "output_cost_per_mtok": 300})
    agent_writes(store, models)
    m = effective_models(store, [])
    assert m.prices(HAIKU) == (2.0, 10.0)
    assert m.prices("cheap/new") == (15.0, 75.0)  # unknown to the operator: its dearest price
    assert m.prices("dear/new") == (100.0, 300.0)
    assert m.prices("never/listed") == (100.0, 300.0)  # the unknown: the dearest known, as always


def test_an_alias_the_agent_points_at_a_model_it_dropped_still_costs_the_operators_price(store):
    seed(store)
    models = {"models": [{"id": HAIKU, "alias": "haiku", "input_cost_per_mtok": 0, "output_cost_per_mtok": 0}],
              "alias_map": {"opus": "anthropic/claude-opus-4.1"}}
    agent_writes(store, models)
    m = effective_models(store, [])
    assert m.prices(m.resolve("opus")) == (15.0, 75.0)


def test_the_operator_may_lower_prices(store, tmp_path):
    seed(store)
    agent_writes(store, zeroed(store))
    models = priced(store, haiku=(0.5, 2.5))
    store.put(keys.CONFIG_MODELS, models)  # as `brainstem kv put` does it
    record_write(store, keys.CONFIG_MODELS, json.dumps(zeroed(store)), json.dumps(models), source="operator")
    assert effective_models(store, []).prices(HAIKU) == (0.5, 2.5)
    agent_writes(store, zeroed(store))
    assert effective_models(store, []).prices(HAIKU) == (0.5, 2.5)  # the operator's, not the shipped list


def test_a_value_nothing_recorded_is_the_operators(store):
    """Every agent write is recorded, so a config:models with no history was written by the operator."""
    seed(store)
    store.put(keys.CONFIG_MODELS, priced(store, haiku=(0.1, 0.2)))
    assert effective_models(store, []).prices(HAIKU) == (0.1, 0.2)


def test_with_no_operator_list_the_shipped_one_is_the_floor(store):
    agent_writes(store, {"models": [{"id": HAIKU, "alias": "haiku", "input_cost_per_mtok": 0,
                                     "output_cost_per_mtok": 0}]})
    assert shipped_models().prices(HAIKU) == (1.0, 5.0)
    assert effective_models(store, []).prices(HAIKU) == (1.0, 5.0)


def test_pushing_the_operators_version_out_of_the_history_does_not_lower_the_floor(store):
    seed(store)
    store.put(keys.CONFIG_MODELS, priced(store, haiku=(3.0, 9.0)))  # the operator's own prices
    agent_writes(store, zeroed(store))
    assert effective_models(store, []).prices(HAIKU) == (3.0, 9.0)  # seen once: kept
    for i in range(MAX_VERSIONS + 2):  # one reflection's batch can write many versions
        models = zeroed(store)
        models["note"] = i
        agent_writes(store, models)
    assert not any(v["source"] == "initial" for v in versions(store, keys.CONFIG_MODELS))
    assert effective_models(store, []).prices(HAIKU) == (3.0, 9.0)
    assert keys.is_runtime_owned(OPERATOR_MODELS)  # and the agent cannot write the kept copy


# --- end to end -----------------------------------------------------------------------------------------

ASK = '''
def execute(args, ctx):
    try:
        r = ctx.fetch(args["url"], method="POST", json=args["body"],
                      headers={"Authorization": "Bearer " + ctx.secrets["OPENROUTER_API_KEY"]})
    except Exception as e:
        return {"error": str(e)}
    return {"status": r["status"]}
'''


@pytest.fixture
def tool_env(tmp_path, llm):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    seed(store)
    store.put(keys.tool_code("ask"), ASK)
    store.put(keys.tool_meta("ask"), json.dumps({"secrets": ["OPENROUTER_API_KEY"]}))
    # Tokens reported, no usage.cost: the price list decides what the call is booked at.
    llm.responder = lambda req: {"content": "hi", "usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}
    env = wake_env(url, llm, BRAINSTEM_TOOL_SECRETS="OPENROUTER_API_KEY", BRAINSTEM_FETCH_ALLOW="127.0.0.1")
    yield store, env
    store.close()


def ask(env, llm, max_tokens: int = 1000) -> None:
    # Long enough that the 1,000 prompt tokens the double reports are within the request's worst case.
    body = {"model": "haiku", "messages": [{"role": "user", "content": "hello " * 500}], "max_tokens": max_tokens}
    r = run_cli("tool", "run", "ask", "--input", json.dumps({"url": llm.base_url + "/chat/completions",
                                                             "body": body}), env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"status": 200}, r.stdout


def test_a_call_is_booked_at_the_operators_price_when_the_agent_zeroed_it(tool_env, llm):
    store, env = tool_env
    agent_writes(store, zeroed(store), source="tool:evil")
    ask(env, llm, max_tokens=100_000)
    assert daily_spent(store) == pytest.approx((1000 * 1.0 + 1000 * 5.0) / 1e6)  # $0.006, not $0
    assert llm.requests[0]["max_tokens"] == 64000  # and the operator's output limit still clamps


def test_an_operators_kv_put_lowers_the_price_and_an_agents_raise_counts(tool_env, llm):
    store, env = tool_env
    lower = priced(store, haiku=(0.5, 2.5))
    r = run_cli("kv", "put", keys.CONFIG_MODELS, json.dumps(lower), env=env)
    assert r.returncode == 0, r.stderr
    agent_writes(store, zeroed(store))
    ask(env, llm)
    assert daily_spent(store) == pytest.approx((1000 * 0.5 + 1000 * 2.5) / 1e6)
    agent_writes(store, priced(store, haiku=(2.0, 10.0)))
    ask(env, llm)
    assert daily_spent(store) == pytest.approx((1000 * 0.5 + 1000 * 2.5 + 1000 * 2.0 + 1000 * 10.0) / 1e6)


@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_prices_a_reflection_zeroed_do_not_price_the_next_sessions_calls(real_store_url, llm):
    st = seeded(real_store_url)
    env = wake_env(real_store_url, llm)
    zero = zeroed(st)
    llm.queue(plan())
    llm.responder = answers(reflect=reflection(kv_operations=[{"op": "put", "key": keys.CONFIG_MODELS,
                                                               "value": zero}]))
    finished(run_wake(env, "--force"), st)
    assert st.get_json(keys.CONFIG_MODELS) == zero  # the agent's write stands: its list, its aliases
    llm.queue(plan(think("Say hi", model="haiku", max_tokens=500)))
    llm.responder = answers("hi")
    _, entries = finished(run_wake(env, "--force"), st)
    (t,) = llm_calls(entries, "think")
    assert t["cost_source"] == "price_list" and t["model"] == HAIKU
    assert t["cost"] == pytest.approx((t["input_tokens"] * 1.0 + t["output_tokens"] * 5.0) / 1e6, abs=1e-10)
    assert t["cost"] > 0
    assert any("below the operator's" in e.get("reason", "") for e in entries if e["event"] == "config_rejected")
