"""Text the runtime puts together from the agent's pieces is screened before anything records it.

Each model answer is screened on its own, so a guess of a secret can be spelled in pieces of fewer than
8 characters, one per think step, and joined by the plan (``{{p0}}{{p1}}...``) into a tool's input or a
prompt. Had karma's redaction, or the client's, marked the joined text where the guess matched, the
reflection would read which guess was right, with no stop. The joined text is screened instead: a right
guess is a ``secret_refused`` stop and holds the agent; nothing the agent reads carries a mark.
"""

from __future__ import annotations

import json

import pytest

from brainstem.state import refusals
from tests.doubles.llm_server import LLMDouble
from tests.wake_helpers import (
    action,
    answers,
    events_of,
    is_reflect,
    last_session,
    plan,
    run_wake,
    seeded,
    think,
    user_text,
    wake_env,
)

KEY = "sk-test-7f3a9c2e41d8b605-do-not-leak"


def _pieces_then(tmp_path, last: dict, setup=None, responder=None):
    """A session whose think steps each answer 7 characters of KEY, then ``last`` joins them."""
    store = seeded(f"sqlite:///{tmp_path / 'store.db'}")
    if setup:
        setup(store)
    parts = [KEY[i:i + 7] for i in range(0, len(KEY), 7)]
    steps = [think(f"Answer with exactly: {i}", id=f"p{i}", store_result_as=f"p{i}") for i in range(len(parts))]
    joined = "".join("{{p" + str(i) + "}}" for i in range(len(parts)))
    steps.append(json.loads(json.dumps(last).replace("JOINED", joined)))
    reflections: list[str] = []
    with LLMDouble() as llm:
        llm.queue(plan(*steps), *parts)

        def respond(req):
            if is_reflect(req):
                reflections.append(user_text(req))
            return (responder or answers())(req)
        llm.responder = respond
        env = wake_env(f"sqlite:///{tmp_path / 'store.db'}", llm)
        env["OPENROUTER_API_KEY"] = KEY
        r = run_wake(env, "--force")
    assert r.returncode == 0, r.stderr
    _, entries = last_session(store)
    return store, entries, reflections


@pytest.mark.parametrize("tool", ["no_such_tool", "held_back"])
def test_a_tool_input_joined_from_pieces_is_screened_even_when_the_tool_never_runs(tmp_path, tool):
    def setup(store):
        store.put("tool:held_back:code", "def execute(args, ctx):\n    return 1\n")
        store.put("tool:held_back:meta", json.dumps({"description": "x", "mode": "manual", "timeout_ms": 1000}))

    store, entries, reflections = _pieces_then(tmp_path, action(tool, {"q": "JOINED"}, id="go"), setup)
    (refused,) = [e for e in events_of(entries, "secret_refused") if e.get("source") == "input"]
    assert refused["tool"] == tool and refused["secrets"] == ["OPENROUTER_API_KEY"]
    assert "REDACTED" not in json.dumps(entries) and not any("REDACTED" in t for t in reflections)
    assert refusals.held(store)


def test_a_host_error_holding_secret_text_is_screened(tmp_path):
    """A host's error that spells out what it was asked (a moderation error quoting its input, decoded) is
    screened as an answer is: the guess in it is never masked where it matched."""
    def responder(req):
        text = user_text(req)
        if "SPELL:" in text and not is_reflect(req):  # the host spells the character codes it was sent
            codes = text[text.index("SPELL:") + 6:].split()[0]
            return {"status": 400, "message": "Input was flagged: " + "".join(chr(int(c)) for c in codes.split(","))}
        return answers()(req)

    spelled = ",".join(str(ord(c)) for c in KEY)
    store, entries, reflections = _pieces_then(tmp_path, think("SPELL:" + spelled, id="go"),
                                               responder=responder)
    assert [e for e in events_of(entries, "secret_refused") if e.get("source") == "llm"]
    dump = json.dumps(entries)
    assert "[withheld: the error held secret text]" in dump
    assert "redacted]" not in dump.lower() and not any("redacted]" in t.lower() for t in reflections)
    assert refusals.held(store)


def test_a_prompt_joined_from_pieces_is_screened_before_it_is_sent_or_recorded(tmp_path):
    store, entries, reflections = _pieces_then(tmp_path, think("Q:JOINED", id="go"))
    assert not [e for e in events_of(entries, "llm_call") if e.get("step_id") == "go"]  # never sent
    assert [e for e in events_of(entries, "secret_refused") if e.get("source") == "llm"]
    assert "REDACTED" not in json.dumps(entries) and not any("REDACTED" in t for t in reflections)
    assert refusals.held(store)
