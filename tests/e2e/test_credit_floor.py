"""The LLM balance as a floor and the breaker after a 402, black box: ``brainstem wake`` against the LLM
double (its ``/key`` answers as OpenRouter's does) and a real store. What counts is what the double
received: no chat request at all while the money is not there."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso
from brainstem.state import inbox
from tests.doubles import TelegramDouble
from tests.helpers import run_cli
from tests.wake_helpers import answers, events_of, finished, in_future, plan, reflection, run_wake, think, wake_env

OUT_OF_CREDIT = {"status": 402, "message": "Insufficient credits"}
TOKEN = "7741852963:AAH-tg_floor-token-0123456789abcdefXYZ"


def chats(llm) -> list:
    """The chat/completions requests the double received (POSTs: every paid call)."""
    return llm.requests


def key_reads(llm) -> int:
    return sum(1 for path, _ in llm.get_requests if path.endswith("/key"))


def runtime_notices(store) -> list[dict]:
    return [m for m in inbox.messages(store) if m.get("from") == "runtime"]


def status_json(env: dict) -> dict:
    r = run_cli("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_below_the_floor_no_chat_request_is_made_and_the_operator_is_told_once(st, real_store_url, llm):
    llm.credit = 0.75  # OpenRouter's /key: limit_remaining
    env = wake_env(real_store_url, llm, BRAINSTEM_MIN_CREDIT="1.5")
    llm.responder = answers()
    _, first = finished(run_wake(env, "--force"), st, "llm_no_credit")
    _, second = finished(run_wake(env, "--force"), st, "llm_no_credit")

    assert chats(llm) == []  # not orient, not anything: the double never saw a chat request
    assert key_reads(llm) == 2  # one free read a wake
    for entries in (first, second):
        (held,) = events_of(entries, "credit_floor")
        assert held["cause"] == "floor" and held["credit"] == 0.75 and held["min_credit"] == 1.5
        assert not events_of(entries, "ground_truth")  # not even the agent's balance checkers ran
        assert "BRAINSTEM_MIN_CREDIT" in entries[-1]["reason"] and entries[-1]["operator_action"]
    (told,) = runtime_notices(st)  # two wakes, one notice
    assert "BRAINSTEM_MIN_CREDIT" in told["text"] and "$0.7500" in told["text"]
    assert len(events_of(first, "operator_notice")) == 1 and not events_of(second, "operator_notice")
    # The fault backoff, growing: never a wake every tick.
    wc = st.get_json(keys.WAKE_CONFIG)
    assert wc["retry_after_fault"] == "llm_no_credit" and wc["sleep_seconds"] == 120
    assert in_future(wc["next_wake_after"], 100)
    report = status_json(env)
    assert report["llm_credit"] == 0.75 and report["runway_days"] is None  # nothing spent: no mean to divide by

    # Credit added: the next wake reads it and goes on, and a later shortfall is told again.
    llm.credit = 9.0
    llm.queue(plan(think("hi")), "ok", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert len(chats(llm)) == 3
    llm.credit = 0.5
    finished(run_wake(env, "--force"), st, "llm_no_credit")
    assert len(runtime_notices(st)) == 2 and len(chats(llm)) == 3


def test_an_unreadable_balance_holds_nothing_back(st, real_store_url, llm):
    llm.key_status = llm.credits_status = 500
    env = wake_env(real_store_url, llm, BRAINSTEM_MIN_CREDIT="1.5")
    llm.queue(plan(think("hi")), "ok", reflection())
    _, entries = finished(run_wake(env, "--force"), st, "clean")
    assert len(chats(llm)) == 3 and not events_of(entries, "credit_floor")
    (gt,) = events_of(entries, "ground_truth")
    assert gt["balances"]["openrouter"] is None and "/key: HTTP 500" in gt["errors"]["openrouter"]


def test_after_a_402_no_chat_request_is_made_until_a_free_read_shows_credit(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)  # no floor: the breaker alone
    llm.responder = lambda req: OUT_OF_CREDIT
    _, tripped = finished(run_wake(env, "--force"), st, "llm_no_credit")
    assert len(chats(llm)) == 1
    (opened,) = events_of(tripped, "credit_breaker")
    assert opened["state"] == "open" and opened["credit"] == llm.credit  # the balance the 402 came with

    llm.responder = answers()
    _, held = finished(run_wake(env, "--force"), st, "llm_no_credit")
    _, again = finished(run_wake(env, "--force"), st, "llm_no_credit")
    assert len(chats(llm)) == 1  # the same /key answer shows no new credit: no paid call
    assert [e["cause"] for e in events_of(held + again, "credit_floor")] == ["breaker", "breaker"]
    assert len(runtime_notices(st)) == 1  # told at the 402, not at each wake after it
    assert "402" in runtime_notices(st)[0]["text"]

    llm.credit += 20  # the operator added credit
    llm.queue(plan(think("hi")), "ok", reflection())
    _, back = finished(run_wake(env, "--force"), st, "clean")
    assert [e["state"] for e in events_of(back, "credit_breaker")] == ["closed"]
    assert len(chats(llm)) == 4
    assert "breaker" not in st.get_json(keys.LLM_CREDIT)


def test_after_a_402_on_a_server_without_a_balance_the_backoff_alone_lets_one_try(st, real_store_url, llm):
    # BRAINSTEM_LLM_BASE_URL names a generic server: it is never asked for a balance.
    env = {k: v for k, v in wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1).items()
           if not k.startswith("OPENROUTER_")}
    env.update(BRAINSTEM_LLM_BASE_URL=llm.base_url, BRAINSTEM_LLM_API_KEY="sk-generic", BRAINSTEM_MIN_CREDIT="5")
    llm.responder = lambda req: OUT_OF_CREDIT
    finished(run_wake(env, "--force"), st, "llm_no_credit")
    llm.responder = answers()
    _, held = finished(run_wake(env, "--force"), st, "llm_no_credit")
    assert len(chats(llm)) == 1 and key_reads(llm) == 0
    assert "balance read shows credit again or" in held[-1]["reason"]

    state = st.get_json(keys.LLM_CREDIT)  # the backoff has passed (moved back, as an hour's wait would)
    state["breaker"]["probe_after"] = iso(datetime.now(timezone.utc) - timedelta(seconds=1))
    st.put(keys.LLM_CREDIT, state)
    llm.responder = lambda req: OUT_OF_CREDIT
    _, probe = finished(run_wake(env, "--force"), st, "llm_no_credit")
    assert len(chats(llm)) == 2  # one paid try, and its 402 opens the breaker again, for longer
    assert [e["state"] for e in events_of(probe, "credit_breaker")] == ["probe", "open"]
    breaker = st.get_json(keys.LLM_CREDIT)["breaker"]
    assert breaker["trips"] == 2 and in_future(breaker["probe_after"], 100)
    assert len(runtime_notices(st)) == 1


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_the_operator_is_told_once_on_telegram_too(st, real_store_url, llm):
    llm.credit = 0.1
    with TelegramDouble(token=TOKEN, max_hold=0.1) as tg:
        env = wake_env(real_store_url, llm, BRAINSTEM_MIN_CREDIT="1", BRAINSTEM_TELEGRAM_BOT_TOKEN=TOKEN,
                       BRAINSTEM_TELEGRAM_CHAT_ID="424242", BRAINSTEM_TELEGRAM_API_URL=tg.base_url)
        _, first = finished(run_wake(env, "--force"), st, "llm_no_credit")
        finished(run_wake(env, "--force"), st, "llm_no_credit")
        assert [m["text"] for m in tg.sent] == [runtime_notices(st)[0]["text"]]
    (sent,) = events_of(first, "telegram_sent")
    assert sent["tool"] == "runtime" and sent["message_id"]
    assert chats(llm) == []
