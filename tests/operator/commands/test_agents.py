"""An agent exists once seeded: only ``brainstem seed`` and ``agents register`` register a name (SQLite and real Redis).

A mistyped BRAINSTEM_KV_PREFIX registers nothing, whatever the command, and fails in one line (exit 2);
``agents list`` shows the default agent; ``agents rm`` removes a registration only when it holds nothing,
and never deletes or exposes a key.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from brainstem.core.errors import ForeignAgentKey, KVWriteRefused, UnknownAgent
from brainstem.state.guarded import AgentKV
from brainstem.store import open_store
from tests.helpers import one_line, run_cli


@pytest.fixture(params=["sqlite", "redis"])
def url(request, tmp_path):
    """A store URL with no prefix; on Redis the server's registry is shared, so every name here is fresh."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    base = urlsplit(request.getfixturevalue("redis_url"))
    return urlunsplit(base._replace(query=""))


def fresh() -> str:
    return f"r{uuid.uuid4().hex[:10]}"


def names(url: str) -> set[str]:
    with open_store(url, prefix="") as store:
        return store.registered_agents()


@pytest.mark.parametrize("args", [("wake", "--force"), ("wake",), ("status",), ("status", "--json"),
                                  ("kv", "ls"), ("kv", "get", "soul"), ("kv", "put", "notes:x", "y"),
                                  ("kv", "del", "notes:x"), ("sessions",), ("karma",), ("history", "wisdom"),
                                  ("tell", "hello")])
def test_a_mistyped_prefix_registers_nothing_and_fails_in_one_line(url, args):
    ghost = fresh()
    r = run_cli(*args, env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": ghost})
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    line = one_line(r.stderr)
    assert f"no agent {ghost!r}" in line and "brainstem seed" in line, line
    assert ghost not in names(url)
    r = run_cli("agents", "list", env={"BRAINSTEM_KV": url})
    assert ghost not in r.stdout


def test_the_daemon_refuses_an_unregistered_agent_and_registers_nothing(url):
    ghost = fresh()
    r = run_cli("run", "--every", "5m", "--agent", ghost, env={"BRAINSTEM_KV": url})
    assert r.returncode == 2 and ghost in one_line(r.stderr), r.stderr
    assert ghost not in names(url)


def test_an_unregistered_view_reads_nothing_not_even_the_default_agents_keys(url):
    ghost = fresh()
    with open_store(url, prefix="") as d:
        d.put(f"{ghost}:notes", "the default agent's")
    with open_store(url, prefix=ghost, register=False) as view:
        with pytest.raises(UnknownAgent):
            view.get("notes")
        with pytest.raises(UnknownAgent):
            view.list_all()
        with pytest.raises(UnknownAgent):
            view.put("notes", "x")
    assert ghost not in names(url)
    with open_store(url, prefix="") as d:
        assert d.get(f"{ghost}:notes") == "the default agent's"


def test_seed_registers_and_then_every_command_works(url):
    bob = fresh()
    env = {"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": bob}
    r = run_cli("seed", "--example-soul", env=env)
    assert r.returncode == 0, r.stderr
    assert bob in names(url)
    r = run_cli("kv", "put", "notes:x", "y", env=env)
    assert r.returncode == 0, r.stderr
    assert run_cli("kv", "get", "notes:x", env=env).stdout.strip() == "y"
    r = run_cli("status", env=env)
    assert r.returncode == 0, r.stderr


def test_list_shows_the_default_agent_first_in_text_and_json(url):
    bob = fresh()
    r = run_cli("agents", "register", bob, env={"BRAINSTEM_KV": url})
    assert r.returncode == 0, r.stderr
    r = run_cli("agents", "list", env={"BRAINSTEM_KV": url})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "(default)" and bob in lines
    r = run_cli("agents", "list", "--json", env={"BRAINSTEM_KV": url})
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert rows[0] == {"name": None, "prefix": ""}
    assert {"name": bob, "prefix": f"{bob}:"} in rows


def test_rm_removes_an_empty_registration(url):
    bob = fresh()
    assert run_cli("agents", "register", bob, env={"BRAINSTEM_KV": url}).returncode == 0
    r = run_cli("agents", "rm", bob, env={"BRAINSTEM_KV": url})
    assert r.returncode == 0 and f"removed agent {bob}" in r.stdout, r.stderr
    assert bob not in names(url)
    r = run_cli("agents", "rm", bob, env={"BRAINSTEM_KV": url})
    assert r.returncode == 2 and "is registered" in one_line(r.stderr)
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": bob})
    assert r.returncode == 2 and f"no agent {bob!r}" in one_line(r.stderr)


def test_rm_refuses_an_agent_with_keys_and_deletes_nothing(url):
    bob = fresh()
    env = {"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": bob}
    assert run_cli("seed", "--example-soul", env=env).returncode == 0
    before = run_cli("kv", "ls", env=env).stdout
    r = run_cli("agents", "rm", bob, env={"BRAINSTEM_KV": url})
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "still holds" in line and "keys" in line and "kv del" in line and "nothing removed" in line, line
    assert bob in names(url)
    assert run_cli("kv", "ls", env=env).stdout == before
    with open_store(url, prefix="") as d:  # still bob's: the default agent neither sees nor writes them
        assert d.get(f"{bob}:soul") is None
        with pytest.raises(ForeignAgentKey):
            d.put(f"{bob}:soul", "evil")
    # Once every key is gone (deleting a versioned key records its history: those go in a later pass),
    # the registration can go.
    for _ in range(3):
        for name in run_cli("kv", "ls", env=env).stdout.split():
            if name != "(log)":
                assert run_cli("kv", "del", name, "--force-soul", env=env).returncode == 0, name
    assert run_cli("kv", "ls", env=env).stdout == ""
    r = run_cli("agents", "rm", bob, env={"BRAINSTEM_KV": url})
    assert r.returncode == 0, r.stderr
    assert bob not in names(url)


def test_a_held_wake_lease_counts_as_a_key(url):
    bob = fresh()
    with open_store(url, prefix="") as d:
        d.register_agent(bob)
    with open_store(url, prefix=bob, register=False) as view:
        assert view.acquire_lease("wake", "me", 60_000)
        assert view.unregister_agent(bob) == 1
        assert view.release_lease("wake", "me")
        assert view.unregister_agent(bob) == 0
    assert bob not in names(url)


@pytest.mark.parametrize("name", ["", "(default)", "Bad Name", "config"])
def test_rm_of_the_default_agent_or_a_bad_name_is_exit_2(url, name):
    r = run_cli("agents", "rm", name, env={"BRAINSTEM_KV": url})
    assert r.returncode == 2
    one_line(r.stderr)


def test_an_agent_cannot_reach_the_registry_through_its_writes(url):
    bob = fresh()
    with open_store(url, prefix="") as d:
        d.register_agent(bob)
        kv = AgentKV(d)
        for key in ("__agents__", "__agents__:x", f"{bob}:soul", f"{bob}:notes"):
            with pytest.raises(KVWriteRefused):
                kv.put(key, "x")
        assert bob in d.registered_agents()
    with open_store(url, prefix=bob, register=False) as view:
        kv = AgentKV(view)
        with pytest.raises(KVWriteRefused):
            kv.put("__agents__", "evil")
        kv.put("agents", "just a key of bob's own")
    assert bob in names(url) and "evil" not in names(url)
