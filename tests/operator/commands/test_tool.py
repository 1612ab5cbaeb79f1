"""``brainstem tool run NAME --input JSON``: one KV tool in the real sandbox, as an operator runs it.

Every failure is one line on stderr and exit 1 (2 for an --input that is not a JSON object), never a
traceback; success is
the tool's result as JSON on stdout. The last test runs a broken tool inside a
real session (``brainstem wake --force``) to show a failing tool fails its step,
not the session.
"""

from __future__ import annotations

import json
import time

import pytest

from brainstem.core import keys
from brainstem.state import history as session_history
from brainstem.state.seed import seed
from brainstem.store import open_store
from tests.doubles import LLMDouble
from tests.helpers import put_tool, run_cli
from tests.wake_helpers import action, answers, events_of, finished, llm_calls, plan, run_wake, seeded, think, wake_env

TOKEN = "tok-5f1e2d3c4b5a69788796a5b4"


@pytest.fixture
def kv(tmp_path):
    """A seeded SQLite store and the environment that points ``brainstem`` at it."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    seed(store)
    yield store, {"BRAINSTEM_KV": url}
    store.close()


def tool_run(env: dict, *args: str, timeout: float = 30):
    return run_cli("tool", "run", *args, env=env, timeout=timeout)


def assert_one_line_failure(r, *needles: str, code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and 'File "' not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# --- success ----------------------------------------------------------------------------------

def test_prints_the_result_as_json_and_is_not_a_session(kv):
    store, env = kv
    r = tool_run(env, "kv_write", "--input", json.dumps({"key": "notes", "value": {"a": [1, 2]}}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ok": True, "key": "notes", "stored_as": "tooldata:kv_write:notes"}
    assert r.stderr == ""
    assert store.get("tooldata:kv_write:notes") == json.dumps({"a": [1, 2]})

    r = tool_run(env, "kv_read", "--input", '{"key": "tooldata:kv_write:notes"}')
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ok": True, "key": "tooldata:kv_write:notes", "found": True,
                                    "value": {"a": [1, 2]}}
    # Not a session: no history, no schedule, no counter, no karma.
    assert session_history.read(store) == []
    for key in (keys.WAKE_CONFIG, keys.SESSION_COUNTER, keys.SESSION_CURRENT):
        assert store.get(key) is None, key
    assert not [k for k in store.list_all("karma:")]


def test_default_input_is_an_empty_object(kv):
    _, env = kv
    r = tool_run(env, "topup_openrouter")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["error"].startswith("not implemented")


def test_verbose_prints_the_run_to_stderr(kv):
    _, env = kv
    r = tool_run(env, "kv_write", "--input", '{"key": "k", "value": "v"}', "-v")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stored_as"] == "tooldata:kv_write:k"
    lines = r.stderr.splitlines()
    starts = [ln for ln in lines if "tool_start" in ln]
    completes = [ln for ln in lines if "tool_complete" in ln]
    assert len(starts) == 1 and "kv_write" in starts[0]
    assert len(completes) == 1 and "ok=true" in completes[0].replace(" ", "").lower()
    assert lines.index(starts[0]) < lines.index(completes[0])
    assert any("kv_write" in ln and "tooldata:kv_write:k" in ln for ln in lines)  # the write itself


def test_verbose_failure_still_prints_the_events_and_one_error_line(kv):
    store, env = kv
    put_tool(store, "boom", "def execute(args, ctx):\n    raise ValueError('kaboom')\n")
    r = tool_run(env, "boom", "-v")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert any("tool_start" in ln for ln in lines) and any("tool_complete" in ln for ln in lines)
    errors = [ln for ln in lines if ln.startswith("brainstem: error:")]
    assert len(errors) == 1 and "kaboom" in errors[0]
    assert "Traceback" not in r.stderr


def test_granted_secret_is_a_placeholder_in_the_tool_and_nothing_printed_carries_the_value(kv):
    store, env = kv
    put_tool(store, "leaky", "def execute(args, ctx):\n"
                             "    ctx.log('token is ' + ctx.secrets['MY_TOKEN'])\n"
                             "    return {'echo': ctx.secrets['MY_TOKEN']}\n",
             {"secrets": ["MY_TOKEN"]})
    r = tool_run({**env, "BRAINSTEM_TOOL_SECRETS": "MY_TOKEN@api.example.com", "MY_TOKEN": TOKEN}, "leaky", "-v")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["echo"].startswith("brainstem-secret-MY_TOKEN-")  # the tool never had the value
    assert TOKEN not in r.stdout + r.stderr


def test_a_secret_without_a_host_is_a_configuration_error_showing_the_fix(kv):
    store, env = kv
    put_tool(store, "noop", "def execute(args, ctx):\n    return 1\n")
    r = tool_run({**env, "BRAINSTEM_TOOL_SECRETS": "MY_TOKEN", "MY_TOKEN": TOKEN}, "noop")
    assert_one_line_failure(r, "MY_TOKEN", "MY_TOKEN@", code=2)
    for bad in ("MY_TOKEN@api.example.com:443", "MY_TOKEN@https://api.example.com", "MY TOKEN@x.org",
                "secret:@x.org", "MY_TOKEN@"):
        r = tool_run({**env, "BRAINSTEM_TOOL_SECRETS": bad}, "noop")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
    # A bare OPENROUTER_API_KEY is bound to the LLM endpoint's host: not an error.
    r = tool_run({**env, "BRAINSTEM_TOOL_SECRETS": "OPENROUTER_API_KEY"}, "noop")
    assert r.returncode == 0, r.stderr


def test_help_works(kv):
    _, env = kv
    for args in (("tool", "run", "--help"), ("tool", "--help"), ("tool", "run", "-h")):
        r = run_cli(*args, env=env)
        assert r.returncode == 0, r.stderr
        assert "Usage:" in r.stdout and "run" in r.stdout
    r = run_cli("tool", "run", "--help", env=env)
    assert "--input" in r.stdout and "NAME" in r.stdout


# --- one-line failures ------------------------------------------------------------------------

def test_missing_tool(kv):
    _, env = kv
    assert_one_line_failure(tool_run(env, "no_such_tool"), "no tool named 'no_such_tool'", "brainstem tool ls",
                            code=2)  # names nothing


def test_bad_input_json(kv):
    _, env = kv
    assert_one_line_failure(tool_run(env, "kv_write", "--input", "{not json"), "--input", "not valid JSON",
                            "JSON object", code=2)


BROKEN = {
    "syntax_error": ("def execute(args, ctx):\n    return (\n", None, ["SyntaxError", "line 2"]),
    "no_execute": ("def run(args, ctx):\n    return 1\n", None, ["execute"]),
    "returns_a_set": ("def execute(args, ctx):\n    return {1, 2}\n", None, ["not JSON", "set"]),
    "raises": ("def execute(args, ctx):\n    raise ValueError('bad input: ' + str(args.get('x')))\n", None,
               ["ValueError", "bad input: 5"]),
    "meta_not_json": ("def execute(args, ctx):\n    return 1\n", "{timeout_ms: 5", ["meta", "not valid JSON"]),
    "meta_wrong_type": ("def execute(args, ctx):\n    return 1\n", {"timeout_ms": "fast"}, ["meta", "timeout_ms"]),
    "meta_not_an_object": ("def execute(args, ctx):\n    return 1\n", "[1, 2]", ["meta is invalid", "dictionary"]),
    "meta_bad_kv_access": ("def execute(args, ctx):\n    return 1\n", {"kv_access": "everything"},
                           ["meta", "kv_access"]),
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_broken_tool_is_one_clear_line(kind, kv):
    store, env = kv
    code, meta, needles = BROKEN[kind]
    put_tool(store, "broken", code, meta)
    line = assert_one_line_failure(tool_run(env, "broken", "--input", '{"x": 5}'), "broken", *needles)
    assert line.startswith("brainstem: error: tool broken failed:")


def test_looping_tool_is_killed_at_its_timeout(kv):
    store, env = kv
    put_tool(store, "spin", "def execute(args, ctx):\n    n = 0\n    while True:\n        n += 1\n",
             {"timeout_ms": 300})
    t0 = time.monotonic()
    r = tool_run(env, "spin", timeout=20)
    elapsed = time.monotonic() - t0
    assert_one_line_failure(r, "spin", "timed out after 300 ms")
    assert elapsed < 2.0, elapsed  # interpreter start-up included; the tool itself gets 300 ms


@pytest.mark.parametrize("given, kind", [("[1]", "array"), ("[1, 2]", "array"), ('"x"', "string"), ("3", "number"),
                                         ("null", "null"), ("true", "boolean")])
def test_input_that_is_not_a_json_object_is_exit_2_before_the_tool_runs(kv, given, kind):
    store, env = kv
    line = assert_one_line_failure(tool_run(env, "kv_write", "--input", given), code=2)
    example = """--input '{"url": "https://example.org"}'"""
    assert line == f"brainstem: error: --input must be a JSON object, e.g. {example}; got a JSON {kind}"
    assert not [k for k in store.list_all("tooldata:")]  # the tool never ran


# --- inside a session -------------------------------------------------------------------------

def test_failing_tool_fails_its_step_and_the_session_goes_on(real_store_url):
    store = seeded(real_store_url)
    put_tool(store, "broken", "def execute(args, ctx):\n    raise RuntimeError('tool is broken')\n")
    try:
        with LLMDouble() as llm:
            llm.queue(plan(action("broken", {"x": 1}, id="s1", store_result_as="out"),
                           think("Carry on regardless.", id="s2", store_result_as="thought")),
                      "carried on")
            llm.responder = answers()
            r = run_wake(wake_env(real_store_url, llm), "--force")
        _, entries = finished(r, store)

        starts = [e for e in events_of(entries, "tool_start") if e.get("tool") == "broken"]
        completes = [e for e in events_of(entries, "tool_complete") if e.get("tool") == "broken"]
        assert len(starts) == len(completes) >= 1
        assert [e["attempt"] for e in starts] == [e["attempt"] for e in completes] == list(range(1, len(starts) + 1))
        for c in completes:
            assert c["ok"] is False and c["step_id"] == "s1"
            assert "tool is broken" in c["error"]
        failed = events_of(entries, "step_failed")
        assert [f["step_id"] for f in failed] == ["s1"]
        done = [e for e in events_of(entries, "step_complete") if e.get("step_id") == "s2"]
        assert len(done) == 1 and done[0]["result"] == "carried on"
        assert [c["purpose"] for c in llm_calls(entries)] == ["orient", "think", "reflect"]
        (h,) = [x for x in session_history.read(store) if x["id"] == entries[0]["session_id"]]
        assert h["steps_failed"] == 1
    finally:
        store.close()
