"""One run of a schedule (:mod:`brainstem.session.schedule_action`): the tool under the operator's policy (its
mode, the floors, the review inbox), both spend ceilings, ``synthesize`` as exactly one LLM call, and the
message to the inbox or the operator's Telegram chat, a failure to send it recorded.

In-process against real stores (Redis and SQLite, seeded), the tool a real agent tool in the sandbox, the
LLM the loopback OpenAI-compatible double, Telegram the loopback Bot API double.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.session.schedule_run import run_due
from brainstem.state import inbox, refusals, review
from brainstem.state.budget import today
from brainstem.state.schedules import load
from brainstem.store import karma
from tests.doubles import TelegramDouble
from tests.helpers import free_port, ok, run_cli
from tests.session.conftest import put_schedule
from tests.wake_helpers import event_names, events_of, llm_calls, user_text

TOKEN = "7741852963:AAH-tg_Schedule-token-0123456789abcdef"
CHAT = 424242


def one_run(st, settings):
    [result] = run_due(settings, st)
    entries = karma.read(st, result.run_id)
    assert entries[-1]["event"] == "schedule_run" and entries[-1]["outcome"] == result.outcome
    return result, entries


# --- modes ----------------------------------------------------------------------------------------------------

def test_a_manual_tool_is_refused_and_never_runs(st, configure, hello):
    hello(mode="manual")
    put_schedule(st, "tick")
    result, entries = one_run(st, configure())
    assert result.outcome == "refused" and "manual" in result.reason
    assert event_names(entries) == ["tool_would_do", "schedule_run"]
    assert hello.runs() == 0 and load(st, "tick").last_outcome == "refused"


def test_the_operators_floor_makes_a_tool_manual_for_schedules_too(st, configure, hello):
    put_schedule(st, "tick")
    result, entries = one_run(st, configure(tool_modes="hello=manual"))
    assert result.outcome == "refused" and events_of(entries, "tool_would_do")[0]["mode_floor"] == "manual"
    assert hello.runs() == 0


def test_a_supervised_tool_runs_and_waits_for_review_as_a_sessions_run_would(st, configure, hello):
    hello(mode="supervised")
    put_schedule(st, "tick")
    result, entries = one_run(st, configure())
    assert result.outcome == "ok" and hello.runs() == 1
    [item] = review.items(st)
    assert (item["tool"], item["session_id"], item["input"]) == ("hello", result.run_id, {"who": "bob"})
    assert item["result"]["hi"] == "bob"
    assert events_of(entries, "review_queued")[0]["review_id"] == item["id"]


def test_a_tool_that_fails_fails_the_run_and_says_why(st, configure, hello):
    put_schedule(st, "tick", input={"fail": True}, notify="inbox")
    result, entries = one_run(st, configure())
    assert result.outcome == "failed" and "the feed is down" in result.reason
    assert load(st, "tick").last_outcome == "failed"
    [message] = inbox.messages(st)
    assert "failed" in message["text"] and "the feed is down" in message["text"]


def test_while_the_agents_code_is_held_nothing_runs(st, configure, hello):
    refusals.note(st, "snoop")
    put_schedule(st, "tick")
    result, entries = one_run(st, configure())
    assert result.outcome == "refused" and result.reason == refusals.HELD_MESSAGE
    assert hello.runs() == 0 and event_names(entries) == ["schedule_run"]


# --- ceilings -------------------------------------------------------------------------------------------------

def test_todays_ceiling_reached_refuses_the_run_before_anything_is_spent(st, configure, hello, llm):
    st.put(keys.DAILY_COST, {"date": today(), "usd": 2.0})
    put_schedule(st, "tick", synthesize="Say it in a line.", notify="inbox")
    result, entries = one_run(st, configure(max_daily_cost=2.0))
    assert result.outcome == "refused" and "BRAINSTEM_MAX_DAILY_COST" in result.reason
    assert events_of(entries, "budget_exceeded")[0]["limit"] == "daily"
    assert llm.requests == [] and hello.runs() == 0 and result.cost == 0
    assert inbox.messages(st) == []
    assert st.get_json(keys.DAILY_COST)["usd"] == 2.0


def test_a_summary_that_could_pass_the_per_run_ceiling_is_never_asked_for(st, configure, hello, llm):
    put_schedule(st, "tick", synthesize="Say it in a line.", notify="inbox")
    result, entries = one_run(st, configure(max_session_cost=0.0000001))
    assert result.outcome == "refused" and "BRAINSTEM_MAX_SESSION_COST" in result.reason
    assert events_of(entries, "budget_exceeded") and llm.requests == []
    assert result.cost == 0 and entries[-1]["cost"] == 0 and inbox.messages(st) == []


# --- synthesize -----------------------------------------------------------------------------------------------

def test_synthesize_is_exactly_one_llm_call_and_its_cost_is_the_runs(st, configure, hello, llm):
    llm.queue({"content": "ETH at 3120.5, steady.", "cost": 0.0012})
    put_schedule(st, "tick", synthesize="Summarise the price for me in one line.", notify="inbox")
    result, entries = one_run(st, configure())
    assert result.outcome == "ok"
    [request] = llm.requests
    prompt = user_text(request)
    assert prompt.startswith("Summarise the price for me in one line.")
    assert "UNTRUSTED CONTENT" in prompt and "3120.5" in prompt  # the result, as untrusted text
    assert request["messages"][0]["role"] == "system"  # the soul
    [call] = llm_calls(entries)
    assert call["purpose"] == "synthesize" and call["cost"] == 0.0012
    assert result.cost == entries[-1]["cost"] == 0.0012
    assert entries[-1]["message"] == "ETH at 3120.5, steady."
    assert [m["text"] for m in inbox.messages(st)] == ["ETH at 3120.5, steady."]


def test_a_summary_that_fails_sends_the_result_as_it_is_and_says_so(st, configure, hello, llm):
    llm.queue({"status": 500})
    put_schedule(st, "tick", synthesize="Summarise.", notify="inbox")
    result, entries = one_run(st, configure(llm_max_attempts=1))
    assert result.outcome == "ok" and "synthesize failed" in result.notify_error
    assert len(llm.requests) == 1
    [message] = inbox.messages(st)
    assert "3120.5" in message["text"]


def test_no_summary_is_asked_for_while_the_402_breaker_is_open(st, configure, hello, llm):
    st.put(keys.LLM_CREDIT, {"breaker": {"opened_at": "2026-05-10T09:00:00Z", "trips": 1,
                                         "probe_after": "2999-01-01T00:00:00Z"}})
    put_schedule(st, "tick", synthesize="Summarise.", notify="inbox")
    result, entries = one_run(st, configure())
    assert result.outcome == "ok" and "402" in result.notify_error and llm.requests == []
    [message] = inbox.messages(st)
    assert "3120.5" in message["text"]


# --- notify ---------------------------------------------------------------------------------------------------

def test_notify_inbox_leaves_the_message_in_brainstem_inbox(st, configure, hello, real_store_url):
    put_schedule(st, "tick", notify="inbox")
    result, entries = one_run(st, configure())
    assert result.notified.startswith("inbox:") and entries[-1]["notified"] == result.notified
    shown = ok(run_cli("inbox", env={"BRAINSTEM_KV": real_store_url}))
    assert "agent" in shown and "schedule tick: hello" in shown
    listed = [json.loads(line) for line in ok(run_cli("inbox", "--json",
                                                      env={"BRAINSTEM_KV": real_store_url})).splitlines()]
    assert [(m["from"], m["via"], m["schedule"], m["run"]) for m in listed] == [
        ("agent", "schedule", "tick", result.run_id)]
    # for the operator: the agent wrote it, so no session is shown it as a message
    assert inbox.unread(st) == [] and inbox.for_session(st) == ([], 0)


@pytest.fixture
def tg():
    with TelegramDouble(token=TOKEN, max_hold=0.1) as d:
        yield d


def telegram(configure, api_url: str, token: str = TOKEN):
    return configure(brainstem_telegram_bot_token=token, brainstem_telegram_chat_id=str(CHAT),
                     brainstem_telegram_api_url=api_url)


def test_notify_telegram_sends_to_the_operators_chat(st, configure, hello, tg):
    put_schedule(st, "tick", notify="telegram")
    result, entries = one_run(st, telegram(configure, tg.base_url))
    assert result.outcome == "ok" and result.notify_error is None
    assert tg.sent == [{"chat_id": str(CHAT), "text": entries[-1]["message"]}]
    [sent] = events_of(entries, "telegram_sent")
    assert result.notified == f"telegram:{sent['message_id']}"
    assert TOKEN not in json.dumps(entries)


@pytest.mark.parametrize("where", ["refused", "down", "unset"])
def test_a_message_not_sent_is_recorded_and_the_outcome_stays_the_tools(st, configure, hello, tg, where):
    put_schedule(st, "tick", notify="telegram")
    if where == "refused":  # Telegram refuses the token
        settings = telegram(configure, tg.base_url, token="1111111111:AAH-wrong-token-0123456789abcdefgh")
    elif where == "down":
        settings = telegram(configure, f"http://127.0.0.1:{free_port()}")
    else:
        settings = configure()
    result, entries = one_run(st, settings)
    assert result.outcome == "ok" and load(st, "tick").last_outcome == "ok"
    assert result.notify_error.startswith("telegram: not sent") and result.notified is None
    assert entries[-1]["notify_error"] == result.notify_error
    if where != "unset":
        assert events_of(entries, "telegram_sent")[0]["error"]
    assert tg.sent == []
