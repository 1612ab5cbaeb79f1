"""Round 9: a reply step's text (or its ``to``), joined from pieces, is redacted where a guess matched
instead of screened.

The pieces (each fewer than 8 characters of the LLM key, so no model answer is stopped) are joined by
the plan into a reply step's ``text`` or ``to``. The reply step runs the joined text through karma's
redaction (``text``), or quotes it in its refusal (``to``: "`to` must be the id of an inbox message
..., not '...'", which karma then redacts), so the stored reply, the step result or error that the
reflection reads, and karma carry a ``[REDACTED:OPENROUTER_API_KEY]`` mark exactly where the guess
matched: an oracle, and the agent is not held. Tool inputs and prompts joined the same way are screened
(``secret_refused``, the agent held: tests/hostile/test_assembled_text.py); a reply's fields should be too.
"""

from __future__ import annotations

import json

import pytest

from brainstem.state import inbox, refusals
from tests.hostile.test_assembled_text import _pieces_then


@pytest.mark.parametrize("step", [
    {"type": "reply", "id": "go", "to": 1, "text": "JOINED"},
    {"type": "reply", "id": "go", "to": "JOINED", "text": "hello"},
], ids=["text", "to"])
def test_a_reply_joined_from_pieces_is_screened_not_redacted(tmp_path, step):
    def setup(store):
        inbox.post(store, "how are you?")

    store, entries, reflections = _pieces_then(tmp_path, step, setup)
    replies = [r for m in inbox.messages(store) for r in m["replies"]]
    shown = json.dumps(replies) + json.dumps(entries) + "".join(reflections)
    assert "REDACTED" not in shown.upper(), "the reply carries a redaction mark where the guess matched"
    assert refusals.held(store), "a right guess joined into a reply is not a secret_refused stop"


def test_a_piece_of_a_secret_joined_into_a_reply_never_reaches_karma_or_the_inbox(tmp_path):
    """Redaction masks the whole value only: 16 characters of the key, joined from 5-character pieces, are
    kept in karma's ``inbox_reply`` and ``step_complete`` entries and in ``inbox:replies`` as they are (and
    would go to Telegram for a message from there). The scrubber counts any run of 8 as secret text."""
    from tests.doubles.llm_server import LLMDouble
    from tests.hostile.test_assembled_text import KEY
    from tests.wake_helpers import answers, last_session, plan, run_wake, seeded, think, wake_env

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = seeded(url)
    inbox.post(store, "how are you?")
    piece = KEY[9:25]
    parts = [piece[i:i + 5] for i in range(0, len(piece), 5)]
    steps = [think(f"Answer with exactly: {i}", id=f"p{i}", store_result_as=f"p{i}") for i in range(len(parts))]
    steps.append({"type": "reply", "id": "go", "to": 1,
                  "text": "x " + "".join(f"{{{{p{i}}}}}" for i in range(len(parts)))})
    with LLMDouble() as llm:
        llm.queue(plan(*steps), *parts)
        llm.responder = answers()
        env = wake_env(url, llm)
        env["OPENROUTER_API_KEY"] = KEY
        r = run_wake(env, "--force")
    assert r.returncode == 0, r.stderr
    _, entries = last_session(store)
    kept = json.dumps(entries) + json.dumps([r for m in inbox.messages(store) for r in m["replies"]])
    assert piece not in kept, "16 characters of the LLM key are kept in karma and inbox:replies"
