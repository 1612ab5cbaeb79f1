"""Exit codes as README documents them: an error is one line on stderr, and an argument that is wrong or
names nothing (an unknown key, version, tool, session, review item, anomaly or agent) is exit 2; success is 0.

Every case runs the command line in this process (``run_cli``) against one seeded SQLite store on disk.
"""

from __future__ import annotations

import pytest

from tests.helpers import run_cli
from tests.wake_helpers import seeded

# (argv, exit code, words stderr must contain). Each names something the store does not hold.
NAMES_NOTHING = [
    (["kv", "get", "MISSING"], 2, ["no key 'MISSING'", "brainstem kv ls"]),
    (["kv", "del", "MISSING"], 2, ["no key 'MISSING'"]),
    (["rollback", "wisdom", "--to", "99"], 2, ["has no version 99", "kept: 1, 2"]),
    (["rollback", "prompt:orient", "--to", "99"], 2, ["no versions recorded yet for prompt:orient"]),
    (["rollback", "notes:x", "--to", "1"], 2, ["notes:x is not versioned"]),
    (["diff", "wisdom", "99"], 2, ["has no version 99"]),
    (["diff", "notes:x"], 2, ["notes:x is not versioned"]),
    (["history", "notes:x"], 2, ["notes:x is not versioned"]),
    (["tool", "run", "MISSING"], 2, ["no tool named 'MISSING'", "brainstem tool ls"]),
    (["tool", "run", "a:b"], 2, ["no tool named 'a:b'"]),
    (["tool", "approve", "MISSING"], 2, ["no code at tool:MISSING:code", "brainstem tool pending"]),
    (["tool", "diff", "provider:MISSING"], 2, ["no code at provider:MISSING:code"]),
    (["karma", "99"], 2, ["no session 99"]),
    (["karma", "no-such-session"], 2, ["no session no-such-session"]),
    (["replay", "99"], 2, ["no session '99'"]),
    (["review", "99"], 2, ["no review item '99'"]),
    (["review", "99", "--confirm"], 2, ["no review item '99'"]),
    (["anomaly", "99", "--billed", "1"], 2, ["no cost anomaly number 99", "brainstem status"]),
    (["inbox", "--agent", "nobody"], 2, ["unknown agent 'nobody'"]),
    (["tell", "hi", "--agent", "nobody"], 2, ["unknown agent 'nobody'"]),
    (["agents", "register", "Bad!Name"], 2, ["'Bad!Name' is not a valid agent name"]),
]

# Arguments in the wrong form: exit 2 with what was wrong.
WRONG_ARGUMENT = [
    (["sessions", "--since", "yesterday"], 2, ["--since 'yesterday'"]),
    (["changes", "--since", "7x"], 2, ["--since '7x'"]),
    (["tool", "run", "kv_read", "--input", "[1]"], 2, ["--input must be a JSON object"]),
    (["tool", "run", "kv_read", "--input", "{nope"], 2, ["--input is not valid JSON"]),
    (["tool", "approve", "a:b"], 2, ["'a:b' names no code", "provider:NAME"]),
    (["tool", "approve", "kv_read", "--sha256", "0000000000"], 2, ["not '0000000000'", "nothing approved"]),
    (["kv", "get", "wisdom", "--bogus"], 2, ["No such option"]),
    (["diff", "wisdom", "abc"], 2, ["'abc' is not a valid integer"]),
    (["sessions", "-n", "0"], 2, ["0 is not in the range"]),
    (["tell", ""], 2, ["the message is empty"]),
    (["wakey"], 2, ["No such command 'wakey'", "'wake'", "`brainstem --help`"]),
    (["kv", "get"], 2, ["Missing argument 'KEY'", "`brainstem kv get --help`"]),
]

SUCCEEDS = [
    ["kv", "get", "wisdom"],
    ["history", "wisdom"],
    ["diff", "wisdom", "1"],
    ["tool", "ls"],
    ["tool", "pending"],
    ["tool", "diff", "kv_read"],
    ["sessions"],
    ["status"],
    ["inbox"],
    ["agents", "list"],
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('exit-codes')}/agent.db"
    store = seeded(url)
    store.close()
    env = {"BRAINSTEM_KV": url}
    # Two versions of wisdom, so "no version 99" has versions to list.
    for text in ("Be brief.", "Be briefer."):
        assert run_cli("kv", "put", "wisdom", text, env=env).returncode == 0
    return env


def only_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("brainstem: error: "), stderr  # click's usage errors too
    return lines[0]


@pytest.mark.parametrize("argv, code, words", NAMES_NOTHING, ids=[" ".join(a) for a, _, _ in NAMES_NOTHING])
def test_an_argument_that_names_nothing_is_one_line_and_exit_2(env, argv, code, words):
    r = run_cli(*argv, env=env)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("brainstem: error: "), r.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert r.stdout == ""


@pytest.mark.parametrize("argv, code, words", WRONG_ARGUMENT, ids=[" ".join(a) for a, _, _ in WRONG_ARGUMENT])
def test_an_argument_in_the_wrong_form_is_exit_2(env, argv, code, words):
    r = run_cli(*argv, env=env)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    line = only_line(r.stderr)
    for word in words:
        assert word in line, (word, r.stderr)


@pytest.mark.parametrize("argv", SUCCEEDS, ids=[" ".join(a) for a in SUCCEEDS])
def test_success_is_0_with_nothing_on_stderr(env, argv):
    r = run_cli(*argv, env=env)
    assert (r.returncode, r.stderr) == (0, ""), r


def test_a_key_with_nothing_to_go_back_to_is_not_an_argument_error(env):
    """`diff wisdom` on a key with no earlier version is a state, not a bad name: exit 1, still one line."""
    assert run_cli("kv", "put", "prompt:fresh", "x", env=env).returncode == 0
    r = run_cli("diff", "prompt:fresh", env=env)
    assert r.returncode == 1 and "has only one version" in only_line(r.stderr), r


def test_with_debug_a_usage_error_shows_click_s_whole_usage(env):
    r = run_cli("--debug", "kv", "get", env=env)
    assert r.returncode == 2
    assert r.stderr.startswith("Usage: brainstem kv get [OPTIONS] KEY") and "Missing argument 'KEY'" in r.stderr


def test_a_bare_group_still_shows_its_help(env):
    r = run_cli("kv", env=env)
    assert r.returncode == 2 and "Commands:" in r.stdout + r.stderr and "brainstem: error" not in r.stderr
