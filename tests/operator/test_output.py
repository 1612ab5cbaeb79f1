"""Details of what the command line prints: the current version in `history`, the `sessions` table,
and `dashboard` on a port that is taken. In this process (``run_cli``), against SQLite on disk."""

from __future__ import annotations

import socket

import pytest

from brainstem.operator.output import clip, spent
from brainstem.state import history as session_history
from tests.helpers import run_cli
from tests.wake_helpers import seeded


@pytest.fixture
def env(tmp_path):
    url = f"sqlite:///{tmp_path}/agent.db"
    store = seeded(url)
    yield {"BRAINSTEM_KV": url}, store
    store.close()


def marked(history_text: str) -> list[str]:
    """The versions `brainstem history` marks with '*'."""
    return [line.split()[1] for line in history_text.splitlines() if line.startswith("*")]


def test_history_marks_exactly_the_current_version_after_a_rollback(env):
    env, _ = env
    for text in ("Be brief.", "Be kind."):
        assert run_cli("kv", "put", "wisdom", text, env=env).returncode == 0
    assert marked(run_cli("history", "wisdom", env=env).stdout) == ["v2"]
    # Rolling back to v1 records v3 with v1's value: both hold what the key holds now, only v3 is current.
    assert run_cli("rollback", "wisdom", "--to", "1", env=env).returncode == 0
    assert marked(run_cli("history", "wisdom", env=env).stdout) == ["v3"]
    # Back again: v2 and v4 hold the same value; v4 is current.
    assert run_cli("rollback", "wisdom", "--to", "2", env=env).returncode == 0
    assert marked(run_cli("history", "wisdom", env=env).stdout) == ["v4"]
    # Deleted: the deletion is the current version.
    assert run_cli("kv", "del", "wisdom", env=env).returncode == 0
    assert marked(run_cli("history", "wisdom", env=env).stdout) == ["v5"]


LONG = ("Checked the inbox, answered the operator about the weekly report, and reorganised "
        "the notes on pricing before sleeping")


def test_sessions_has_a_header_and_cuts_summaries_at_a_word(env):
    env, store = env
    session_history.append(store, {"id": "1-abcdef", "started_at": "2026-05-01T10:00:00Z", "outcome": "clean",
                                   "steps": 3, "cost": 0.0123, "duration_ms": 4200, "summary": LONG})
    session_history.append(store, {"id": "2-bcdefa", "started_at": "2026-05-01T11:00:00Z", "outcome": "no_plan",
                                   "steps": 0, "cost": 0.001, "duration_ms": 900, "summary": "short"})
    header, first, second = run_cli("sessions", env=env).stdout.splitlines()
    assert header.split() == ["SESSION", "STARTED", "OUTCOME", "STEPS", "COST", "DURATION", "SUMMARY"]
    assert first.startswith("1-abcdef") and second.startswith("2-bcdefa")
    assert header.index("SUMMARY") == first.index("Checked")  # the header sits over its column
    summary = first[first.index("Checked"):]
    assert summary.endswith("…") and len(summary) <= 60
    assert LONG.startswith(summary[:-1]) and LONG[len(summary) - 1] == " "  # cut where a word ends
    assert second.endswith("short")


@pytest.mark.parametrize("text, width, want", [
    ("short", 60, "short"),
    ("one two three four", 10, "one two…"),
    ("one two, three", 9, "one two…"),  # no dangling comma before the mark
    ("abcdefghijklmnop", 8, "abcdefg…"),  # one word longer than the column: cut where it must be
    ("line one\nline two", 60, "line one line two"),
    ("exactly ten", 11, "exactly ten"),
])
def test_clip(text, width, want):
    assert clip(text, width) == want
    assert len(clip(text, width)) <= width


def test_dashboard_on_a_busy_port_fails_in_one_line_before_printing_an_address(env):
    env, _ = env
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli("dashboard", "--port", str(port), env=env, timeout=20)
    assert r.returncode == 2, r
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("brainstem: error: cannot listen on 127.0.0.1 port "), r.stderr
    assert "in use" in lines[0] and "--port" in lines[0]
    assert "http://" not in r.stderr + r.stdout


def test_dashboard_help_says_what_a_busy_port_does():
    out = run_cli("dashboard", "--help").stdout
    assert "in use is exit 2" in " ".join(out.split())


# --- what the agent wrote reaches the terminal as text -------------------------------------------------------

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[1;1Hoperator-ok\u202e\x9b31m\r\u2028"


def test_no_control_or_format_character_the_agent_wrote_reaches_the_terminal(tmp_path):
    """A message the agent's schedule posted, printed by `inbox` (a table), `inbox --json` and `karma --json`:
    escape sequences, bidi overrides and carriage returns come out spelled, never as commands to the terminal;
    the JSON stays JSON and says the same text."""
    import json

    from brainstem.state import inbox
    from brainstem.store import open_store
    from tests.wake_helpers import seeded as seed_store

    url = f"sqlite:///{tmp_path / 'b.db'}"
    seed_store(url).close()
    with open_store(url, prefix="") as store:
        inbox.post(store, "schedule x: hello: " + HOSTILE, sender="agent")
    env = {"BRAINSTEM_KV": url}
    for args in (("inbox",), ("inbox", "--json"), ("status",)):
        r = run_cli(*args, env=env)
        assert r.returncode == 0, r.stderr
        printed = r.stdout + r.stderr
        assert not [c for c in printed if c not in "\n\t" and (ord(c) < 32 or 0x7f <= ord(c) < 0xa0
                                                               or c in "\u202e\u2028")], repr(printed)
    table = run_cli("inbox", env=env).stdout
    assert "\\u{001b}]0;pwned\\u{0007}" in table and "\\u{202e}" in table
    [message] = [json.loads(line) for line in run_cli("inbox", "--json", env=env).stdout.splitlines()
                 if "pwned" in line]
    assert message["text"].endswith(HOSTILE.strip())  # the message as it was stored, whitespace aside


def test_json_text_escapes_what_a_terminal_would_act_on_and_nothing_else():
    import json

    from brainstem.operator.output import json_text

    value = {"a": "plain é … 日本", "b": "\x9b\u202e\u2028\x1b", "c": [1, None]}
    text = json_text(value)
    assert json.loads(text) == value
    assert "é … 日本" in text and "\x9b" not in text and "\u202e" not in text and "\\u009b" in text


def test_spent_names_the_part_answered_from_cassettes():
    assert spent(0.07) == spent(0.07, 0) == spent(0.07, None) == "$0.0700"
    assert spent(0.0246, 0.0246) == "$0.0246 (simulated)"
    assert spent(0.07, 0.0246) == "$0.0700 ($0.0246 of it simulated)"
    assert spent(0.07, True) == "$0.0700"  # not a number: nothing to name
