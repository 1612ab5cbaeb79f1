"""Talking with the agent, end to end: a question over Telegram, an urgent wake, an agent step, an answer;
and a reply step's answer, on Telegram, in ``brainstem inbox`` and on the dashboard.

Everything real but the two remote services: ``brainstem run`` as a process,
the store on disk, the sandbox, the Bot API double (on 127.0.0.2, a host of
its own) and the OpenAI-compatible double, which answers as a model that
calls tools would.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.daemon.telegram import poll_once
from brainstem.state import inbox
from brainstem.tools.bot_api import ClientConfig
from tests.dashboard_client import app_for, client, dashboard_settings
from tests.doubles import LLMDouble, TelegramDouble
from tests.helpers import clean_env, ok, run_cli, wait_for
from tests.wake_helpers import (
    API_KEY,
    events_of,
    is_orient,
    is_reflect,
    iso_in,
    last_session,
    llm_calls,
    plan,
    reflection,
    run_wake,
    seeded,
    user_text,
    wake_env,
)

TOKEN = "7741852963:AAH-e2e-token-0123456789abcdefXYZ"
OWNER = 515151
QUESTION = "what is your wisdom?"


def model(req: dict):
    """A model that plans one agent step for the operator's question, then reads and answers with tools."""
    if is_reflect(req):
        return reflection("answered the operator on Telegram")
    if is_orient(req):
        return plan({"id": "reply", "type": "agent", "tools": ["kv_read", "send_telegram"], "max_turns": 4,
                     "prompt": "The operator asked on Telegram: what is your wisdom? Look it up and answer them.",
                     "store_result_as": "reply"})
    answered = [m for m in req["messages"] if m.get("role") == "tool"]
    if not answered:
        return {"tool_calls": [{"id": "read", "name": "kv_read", "arguments": {"key": "wisdom"}}]}
    if len(answered) == 1:
        wisdom = json.loads(answered[0]["content"].split("\n", 1)[1].rsplit("\n", 1)[0])["value"]
        return {"tool_calls": [{"id": "send", "name": "send_telegram", "arguments": {"text": f"My wisdom: {wisdom}"}}]}
    return "I told the operator my wisdom."


@pytest.mark.slow
def test_the_operator_asks_over_telegram_and_the_agent_answers_after_using_two_tools(tmp_path, daemons):
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = seeded(url)
    store.put(keys.WISDOM, "Spend little, say what you did.")
    with TelegramDouble(token=TOKEN, host="127.0.0.2", max_hold=0.3) as tg, LLMDouble() as llm:
        llm.responder = model
        env = {"BRAINSTEM_KV": url, "OPENROUTER_BASE_URL": llm.base_url, "OPENROUTER_API_KEY": API_KEY,
               "BRAINSTEM_LLM_BACKOFF": "0.01", "BRAINSTEM_TELEGRAM_BOT_TOKEN": TOKEN,
               "BRAINSTEM_TELEGRAM_CHAT_ID": str(OWNER), "BRAINSTEM_TELEGRAM_API_URL": tg.base_url,
               "BRAINSTEM_FETCH_ALLOW": "127.0.0.0/8"}
        # The agent is asleep for an hour: only the urgent message can wake it.
        store.put(keys.WAKE_CONFIG, {"next_wake_after": iso_in(3600)})
        d = daemons(clean_env(env), "--every", "1h")
        wait_for(lambda: "telegram: polling" in d.stderr, 30, "the daemon to poll Telegram", d)
        assert not llm.requests  # asleep: nobody asked the model anything
        tg.text(OWNER, "!" + QUESTION)
        wait_for(lambda: tg.sent, 60, "the agent's answer on Telegram", d)
        wait_for(lambda: store.get(keys.SESSION_CURRENT) is None and store.log_length(keys.SESSION_HISTORY), 60,
                 "the session to end", d)
        rc, _ = d.stop()
        assert rc == 0, d.stderr

    assert tg.sent == [{"chat_id": str(OWNER), "text": "My wisdom: Spend little, say what you did."}]
    sid, entries = last_session(store)
    assert entries[0]["woke_for"] == "urgent_inbox"
    # Orient saw the question, from Telegram; the session read it.
    orient = [r for r in llm.requests if is_orient(r)][0]
    assert QUESTION in user_text(orient) and "Telegram" in user_text(orient)
    assert [m["read"] for m in inbox.messages(store)] == [True]
    # The agent step: three turns, two tools, each run recorded with the step id.
    assert len(llm_calls(entries, "agent")) == 3
    runs = [(e["tool"], e["ok"]) for e in events_of(entries, "tool_complete") if e.get("step_id") == "reply"]
    assert runs == [("kv_read", True), ("send_telegram", True)]
    done = [e for e in events_of(entries, "step_complete") if e.get("step_id") == "reply"]
    assert done and done[0]["result"] == "I told the operator my wisdom."
    assert entries[-1]["outcome"] == "clean"
    store.close()


def test_a_reply_step_answers_a_telegram_question_there_and_in_every_listing(tmp_path, monkeypatch):
    """The poller brings the operator's question in; the session finds the answer with a think and answers with
    a reply step: the answer reaches the operator's chat as the answer to the question, and `brainstem inbox`,
    its --json and the dashboard's inbox show it under the question."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = seeded(url)
    with TelegramDouble(token=TOKEN, max_hold=0.1) as tg, LLMDouble() as llm:
        asked_at = tg.text(OWNER, QUESTION)
        poll_once(store, ClientConfig(api_url=tg.base_url, token=TOKEN, chat_id=str(OWNER)), timeout=0)
        (asked,) = inbox.messages(store)
        assert asked["from"] == "telegram" and asked["telegram_update_id"] == asked_at

        def respond(req):
            if is_orient(req):
                return plan({"id": "find", "type": "think", "prompt": "What is my wisdom?", "store_result_as": "w"},
                            {"id": "answer", "type": "reply", "to": asked["id"], "text": "My wisdom: {{w}}"})
            return reflection("answered the operator") if is_reflect(req) else "spend little."
        llm.responder = respond
        env = wake_env(url, llm, BRAINSTEM_TELEGRAM_BOT_TOKEN=TOKEN, BRAINSTEM_TELEGRAM_CHAT_ID=OWNER,
                       BRAINSTEM_TELEGRAM_API_URL=tg.base_url)
        ok(run_wake(env, "--force"))
        assert tg.sent == [{"chat_id": str(OWNER), "text": "My wisdom: spend little.",
                            "reply_to": asked["telegram_message_id"]}]
    sid, entries = last_session(store)
    assert [e["telegram_sent"] for e in events_of(entries, "inbox_reply")] == [True]

    listing = ok(run_cli("inbox", env={"BRAINSTEM_KV": url})).splitlines()
    assert QUESTION in listing[1] and "read" in listing[1]
    assert "-> agent's reply" in listing[2] and listing[2].endswith(", sent to Telegram: My wisdom: spend little.")
    (row,) = [json.loads(x) for x in ok(run_cli("inbox", "--json", env={"BRAINSTEM_KV": url})).splitlines()]
    (answer,) = row["replies"]
    assert (answer["text"], answer["session_id"], answer["telegram_sent"]) == ("My wisdom: spend little.", sid, True)
    assert {"at", "text"} <= set(answer)

    page = client(app_for(dashboard_settings(monkeypatch), store)).get("/inbox").text
    thread = page.split(QUESTION, 1)[1].split("</tr>", 1)[0]
    assert '<ol class="thread">' in thread and "My wisdom: spend little." in thread and "sent to Telegram" in thread
    store.close()
