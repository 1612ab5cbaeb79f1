"""What prompt caching saves: real sessions, each run with and without cache prices in config:models.

Every session runs in-process (``brainstem.session.wake.wake``) on a fresh SQLite store seeded with
the shipped prompts and example soul, against the loopback OpenAI-compatible double billing as
Anthropic does through OpenRouter: a prefix marked ``cache_control`` is kept five minutes once it holds
the model's minimum (1,024 tokens for Sonnet 4.5, 4,096 for Haiku 4.5), read at 0.1x the input price
and written at 1.25x, the tokens counted as the double counts them (four characters a token). The
baseline is the same session with the operator's price list giving no cache prices, so nothing is
marked: the same prompts, the same answers, in the same run. Costs are what the runtime booked (the
sum of the sessions' ``llm_call`` entries); the double's bill agrees with them.

Scenarios:

* ``demo``: the session ``brainstem demo`` plays (a message from the operator, an action, an agent
  step of two rounds, a reply, a think, a conditional, reflection), its answers from the demo's cassette;
* ``agent``: a session whose plan is one agent step of 8 tool rounds on Haiku, each round reading a
  6,000-character page (the size the shipped orient prompt's example fetches);
* ``urgent``: the demo session, then an urgent message from the operator, then the session it wakes
  a minute later: the second orient reads the stable part the first one wrote.

Target: the 8-round agent step costs at most half with caching.

    python bench/prompt_cache.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from brainstem.core import keys  # noqa: E402
from brainstem.core.settings import load_settings  # noqa: E402
from brainstem.operator.demo import CASSETTE, MESSAGE  # noqa: E402
from brainstem.session.wake import wake  # noqa: E402
from brainstem.state import inbox  # noqa: E402
from brainstem.state.seed import example_soul_path, seed  # noqa: E402
from brainstem.store import karma, open_store, sqlite_url  # noqa: E402
from tests.doubles import LLMDouble  # noqa: E402
from tests.wake_helpers import price_caching  # noqa: E402

HAIKU, SONNET = "anthropic/claude-haiku-4.5", "anthropic/claude-sonnet-4.5"
# USD per million tokens: input, output, cache read, cache write (five minutes), cache write (an hour).
PRICES = {HAIKU: (1.0, 5.0, 0.10, 1.25, 2.0), SONNET: (3.0, 15.0, 0.30, 3.75, 6.0)}
MIN_TOKENS = {HAIKU: 4096, SONNET: 1024}
ROUNDS = 8
PAGE_CODE = ("def execute(args, ctx):\n"
             "    n = args['n']\n"
             "    return {'page': n, 'text': ''.join(f'Entry {n}.{i}: paid {i * 7 % 100} for item {i}. '\n"
             "                                       for i in range(200))[:6000]}\n")
PAGE_META = {"description": "Read one page of the ledger.", "kv_access": "none", "timeout_ms": 10000,
             "mode": "automated", "input": {"type": "object", "properties": {"n": {"type": "integer"}},
                                            "required": ["n"]}}
REFLECTION = json.dumps({"session_summary": "Read the ledger.", "note_to_future_self": "Nothing new.",
                         "next_orient_context": {"load_keys": ["wisdom"]}})


def demo_answers() -> list:
    answers = json.loads(CASSETTE.read_text())["answers"]
    return [{k: v for k, v in a.items() if k != "expect"} for a in answers]


def agent_answers() -> list:
    plan = {"steps": [{"id": "ledger", "type": "agent", "model": "haiku", "max_turns": ROUNDS + 2,
                       "prompt": "Read the ledger page by page (pages 1 to 8) with read_page, then say in one "
                                 "sentence what the largest payment was.",
                       "tools": ["read_page"], "store_result_as": "largest"}],
            "session_budget": {"max_cost": 0.5, "max_steps": 4, "max_duration_seconds": 600}}
    rounds = [{"tool_calls": [{"name": "read_page", "arguments": {"n": i + 1}}]} for i in range(ROUNDS)]
    return [json.dumps(plan), *rounds, "The largest payment was 99.", REFLECTION]


def fresh_store(tmp: str, name: str, caching: bool):
    store = open_store(sqlite_url(Path(tmp) / f"{name}.db"))
    seed(store, soul_file=example_soul_path())
    store.put(keys.tool_code("read_page"), PAGE_CODE)
    store.put(keys.tool_meta("read_page"), json.dumps(PAGE_META))
    defaults = json.loads(store.get(keys.CONFIG_DEFAULTS))
    defaults["session_budget"] = {"max_cost": 0.5, "max_steps": 12, "max_duration_seconds": 600}
    store.put(keys.CONFIG_DEFAULTS, defaults)
    if caching:  # as the operator writes it with `brainstem kv put`
        price_caching(store, PRICES)
    return store


def session_cost(store, result, purpose: str | None = None) -> float:
    calls = [e for e in karma.read(store, result.session_id) if e.get("event") == "llm_call"
             and (purpose is None or e.get("purpose") == purpose)]
    return sum(e["cost"] for e in calls)


def run(double: LLMDouble, store, answers: list, force: bool = True):
    double.queue(*answers)
    result = wake(load_settings(), store, force=force)
    assert result.outcome == "clean" and double.pending == 0, (result, double.pending)
    return result


def scenario(name: str, tmp: str, caching: bool) -> dict[str, float]:
    with LLMDouble() as double:
        double.cache_billing = {m: p[:2] for m, p in PRICES.items()}
        double.cache_min_tokens = MIN_TOKENS
        os.environ.update(OPENROUTER_BASE_URL=double.base_url, OPENROUTER_API_KEY="sk-bench-key")
        store = fresh_store(tmp, f"{name}-{caching}", caching)
        try:
            if name == "agent":
                r = run(double, store, agent_answers())
                return {"session": session_cost(store, r), "step": session_cost(store, r, "agent")}
            inbox.post(store, MESSAGE)
            r = run(double, store, demo_answers())
            out = {"session": session_cost(store, r)}
            if name == "urgent":
                double.advance(60)  # the operator answers a minute later, urgently: the agent wakes at once
                inbox.post(store, "Thanks. Anything else I should know?", urgent=True)
                r2 = run(double, store, demo_answers(), force=False)
                out = {"session": out["session"] + session_cost(store, r2),
                       "second orient": session_cost(store, r2, "orient")}
            return out
        finally:
            store.close()


def main() -> int:
    os.environ.update(BRAINSTEM_MAX_SESSION_COST="1", BRAINSTEM_MAX_DAILY_COST="100")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, label in (("demo", "demo-like session"), ("agent", f"agent step, {ROUNDS} tool rounds"),
                            ("urgent", "two sessions, an urgent message apart")):
            plain, cached = scenario(name, tmp, False), scenario(name, tmp, True)
            for part in plain:
                rows.append((f"{label}: {part}" if part != "session" else label, plain[part], cached[part]))
    print(f"{'scenario':52s} {'no cache ($)':>12s} {'cached ($)':>11s} {'ratio':>6s}")
    for label, plain, cached in rows:
        print(f"{label:52s} {plain:12.6f} {cached:11.6f} {cached / plain:6.2f}")
    step = next(cached / plain for label, plain, cached in rows if label.endswith(": step"))
    ok = step <= 0.5
    print(f"agent step with caching / without: {step:.2f}  target <= 0.50  {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
