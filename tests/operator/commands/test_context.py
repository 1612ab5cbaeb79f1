"""The operator's commands, run as a subprocess against real stores."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from brainstem.store import karma, open_store
from tests.helpers import one_line_error, run_cli, run_cli_process


@pytest.fixture
def env(real_store_url):
    return {"BRAINSTEM_KV": real_store_url}


@pytest.mark.parametrize("args", [[], ["seed"], ["kv"], ["kv", "get"], ["kv", "put"], ["kv", "ls"],
                                  ["kv", "del"], ["karma"]])
def test_help_everywhere(args):
    r = run_cli(*args, "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout


def test_seed_then_read_back(env):
    r = run_cli("seed", "--example-soul", env=env)
    assert r.returncode == 0, r.stderr
    assert "soul: set" in r.stdout
    r2 = run_cli("seed", env=env)
    assert "0 written" in r2.stdout and "soul: present" in r2.stdout
    ls = run_cli("kv", "ls", "tool:", env=env)
    assert "tool:web_fetch:code" in ls.stdout.splitlines()
    cfg = run_cli("kv", "get", "config:defaults", "--json", env=env)
    assert json.loads(cfg.stdout)["execution"]["max_subplan_depth"] == 3


def test_kv_put_get_ls_del(env, tmp_path):
    assert run_cli("kv", "put", "notes", "hello", env=env).returncode == 0
    assert run_cli("kv", "get", "notes", env=env).stdout == "hello\n"
    f = tmp_path / "v.json"
    f.write_text('{"a": [1, 2]}')
    assert run_cli("kv", "put", "cfg:x", "--file", str(f), "--json", env=env).returncode == 0
    assert run_cli("kv", "get", "cfg:x", env=env).stdout.strip() == '{"a":[1,2]}'
    assert run_cli("kv", "put", "piped", "--file", "-", env=env, input="from stdin").returncode == 0
    assert run_cli("kv", "get", "piped", env=env).stdout.strip() == "from stdin"
    listed = [json.loads(line)["name"] for line in run_cli("kv", "ls", "--json", env=env).stdout.splitlines()]
    assert listed == ["cfg:x", "notes", "piped"]
    assert run_cli("kv", "del", "notes", env=env).returncode == 0
    assert "no key 'notes'" in one_line_error(run_cli("kv", "get", "notes", env=env))
    assert "no key 'notes'" in one_line_error(run_cli("kv", "del", "notes", env=env))


def test_soul_needs_the_operator_override(env):
    run_cli("seed", "--example-soul", env=env)
    original = run_cli("kv", "get", "soul", env=env).stdout
    assert "--force-soul" in one_line_error(run_cli("kv", "put", "soul", "evil", env=env))
    assert "--force-soul" in one_line_error(run_cli("kv", "del", "soul", env=env))
    assert run_cli("kv", "get", "soul", env=env).stdout == original
    assert run_cli("kv", "put", "soul", "A new soul, on purpose.", "--force-soul", env=env).returncode == 0
    assert run_cli("kv", "get", "soul", env=env).stdout.strip() == "A new soul, on purpose."


def test_malformed_json_value_gives_raw_text_or_a_clear_error(env):
    run_cli("kv", "put", "config:defaults", "{oops", "--force", env=env)  # a broken value, on purpose
    assert run_cli("kv", "get", "config:defaults", env=env).stdout.strip() == "{oops"
    assert "not valid JSON" in one_line_error(run_cli("kv", "get", "config:defaults", "--json", env=env))
    assert "not valid JSON" in one_line_error(run_cli("kv", "put", "x", "{oops", "--json", env=env))


def test_bad_keys_are_refused(env):
    assert "empty segment" in one_line_error(run_cli("kv", "put", "a::b", "x", env=env))


def test_karma_timeline_and_json(real_store_url):
    store = open_store(real_store_url)
    karma.begin_session(store, "7-test")
    k = karma.Karma(store, "7-test")
    k.record("session_start", session_id="7-test")
    k.record("llm_call", model="anthropic/claude-haiku-4.5", tier="hardcoded", cost=0.0012)
    k.record("session_end", outcome="clean")
    env = {"BRAINSTEM_KV": real_store_url}
    text = run_cli("karma", env=env)
    assert text.returncode == 0, text.stderr
    assert "session 7-test" in text.stdout and "llm_call" in text.stdout and "outcome=clean" in text.stdout
    lines = run_cli("karma", "7-test", "--json", env=env).stdout.splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["session_start", "llm_call", "session_end"]
    r = run_cli("karma", "nope", env=env)
    assert "no session nope in " in one_line_error(r) and "brainstem sessions" in r.stderr and r.returncode == 2


def test_karma_with_no_sessions(env):
    assert "no session has run yet" in one_line_error(run_cli("karma", env=env))


def test_unreachable_redis_names_the_url_without_password():
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": "redis://:hunter2secret@127.0.0.1:1/0"})
    line = one_line_error(r)
    assert "127.0.0.1:1" in line and "hunter2secret" not in r.stderr + r.stdout
    assert r.returncode == 3


def test_corrupt_sqlite_file_names_the_file(tmp_path):
    bad = tmp_path / "brainstem.db"
    bad.write_bytes(b"this is not an sqlite database at all" * 100)
    line = one_line_error(run_cli("kv", "ls", env={"BRAINSTEM_KV": f"sqlite:///{bad}"}))
    assert str(bad) in line and "not a database" in line


def _kv_put(url: str, cwd, **env):
    """``brainstem kv put notes:x 1`` run from the working directory ``cwd``."""
    with contextlib.chdir(cwd):
        return run_cli("kv", "put", "notes:x", "1", env={**env, "BRAINSTEM_KV": url})


def test_sqlite_urls_follow_sqlalchemy_three_slashes_relative_four_absolute(tmp_path):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    r = _kv_put("sqlite:///data/agent.db", work)
    assert r.returncode == 0, r.stderr
    assert (work / "data" / "agent.db").exists() and not Path("/data/agent.db").exists()
    r = _kv_put(f"sqlite:///{tmp_path}/abs.db", work)  # four slashes in all: an absolute path
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "abs.db").exists()


def test_a_store_in_a_missing_directory_is_exit_2_naming_it_not_a_new_agent(tmp_path):
    r = _kv_put(f"sqlite:///{tmp_path}/nope/agent.db", tmp_path)
    line = one_line_error(r)
    assert r.returncode == 2 and f"{tmp_path}/nope" in line and "does not exist" in line
    assert not (tmp_path / "nope").exists()
    # The likely slip, three slashes for an absolute path, gets the fix spelled out.
    r = _kv_put(f"sqlite://{tmp_path}/agent.db", tmp_path / "..")
    line = one_line_error(r)
    assert r.returncode == 2 and f"sqlite:///{tmp_path}/agent.db" in line and "four slashes" in line
    # Two slashes is no SQLite URL at all.
    assert "four slashes" in one_line_error(_kv_put("sqlite://agent.db", tmp_path))


def test_the_default_store_location_is_created(tmp_path):
    r = _kv_put("", tmp_path, XDG_DATA_HOME=str(tmp_path / "xdg"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "xdg" / "brainstem" / "brainstem.db").exists()


def test_bad_store_url_and_bad_setting_are_one_line():
    assert "not a store URL" in one_line_error(run_cli("kv", "ls", env={"BRAINSTEM_KV": "mysql://x"}))
    line = one_line_error(run_cli("kv", "ls", env={"BRAINSTEM_MAX_SESSION_COST": "lots"}))
    assert "BRAINSTEM_MAX_SESSION_COST" in line


def test_debug_shows_the_traceback():
    # A real process: the traceback and the exit status are the interpreter's.
    r = run_cli_process("--debug", "kv", "ls", env={"BRAINSTEM_KV": "redis://127.0.0.1:1/0"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_default_store_is_embedded_sqlite_in_the_data_dir(tmp_path):
    r = run_cli("seed", env={"XDG_DATA_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "brainstem" / "brainstem.db").exists()
    assert str(tmp_path / "brainstem" / "brainstem.db") in r.stdout


def test_python_dash_m_and_console_script_agree():
    import shutil
    import subprocess

    exe = shutil.which("brainstem")
    if exe is None:
        pytest.skip("console script not on PATH")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == run_cli_process("--version").stdout  # python -m brainstem
