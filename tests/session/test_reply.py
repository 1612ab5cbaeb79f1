"""The ``reply`` plan step: an answer to an inbox message, kept with it, sent to Telegram for a message that
came from there, and neither kept nor sent by a dry run or a replay.

Each session is a real ``brainstem wake`` (in this process) against a real store and the loopback LLM
double; Telegram is the Bot API double, so the runtime's own sending path runs.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from brainstem.core.plan import ReplyStep, parse_plan
from brainstem.core.settings import load_settings
from brainstem.session import replay
from brainstem.session.replay_report import compare
from brainstem.session.reply import ReplyRefused, run_reply
from brainstem.state import inbox, refusals
from brainstem.state.budget import Budget
from brainstem.store.karma import Karma, Redactor
from brainstem.tools.operator_chat import NOT_CONFIGURED
from brainstem.tools.policy import ToolPolicy
from tests.doubles import TelegramDouble
from tests.wake_helpers import (
    API_KEY,
    events_of,
    finished,
    is_orient,
    is_reflect,
    last_session,
    llm_calls,
    plan,
    reflection,
    run_wake,
    think,
    wake_env,
)

TOKEN = "5550001111:AAH-reply-token-0123456789abcdefXYZ"
OWNER = 424242
ANSWER = "Your wisdom says: spend little."


def reply(to, text, **fields) -> dict:
    return {"type": "reply", "to": to, "text": text, **fields}


def model(llm, *steps: dict) -> None:
    """Orient plans ``steps``; a think answers :data:`ANSWER`; reflection answers."""
    def respond(req):
        if is_orient(req):
            return plan(*steps)
        if is_reflect(req):
            return reflection("answered the operator")
        return ANSWER
    llm.responder = respond


def telegram_env(url: str, llm, tg: TelegramDouble) -> dict:
    return wake_env(url, llm, BRAINSTEM_TELEGRAM_BOT_TOKEN=tg.token, BRAINSTEM_TELEGRAM_CHAT_ID=OWNER,
                    BRAINSTEM_TELEGRAM_API_URL=tg.base_url)


def from_telegram(store, text: str = "what is your wisdom?") -> dict:
    """A message as the Telegram poller leaves one: with the update's and the message's ids."""
    return inbox.post(store, text, sender="telegram", extra={"telegram_update_id": 700_001,
                                                             "telegram_message_id": 77})


def step(entries: list[dict], sid: str) -> dict:
    return next(e for e in entries if e["event"] in ("step_complete", "step_failed") and e.get("step_id") == sid)


def test_the_step_parses_with_its_fields_checked_when_it_runs():
    p = parse_plan(json.dumps({"steps": [reply(3, "hi"), {"type": "reply"}, reply("{{msg}}", "{{answer}}")]}))
    assert all(isinstance(s, ReplyStep) for s in p.steps)
    assert (p.steps[0].to, p.steps[0].text) == (3, "hi")
    assert (p.steps[1].to, p.steps[1].text) == (None, None)  # fails its step, not the whole plan


def test_a_reply_is_kept_with_its_message_and_costs_no_model_call(st, real_store_url, llm):
    asked = inbox.post(st, "What is in your wisdom?", extra={"via": "tell"})
    model(llm, think("Find the answer", id="t", store_result_as="answer"),
          reply(asked["id"], "{{answer}}", id="r1"), reply(str(asked["id"]), "And I will keep it short.", id="r2"))
    sid, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st, "clean")

    assert [c["purpose"] for c in llm_calls(entries)] == ["orient", "think", "reflect"]  # none for the replies
    assert step(entries, "r1")["result"] == {"replied_to": asked["id"], "text": ANSWER}
    assert step(entries, "r2")["result"] == {"replied_to": asked["id"], "text": "And I will keep it short."}
    first, second = events_of(entries, "inbox_reply")
    assert {k: first[k] for k in ("step_id", "to", "from", "text", "performed", "to_telegram", "telegram_sent")} == {
        "step_id": "r1", "to": asked["id"], "from": "operator", "text": ANSWER, "performed": True,
        "to_telegram": False, "telegram_sent": None}
    assert second["step_id"] == "r2" and not events_of(entries, "telegram_sent")

    (msg,) = inbox.messages(st)
    assert [(r["text"], r["session_id"], r["step_id"]) for r in msg["replies"]] == [
        (ANSWER, sid, "r1"), ("And I will keep it short.", sid, "r2")]
    assert all(r["at"] >= msg["at"] for r in msg["replies"])


@pytest.mark.parametrize("to, text, reason", [
    (999, "hello", "there is no message 999 in the inbox"),
    ("notice", "hello", "`to` must be the id of an inbox message"),
    (True, "hello", "`to` must be the id of an inbox message"),
    (None, "hello", "`to` must be the id of an inbox message"),
    ("agent", "hello", "is the agent's own"),
    ("asked", "   ", "the reply is empty"),
    ("asked", None, "the reply is empty"),
])
def test_a_reply_that_cannot_be_made_fails_its_step_with_the_reason(st, real_store_url, llm, to, text, reason):
    asked = inbox.post(st, "a question")
    notice = inbox.post(st, "schedule x: ok", sender="agent")
    to = {"asked": asked["id"], "agent": notice["id"]}.get(to, to) if isinstance(to, str) else to
    model(llm, reply(to, text, id="r"), think("and go on", id="after"))
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st, "clean")
    failed = step(entries, "r")
    assert failed["event"] == "step_failed" and failed["error"].startswith("reply: ") and reason in failed["error"]
    assert not events_of(entries, "retry_failed")  # asking again cannot make the message exist
    assert step(entries, "after")["event"] == "step_complete"  # the session goes on
    assert not events_of(entries, "inbox_reply")
    assert all(m["replies"] == [] for m in inbox.messages(st))


def test_a_reply_to_a_telegram_message_is_sent_to_the_operators_chat_as_its_answer(st, real_store_url, llm):
    asked = from_telegram(st)
    with TelegramDouble(token=TOKEN) as tg:
        model(llm, reply(asked["id"], ANSWER, id="r"))
        sid, entries = finished(run_wake(telegram_env(real_store_url, llm, tg), "--force"), st, "clean")
        assert tg.sent == [{"chat_id": str(OWNER), "text": ANSWER, "reply_to": 77}]
        assert all(TOKEN not in json.dumps(e) for e in entries)
    (sent,) = events_of(entries, "telegram_sent")
    assert sent["tool"] == "reply" and sent["message_id"] == 1001
    (replied,) = events_of(entries, "inbox_reply")
    assert replied["telegram_sent"] is True and replied["telegram_message_id"] == 1001 and replied["to_telegram"]
    (kept,) = inbox.messages(st)[0]["replies"]
    assert (kept["text"], kept["telegram_sent"], kept["telegram_message_id"], kept["session_id"]) == (
        ANSWER, True, 1001, sid)


def test_a_failed_send_is_recorded_and_the_reply_kept(st, real_store_url, llm):
    asked = from_telegram(st)
    with TelegramDouble(token=TOKEN) as tg:
        tg.fail_sends({"status": 502})
        model(llm, reply(asked["id"], ANSWER, id="r"), think("then this", id="after"))
        _, entries = finished(run_wake(telegram_env(real_store_url, llm, tg), "--force"), st, "clean")
        assert tg.sent == []
    assert step(entries, "r")["event"] == "step_complete" and step(entries, "after")["event"] == "step_complete"
    (replied,) = events_of(entries, "inbox_reply")
    assert replied["telegram_sent"] is False and "HTTP 502" in replied["telegram_error"]
    (kept,) = inbox.messages(st)[0]["replies"]
    assert kept["telegram_sent"] is False and kept["telegram_error"] == replied["telegram_error"]


def test_without_telegram_set_up_the_reply_is_kept_and_says_it_was_not_sent(st, real_store_url, llm):
    asked = from_telegram(st)
    model(llm, reply(asked["id"], ANSWER, id="r"))
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st, "clean")
    (kept,) = inbox.messages(st)[0]["replies"]
    assert kept["telegram_sent"] is False and kept["telegram_error"] == NOT_CONFIGURED
    assert events_of(entries, "inbox_reply")[0]["telegram_error"] == NOT_CONFIGURED


def test_a_dry_run_records_what_it_would_reply_and_replies_nothing(st, real_store_url, llm):
    asked = from_telegram(st)
    with TelegramDouble(token=TOKEN) as tg:
        model(llm, reply(asked["id"], ANSWER, id="r"))
        r = run_wake(telegram_env(real_store_url, llm, tg), "--dry-run")
        assert r.returncode == 0, r.stderr
        assert tg.sent == [] and not [q for q in tg.requests if q["method"] == "sendMessage"]
    sid, entries = last_session(st)
    assert entries[0].get("dry_run") is True
    (would,) = events_of(entries, "inbox_reply")
    assert (would["performed"], would["mode"], would["to_telegram"], would["text"]) == (False, "dry_run", True, ANSWER)
    assert step(entries, "r")["result"] == {"replied_to": asked["id"], "text": ANSWER}
    assert inbox.messages(st)[0]["replies"] == []


def test_a_replay_performs_no_reply_and_its_step_behaves_the_same(st, real_store_url, llm):
    asked = from_telegram(st)
    with TelegramDouble(token=TOKEN) as tg:
        env = telegram_env(real_store_url, llm, tg)
        model(llm, think("Find the answer", id="t", store_result_as="answer"), reply(asked["id"], "{{answer}}", id="r"))
        sid, _ = finished(run_wake(env, "--force"), st, "clean")
        assert len(tg.sent) == 1
        settings = load_settings(kv=real_store_url, openrouter_base_url=llm.base_url, openrouter_api_key=API_KEY,
                                 brainstem_telegram_bot_token=TOKEN, brainstem_telegram_chat_id=str(OWNER),
                                 brainstem_telegram_api_url=tg.base_url)
        replayed = replay.rerun(settings, st, replay.load(st, sid))
        assert len(tg.sent) == 1  # nothing more reached Telegram
    report = compare(replayed)
    (row,) = [r for r in report["steps"] if r["id"] == "r"]
    assert row["same"] and row["now"]["result"] == {"replied_to": asked["id"], "text": ANSWER}
    (again,) = events_of(replayed.entries, "inbox_reply")
    assert (again["performed"], again["mode"], again["telegram_sent"]) == (False, "replay", True)  # as recorded
    (sent,) = events_of(replayed.entries, "telegram_sent")
    assert sent["replayed"] is True
    assert len(inbox.messages(st)[0]["replies"]) == 1  # the live session's, and no other
    # Replayed where Telegram is not set up, the send is still answered as it was.
    unset = load_settings(kv=real_store_url, openrouter_base_url=llm.base_url, openrouter_api_key=API_KEY)
    again = events_of(replay.rerun(unset, st, replay.load(st, sid)).entries, "inbox_reply")
    assert [(e["telegram_sent"], e.get("telegram_message_id")) for e in again] == [
        (True, events_of(replayed.entries, "inbox_reply")[0]["telegram_message_id"])]


def test_a_reply_that_was_not_configured_replays_not_configured(st, real_store_url, llm):
    asked = from_telegram(st)
    model(llm, reply(asked["id"], ANSWER, id="r"))
    sid, _ = finished(run_wake(wake_env(real_store_url, llm), "--force"), st, "clean")
    unset = load_settings(kv=real_store_url, openrouter_base_url=llm.base_url, openrouter_api_key=API_KEY)
    (again,) = events_of(replay.rerun(unset, st, replay.load(st, sid)).entries, "inbox_reply")
    assert (again["telegram_sent"], again["telegram_error"]) == (False, NOT_CONFIGURED)


def test_no_secret_the_session_knows_reaches_a_reply(sqlite_store):
    """Whatever the plan's variables held, the text is redacted before it is kept or sent."""
    asked = inbox.post(sqlite_store, "what is the key?")
    karma = Karma(sqlite_store, "1-abcdef", Redactor({"OPENROUTER_API_KEY": "sk-or-v1-0123456789abcdef"}))
    deps = SimpleNamespace(store=sqlite_store, karma=karma, mode="live", id="1-abcdef",
                           budget=Budget(max_cost=1.0, max_steps=5, max_duration=60))
    out = run_reply(SimpleNamespace(deps=deps, tool_policy=ToolPolicy()), "r", asked["id"],
                    "it is sk-or-v1-0123456789abcdef")
    assert out["text"] == "it is [REDACTED:OPENROUTER_API_KEY]"
    assert inbox.messages(sqlite_store)[0]["replies"][0]["text"] == "it is [REDACTED:OPENROUTER_API_KEY]"
    assert "0123456789abcdef" not in json.dumps(sqlite_store.read_log(karma.key))


KEY = "sk-or-v1-0123456789abcdef"


def _direct(store, mode: str = "live"):
    """A reply step's session, by hand: karma redacts KEY and the policy knows it, as a wake's do."""
    karma = Karma(store, "1-abcdef", Redactor({"OPENROUTER_API_KEY": KEY}))
    deps = SimpleNamespace(store=store, karma=karma, mode=mode, id="1-abcdef",
                           budget=Budget(max_cost=1.0, max_steps=5, max_duration=60))
    policy = ToolPolicy(known_secrets={"OPENROUTER_API_KEY": KEY})
    return SimpleNamespace(deps=deps, tool_policy=policy), karma, policy


@pytest.mark.parametrize("mode", ["live", "dry_run", "replay"])
@pytest.mark.parametrize("where", ["text", "to", "nested"])
def test_any_run_of_a_secret_in_a_reply_stops_it_before_anything_is_kept(sqlite_store, mode, where):
    """Any 8 characters of a secret, anywhere in what the plan's variables made of ``to`` or the text, in
    every mode: a ``secret_refused`` stop that holds the agent; no reply kept, no ``inbox_reply``, and
    neither the piece nor a redaction mark in karma or the error."""
    asked = inbox.post(sqlite_store, "what is the key?")
    session, karma, policy = _direct(sqlite_store, mode)
    piece = KEY[5:13]
    to, text = {"text": (asked["id"], f"it ends {piece}"), "to": (f"{piece}", "hello"),
                "nested": (asked["id"], {"a": [f"x{piece}y"]})}[where]
    with pytest.raises(ReplyRefused) as refused:
        run_reply(session, "r", to, text)
    assert "secret_refused" in str(refused.value) and piece not in str(refused.value)
    entries = [json.loads(e) for e in sqlite_store.read_log(karma.key)]
    (stop,) = [e for e in entries if e["event"] == "secret_refused"]
    assert stop["source"] == "reply" and stop["secrets"] == ["OPENROUTER_API_KEY"] and stop["step_id"] == "r"
    assert not [e for e in entries if e["event"] == "inbox_reply"]
    assert piece not in json.dumps(entries) and "REDACTED" not in json.dumps(entries)
    assert inbox.messages(sqlite_store)[0]["replies"] == []
    assert refusals.held(sqlite_store) and policy.withdrawn


@pytest.mark.parametrize("to", ["guess-sk-or-v1", "0123abc", "x" * 60, 1.5, [1], {"id": 1}, -3, False])
def test_a_to_that_is_not_an_id_is_refused_without_being_quoted(sqlite_store, to):
    inbox.post(sqlite_store, "a question")
    session, karma, _ = _direct(sqlite_store)
    with pytest.raises(ReplyRefused) as refused:
        run_reply(session, "r", to, "hello")
    said = str(refused.value)
    assert "`to` must be the id of an inbox message" in said
    assert repr(to) not in said and str(to) not in said
