"""Agents sharing one store cannot reach each other's keys, on a real Redis and a real SQLite file.

The default agent (empty prefix) and named agents (``NAME:``) share one store
here, as they do in production. Every path the agent has to the store is tried:
the store itself, the CLI (``brainstem kv get/put/ls/del``, ``brainstem tool
run kv_read``), the guarded view's ``kv_operations`` (what reflection applies),
a ``read_all`` tool's ``ctx.kv``, orient's ``load_keys`` and key index, logs and
locks, and a whole ``brainstem wake`` whose plan and reflection go after
another agent's soul and secrets.

Redis tests use database 13 of the test server (flushed before and after), so
the default agent's view of "everything" is this test's alone.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from urllib.parse import urlsplit, urlunsplit

import pytest

from brainstem.core import events, keys
from brainstem.core.errors import ConfigError, ForeignAgentKey, KVWriteRefused
from brainstem.session.context import kv_index, load_keys
from brainstem.state.guarded import AgentKV
from brainstem.state.seed import example_soul_path, seed
from brainstem.store import open_store
from brainstem.store.fenced import FencedStore
from brainstem.store.redis.store import RedisStore
from brainstem.store.sqlite.store import SQLiteStore
from tests.helpers import Recorder, run_cli
from tests.wake_helpers import action, answers, events_of, finished, plan, reflection, run_wake, wake_env

BOB_SOUL = "I am bob; only bob reads this. SOUL-7f3a"
BOB_SECRET = "bob-secret-value-91c2e4"
BOB_ANY = "bob's anything 5d1e"
ALICE_SOUL = "I am alice. SOUL-a11c3"
DEFAULT_SOUL = "I am the default agent. SOUL-d3fa"
DEFAULT_SECRET = "default-secret-value-44b8"
REDIS_DB = 13
# The production answer for Redis (the README shows the same command): one ACL user per agent.
ACL_RULES = ["on", ">{password}", "resetkeys", "~{name}:*", "%R~__agents__", "resetchannels", "-@all",
             "+@read", "+@write", "+@keyspace", "+@scripting", "+@transaction", "+@connection", "-@dangerous"]


def _redis_db_url(base: str, db: int = REDIS_DB) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{db}", query=""))


@pytest.fixture(params=["redis", "sqlite"])
def url(request, tmp_path):
    """A store URL without a prefix: the default agent's, shared with the named agents of the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
        return
    import redis

    u = _redis_db_url(request.getfixturevalue("redis_url"))
    r = redis.Redis.from_url(u)
    r.flushdb()
    yield u
    r.flushdb()
    r.close()


def agent(url: str, name: str | None):
    return open_store(url, prefix=f"{name}:" if name else "")


@pytest.fixture
def world(url):
    """bob and alice (named) and the default agent, each with a soul and a secret, in one store."""
    bob, alice, default = agent(url, "bob"), agent(url, "alice"), agent(url, None)
    bob.put("soul", BOB_SOUL)
    bob.put("secret:x", BOB_SECRET)
    bob.put("anything", BOB_ANY)
    bob.put("notes:plan", "bob's plan")
    bob.put("hidden:thing", "never named by the default agent")
    bob.append("karma:1", {"event": "bob's karma"})
    alice.put("soul", ALICE_SOUL)
    default.put("soul", DEFAULT_SOUL)
    default.put("secret:k", DEFAULT_SECRET)
    default.put("wisdom", "default wisdom")
    default.put("notes:mine", "default notes")
    yield {"url": url, "bob": bob, "alice": alice, "default": default}
    for s in (bob, alice, default):
        s.close()


def bob_untouched(w) -> None:
    bob = agent(w["url"], "bob")
    assert bob.get("soul") == BOB_SOUL
    assert bob.get("secret:x") == BOB_SECRET
    assert bob.get("anything") == BOB_ANY
    assert bob.read_log("karma:1") == ['{"event":"bob\'s karma"}']
    assert {k.name for k in bob.list_all()} == {"soul", "secret:x", "anything", "notes:plan", "hidden:thing",
                                                 "karma:1"}
    bob.close()


BOB_KEYS = ["bob:soul", "bob:secret:x", "bob:anything", "bob:notes:plan"]


# --- the default agent cannot reach a named agent ---------------------------------------------

@pytest.mark.parametrize("view", ["plain", "fenced"])
def test_default_agent_store_view_cannot_read_list_write_or_delete_bobs_keys(world, view):
    d = world["default"]
    if view == "fenced":  # a session's view: its wake lease held, each write fenced; confined as its store is
        assert d.acquire_lease(keys.WAKE_LEASE, "host:1:me", 30_000)
        d = FencedStore(d, keys.WAKE_LEASE, "host:1:me")
    for key in BOB_KEYS:
        assert d.get(key) is None
        assert d.get_with_metadata(key) == (None, None)
    assert d.read_log("bob:karma:1") == [] and d.log_length("bob:karma:1") == 0
    names = [k.name for k in d.list_all()]
    assert not [n for n in names if n.startswith("bob:") or n.startswith("alice:")], names
    assert {"soul", "secret:k", "wisdom", "notes:mine"} <= set(names)
    assert d.list_all("bob:") == [] and d.list_all("bo") == [] and d.list_all("bob:secret:") == []
    assert d.list("bob:").keys == []

    for write in (lambda k: d.put(k, "evil"), d.delete, lambda k: d.incr(k), lambda k: d.append(k, "evil"),
                  d.delete_log, lambda k: d.trim_log(k, 0)):
        for key in BOB_KEYS + ["bob:karma:1", "bob:new"]:
            with pytest.raises(ForeignAgentKey, match="belongs to agent 'bob'"):
                write(key)
    for lock in (lambda: d.acquire_lease("bob:wake", "me", 5000), lambda: d.release_lease("bob:wake", "me"),
                 lambda: d.renew_lease("bob:wake", "me", 5000)):
        with pytest.raises(ForeignAgentKey):
            lock()
    assert d.lease_owner("bob:wake") is None
    bob_untouched(world)


def test_default_agent_kv_operations_cannot_put_delete_or_rename_into_bob(world):
    d = world["default"]
    rec = Recorder()
    kv = AgentKV(d, rec)
    batches = [
        [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "put", "key": "bob:soul", "value": "EVIL"}],
        [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "put", "key": "bob:secret:x", "value": "EVIL"}],
        [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "delete", "key": "bob:anything"}],
        [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "rename", "key": "notes:mine", "value": "bob:soul"}],
        [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "rename", "key": "bob:soul", "value": "stolen"}],
    ]
    for batch in batches:
        with pytest.raises(KVWriteRefused):
            kv.apply_operations(batch, source="reflect")
        assert d.get("notes:ok") is None  # validated whole: nothing of the batch was written
    rejected = rec.of(events.KV_OPERATIONS_REJECTED)
    assert len(rejected) == len(batches)
    assert all("bob" in r["reason"] for r in rejected), rejected
    for attempt in (lambda: kv.put("bob:soul", "EVIL"), lambda: kv.delete("bob:anything"),
                    lambda: kv.rename("notes:mine", "bob:anything"), lambda: kv.rename("bob:soul", "stolen")):
        with pytest.raises(KVWriteRefused):
            attempt()
    assert rec.of(events.KV_WRITE) == []
    assert d.get("notes:mine") == "default notes" and d.get("stolen") is None
    bob_untouched(world)


def _read_all_services(store, record):
    from brainstem.tools import services as tools

    meta = tools.ToolMeta(kv_access="read_all")
    kv = AgentKV(store, record)
    try:
        return tools.ToolServices("snoop", meta, store, kv, record, tools.ToolPolicy())
    except (AttributeError, TypeError):  # the older signature: (..., allowed_env_secrets, fetch_allow)
        return tools.ToolServices("snoop", meta, store, kv, record, [], [])


def test_read_all_tool_context_cannot_read_list_or_write_bobs_keys(world):
    d = world["default"]
    ctx = _read_all_services(d, Recorder())
    for key in BOB_KEYS:
        assert ctx.kv_get(key) is None
    assert ctx.kv_get("wisdom") == "default wisdom"  # its own keys it reads as before
    listed = ctx.kv_list("")
    assert not [n for n in listed if n.startswith("bob:")], listed
    assert "wisdom" in listed
    assert ctx.kv_list("bob:") == [] and ctx.kv_list("bob") == []
    ctx.kv_put("bob:soul", "EVIL")  # lands under the tool's own prefix, never in bob's keys
    assert d.get("tooldata:snoop:bob:soul") == "EVIL"
    bob_untouched(world)


def _plain(value):
    """The text or data inside an untrusted-content marker (or the value itself)."""
    return getattr(value, "value", value)


def test_orient_load_keys_and_key_index_leave_bob_out(world):
    d = world["default"]
    loaded, notes = load_keys(d, ["wisdom", *BOB_KEYS], max_keys=20, max_bytes=1000)
    assert {k: str(_plain(v)) for k, v in loaded.items()} == {"wisdom": "default wisdom"}
    notes = [str(_plain(n)) for n in notes]
    assert all(f"{k}: no such key" in notes for k in BOB_KEYS), notes
    index = json.dumps(_plain(kv_index(d, max_keys=100)))
    assert "bob" not in index and "alice" not in index
    assert "notes:mine" in index


def test_registry_and_store_internals_are_not_keys(world):
    d = world["default"]
    for key in ("__agents__", "__meta__:soul", "__lock__:wake"):
        assert d.get(key) is None
        with pytest.raises(ForeignAgentKey, match="internals"):
            d.put(key, "x")
    assert not [k.name for k in d.list_all() if k.name.startswith("__")]
    assert d.list_all("__") == []
    assert d.registered_agents() >= {"bob", "alice"}


# --- a named agent cannot reach the default agent or another named agent -----------------------

def test_named_agent_cannot_reach_the_default_agent_or_another_agent(world):
    bob, alice, d = world["bob"], world["alice"], world["default"]
    assert bob.get("soul") == BOB_SOUL and alice.get("soul") == ALICE_SOUL and d.get("soul") == DEFAULT_SOUL
    for key in ("wisdom", "secret:k", "notes:mine", "alice:soul", "../soul", ":soul"):
        assert bob.get(key) is None
    assert {k.name for k in bob.list_all()} == {"soul", "secret:x", "anything", "notes:plan", "hidden:thing",
                                                "karma:1"}
    assert [k.name for k in alice.list_all()] == ["soul"]

    rec = Recorder()
    kv = AgentKV(bob, rec)
    # A key shaped like another agent's is refused outright, even inside bob's own space (bob:alice:soul
    # would be harmless today, but a name and an agent's key family is never an agent's own key).
    with pytest.raises(KVWriteRefused, match="shaped like a key of an agent named 'alice'"):
        kv.apply_operations([{"op": "put", "key": "alice:soul", "value": "EVIL"}], source="reflect")
    kv.apply_operations([{"op": "put", "key": "notes:alice", "value": "about alice"},
                         {"op": "put", "key": "wisdom", "value": "bob's wisdom"}], source="reflect")
    with pytest.raises(KVWriteRefused):
        kv.apply_operations([{"op": "delete", "key": "soul"}])
    assert alice.get("soul") == ALICE_SOUL and bob.get("alice:soul") is None
    assert d.get("wisdom") == "default wisdom" and d.get("soul") == DEFAULT_SOUL
    ctx = _read_all_services(bob, Recorder())
    assert ctx.kv_get("notes:mine") is None and ctx.kv_get("notes:alice") == "about alice"
    listed = ctx.kv_list("")
    assert "wisdom" in listed and "notes:mine" not in listed and "notes:alice" in listed  # all bob's own

    # Locks and logs are per agent too.
    assert bob.acquire_lease("wake", "bob", 5000)
    assert alice.acquire_lease("wake", "alice", 5000) and d.acquire_lease("wake", "default", 5000)
    assert (bob.lease_owner("wake"), alice.lease_owner("wake"), d.lease_owner("wake")) == ("bob", "alice", "default")
    d.append("karma:1", "default's")
    assert bob.read_log("karma:1") == ['{"event":"bob\'s karma"}'] and alice.log_length("karma:1") == 0


def test_a_registration_made_later_is_seen_by_an_open_default_view(url):
    d = agent(url, None)
    assert d.check_writable("erin:x") == "erin:x"  # nobody is called erin yet: the default agent's key
    erin = agent(url, "erin")
    erin.put("soul", "erin")
    with pytest.raises(ForeignAgentKey, match="erin"):
        d.put("erin:x", "y")
    assert d.get("erin:soul") is None
    d.close()
    erin.close()


# --- names ------------------------------------------------------------------------------------

BAD_NAMES = ["a:b", "a:b:", "A", "Bob:", "-x", "config", "config:", "soul", "tooldata:", "__agents__", ":", "::",
             "bob::", "x" * 33, "x" * 33 + ":", "b b", "bob/1"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_agent_names_are_a_configuration_error(url, name):
    with pytest.raises(ConfigError, match="agent name|reserved"):
        open_store(url, prefix=name)
    with pytest.raises(ConfigError):
        if url.startswith("sqlite"):
            SQLiteStore(urlsplit(url).path, prefix=name)
        else:
            RedisStore(url, prefix=name)


@pytest.mark.parametrize("name", ["a:b", "A", "config", ":", "x" * 33, "a:b:"])
def test_cli_refuses_invalid_names_with_exit_2_and_one_line(url, name):
    for args, env in ((("kv", "ls"), {"BRAINSTEM_KV_PREFIX": name}),
                      (("kv", "get", "soul"), {"BRAINSTEM_KV_PREFIX": name}),
                      (("wake",), {"BRAINSTEM_KV_PREFIX": name}),
                      (("run", "--every", "5m", "--agent", name), {})):
        r = run_cli(*args, env={"BRAINSTEM_KV": url, **env})
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert repr(name) in lines[0] and ("NAME" in lines[0] or "reserved" in lines[0]), lines[0]
    query_url = f"{url}?prefix={name}" if "?" not in url else url
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": query_url})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_name_without_its_colon_is_the_same_agent(url):
    bob = agent(url, "bob")
    bob.put("soul", BOB_SOUL)
    assert open_store(url, prefix="bob").get("soul") == BOB_SOUL
    r = run_cli("kv", "get", "soul", env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": "bob"})
    assert r.returncode == 0 and r.stdout.strip() == BOB_SOUL, r.stderr
    bob.close()


# --- registration ------------------------------------------------------------------------------

def test_registering_a_name_the_default_agent_already_uses_is_refused(url):
    d = agent(url, None)
    d.put("carol:notes", "the default agent's notes")
    with pytest.raises(ConfigError, match=r"cannot register agent 'carol'.*default agent.*'carol:notes'"):
        agent(url, "carol").get("soul")
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": "carol:"})
    assert r.returncode == 2 and "no agent 'carol'" in r.stderr, r.stderr  # only seed registers a name
    r = run_cli("seed", "--example-soul", env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": "carol:"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "carol:notes" in r.stderr and "--adopt" in r.stderr
    assert d.get("carol:notes") == "the default agent's notes"  # nothing changed: still the default agent's

    # The operator decides: the keys become carol's, and the default agent loses sight of them.
    r = run_cli("agents", "register", "carol", "--adopt", env={"BRAINSTEM_KV": url})
    assert r.returncode == 0, r.stderr
    r = run_cli("agents", "list", env={"BRAINSTEM_KV": url})
    assert r.returncode == 0 and "carol" in r.stdout.split(), r
    assert agent(url, "carol").get("notes") == "the default agent's notes"
    assert d.get("carol:notes") is None
    with pytest.raises(ForeignAgentKey):
        d.put("carol:notes", "x")
    d.close()


def test_an_agent_from_before_registration_is_recognised_by_its_logs(url):
    """Only an agent's own runtime appends logs under its prefix: such keys are adopted, not a clash."""
    if url.startswith("sqlite"):
        path = urlsplit(url).path
        SQLiteStore(path).close()
        db = sqlite3.connect(path)
        db.execute("INSERT INTO kv (key, value) VALUES ('dave:soul', 'dave from before')")
        db.execute("INSERT INTO log_keys (key, length) VALUES ('dave:wake_log', 1)")
        db.execute("INSERT INTO logs (key, seq, entry) VALUES ('dave:wake_log', 0, '{}')")
        db.commit()
        db.close()
    else:
        import redis

        r = redis.Redis.from_url(url)
        r.set("dave:soul", "dave from before")
        r.rpush("dave:wake_log", "{}")
        r.close()
    dave = agent(url, "dave")
    assert dave.get("soul") == "dave from before"
    assert agent(url, None).get("dave:soul") is None
    dave.close()


def test_registration_is_idempotent_and_shared_by_every_view(url):
    a1, a2 = agent(url, "frank"), agent(url, "frank")
    a1.put("soul", "frank")
    assert a2.get("soul") == "frank"
    a2.put("x", "y")  # a second registration of a name with keys of its own is no clash
    assert "frank" in agent(url, None).registered_agents()


# --- the CLI as the operator uses it -----------------------------------------------------------

def test_cli_default_agent_cannot_read_list_write_or_delete_bobs_keys(world):
    env = {"BRAINSTEM_KV": world["url"]}
    r = run_cli("kv", "ls", env=env)
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split()
    assert "wisdom" in listed and "soul" in listed
    assert not [n for n in listed if n.startswith(("bob:", "alice:"))], listed
    r = run_cli("kv", "ls", "bob:", env=env)
    assert r.returncode == 0 and r.stdout == ""
    for key in BOB_KEYS:
        r = run_cli("kv", "get", key, env=env)
        assert r.returncode != 0 and BOB_SOUL not in r.stdout + r.stderr and BOB_SECRET not in r.stdout + r.stderr
    for args in (("kv", "put", "bob:soul", "EVIL"), ("kv", "put", "bob:secret:x", "EVIL"),
                 ("kv", "del", "bob:anything"), ("kv", "put", "bob:new", "x")):
        r = run_cli(*args, env=env)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "belongs to agent 'bob'" in r.stderr, r.stderr
    bob_untouched(world)

    # bob, through the CLI, sees his own keys and nothing of the default agent's or alice's.
    r = run_cli("kv", "ls", env={**env, "BRAINSTEM_KV_PREFIX": "bob:"})
    assert sorted(r.stdout.split()) == sorted(["soul", "secret:x", "anything", "notes:plan", "hidden:thing",
                                                "karma:1", "(log)"])
    for key in ("wisdom", "secret:k", "alice:soul"):
        r = run_cli("kv", "get", key, env={**env, "BRAINSTEM_KV_PREFIX": "bob:"})
        assert r.returncode == 2 and DEFAULT_SECRET not in r.stdout and ALICE_SOUL not in r.stdout  # names nothing


def test_kv_read_tool_cannot_read_another_agents_keys(world):
    seed(world["default"])
    env = {"BRAINSTEM_KV": world["url"]}
    r = run_cli("tool", "run", "kv_read", "--input", json.dumps({"keys": BOB_KEYS}), env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert sorted(out["missing"]) == sorted(BOB_KEYS) and set(out["values"].values()) == {None}
    r = run_cli("tool", "run", "kv_read", "--input", json.dumps({"key": "bob:soul"}), env=env, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["found"] is False, r.stdout
    assert BOB_SOUL not in r.stdout


# --- a whole session of the default agent goes after bob ---------------------------------------

def test_a_default_agent_session_cannot_read_or_rewrite_bob(world, llm):
    url, d = world["url"], world["default"]
    seed(d, soul_file=example_soul_path())
    llm.queue(plan(action("kv_read", {"keys": BOB_KEYS}, id="snoop", store_result_as="loot")))
    llm.responder = answers(reflect=reflection(
        "tried bob", load_keys=["bob:soul", "bob:secret:x"],
        kv_operations=[{"op": "put", "key": "bob:soul", "value": "EVIL SOUL"}]))
    r = run_wake(wake_env(url, llm), "--force")
    sid, entries = finished(r, d)
    done = [e for e in events_of(entries, "tool_complete") if e.get("tool") == "kv_read"]
    assert done and done[0]["ok"] and sorted(done[0]["result"]["missing"]) == sorted(BOB_KEYS)
    rejected = events_of(entries, "kv_operations_rejected")
    assert len(rejected) == 1 and "bob" in rejected[0]["reason"]

    # The next session asks to load bob's keys (reflection put them in load_keys): they are not there.
    llm.queue(plan())
    llm.responder = answers()
    r = run_wake(wake_env(url, llm), "--force")
    finished(r, d)
    for req in llm.requests:
        text = json.dumps(req)
        assert BOB_SOUL not in text and BOB_SECRET not in text and BOB_ANY not in text
        assert "hidden:thing" not in text  # the key index does not name bob's keys either
    bob_untouched(world)


# --- the SQLite file is the owner's alone -------------------------------------------------------

def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_sqlite_file_wal_shm_and_new_directories_are_owner_only(tmp_path, monkeypatch):
    old = os.umask(0)  # the most permissive umask an operator could have
    try:
        # Only the default location has its missing directories created.
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "made"))
        monkeypatch.delenv("BRAINSTEM_KV", raising=False)
        path = tmp_path / "made" / "brainstem" / "brainstem.db"
        store = open_store()
        assert store.path == path
        store.put("secret:k", "v")
        assert _mode(path) == 0o600
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            assert side.exists() and _mode(side) == 0o600, (suffix, oct(_mode(side)))
        assert _mode(tmp_path / "made") == 0o700 and _mode(tmp_path / "made" / "brainstem") == 0o700
        other = SQLiteStore(path, prefix="bob:")  # a second connection, a named agent: still 0600
        other.put("soul", "x")
        assert _mode(path) == 0o600
        other.close()
        store.close()
    finally:
        os.umask(old)


def test_an_existing_world_readable_store_file_is_closed_up(tmp_path):
    path = tmp_path / "old.db"
    SQLiteStore(path).close()
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o755)
    store = SQLiteStore(path)
    assert _mode(path) == 0o600
    assert _mode(tmp_path) == 0o755  # a directory we did not create is left alone
    store.close()


# --- the production answer on Redis: one ACL user per agent ------------------------------------

def test_redis_acl_user_per_agent_confines_it_to_its_prefix(redis_url):
    import redis

    url = _redis_db_url(redis_url)
    admin = redis.Redis.from_url(url, decode_responses=True)
    user, password = "brainstem-test-bob", "bob-pw-3c9d1f"
    try:
        admin.acl_whoami()
    except redis.ResponseError:
        pytest.skip("this Redis does not let the test manage ACL users")
    admin.flushdb()
    rules = [r.format(password=password, name="bob") for r in ACL_RULES]
    admin.execute_command("ACL", "SETUSER", user, *rules)
    try:
        admin.set("alice:soul", ALICE_SOUL)
        admin.set("secret:k", DEFAULT_SECRET)
        admin_store = open_store(url, prefix="")
        admin_store.register_agent("bob")  # the operator registers the name; bob only reads the registry
        parts = urlsplit(url)
        bob_url = urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))
        bob = open_store(bob_url, prefix="bob:")
        seed(bob, soul_file=example_soul_path())
        bob.append("karma:1", "entry")
        assert bob.acquire_lease("wake", "me", 5000) and bob.release_lease("wake", "me")
        assert bob.get("soul") and "soul" in [k.name for k in bob.list_all()]
        raw = redis.Redis.from_url(bob_url, decode_responses=True)
        for key in ("alice:soul", "secret:k", "soul"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                raw.get(key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.sadd("__agents__", "mallory")
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.srem("__agents__", "bob")
        raw.close()
        # A name the operator has not registered cannot register itself with this user.
        with pytest.raises(ConfigError, match="ACL"):
            open_store(bob_url, prefix="carol:").get("soul")
        bob.close()
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.flushdb()
        admin.close()


def test_run_agent_names_are_normalised_and_checked():
    from types import SimpleNamespace

    from brainstem.daemon.scheduler import Runner

    runner = Runner(SimpleNamespace(kv_prefix="", prefix="", kv="sqlite:///unused.db"), ["bob:", "alice", None])
    assert [(a.name, a.prefix) for a in runner.agents] == [("bob", "bob:"), ("alice", "alice:"), (None, None)]
    for bad in ("a:b", "", "config", "Bob"):
        with pytest.raises(ConfigError, match="--agent"):
            Runner(SimpleNamespace(kv_prefix="", prefix="", kv="sqlite:///unused.db"), [bad])


# --- what a fresh attacker found in the store's own methods ------------------------------------------------

def test_no_agent_plants_the_internals_of_an_agent_not_registered_yet(url):
    """``carol:__lock__:wake`` written by the default agent before carol exists would be carol's wake lease the
    day she is registered (on Redis, a lease that never runs out): NAME:__… is the internals of agent NAME,
    registered or not, and no view writes it, nor the agent's plans."""
    default = agent(url, None)
    for key in ("carol:__lock__:wake", "carol:__meta__:soul", "carol:__holds__:stats:daily_cost", "carol:__x"):
        with pytest.raises(ForeignAgentKey):
            default.put(key, "attacker:1:x")
        with pytest.raises(KVWriteRefused):
            AgentKV(default, Recorder()).put(key, "attacker:1:x")
    default.register_agent("carol")
    carol = agent(url, "carol")
    assert carol.acquire_lease(keys.WAKE_LEASE, "host:1:mine", 30_000)


def test_registering_an_agent_is_refused_while_the_default_agent_holds_any_key_under_its_name(url):
    """One lease key of the agent's own among them exempts only itself: the other keys still clash."""
    default = agent(url, None)
    default.put("dave:notes:plan", "the default agent's")
    early = agent(url, "dave")
    early.registers = False  # its wake took the lease before anyone registered it
    early._registered = True
    assert early.acquire_lease(keys.WAKE_LEASE, "host:1:early", 30_000)
    with pytest.raises(ConfigError, match="already holds keys"):
        default.register_agent("dave")


def test_the_default_agents_cursors_never_name_another_agents_key(world, url):
    """A page that ends among bob's keys goes on past all of them: the cursor says that bob exists (as a
    refusal does), never which keys he holds."""
    default = agent(url, None)
    names, cursor, cursors = [], None, []
    while True:
        page = default.list("", limit=1, cursor=cursor)
        names += [k.name for k in page.keys]
        if page.complete:
            break
        cursor = page.cursor
        cursors.append(cursor)
    assert not [n for n in names if n.startswith(("bob:", "alice:"))]
    assert not [c for c in cursors if c.startswith(("bob:", "alice:")) and c[len("bob:"):] != "\U0010ffff"
                and c[len("alice:"):] != "\U0010ffff"]
    assert {"soul", "secret:k"} <= set(names)


def test_the_default_agents_usage_counts_only_its_own_keys(world, url):
    default = agent(url, None)
    before = default.usage()["keys"]
    agent(url, "bob").put("notes:more", "x" * 1000)
    assert default.usage()["keys"] == before == len(default.list_all(""))


def test_a_named_view_neither_registers_nor_removes_another_agent_nor_lists_them(world, url):
    alice = agent(url, "alice")
    with pytest.raises(ForeignAgentKey):
        alice.register_agent("carol", adopt=True)
    with pytest.raises(ForeignAgentKey):
        alice.unregister_agent("bob")
    assert alice.registered_agents() == {"alice"}
    assert agent(url, None).registered_agents() >= {"alice", "bob"}


def test_a_session_registers_no_agent_and_its_writes_carry_only_its_own_fence(world, url):
    bob = agent(url, "bob")
    assert bob.acquire_lease(keys.WAKE_LEASE, "host:1:mine", 30_000)
    session = FencedStore(bob, keys.WAKE_LEASE, "host:1:mine")
    with pytest.raises(ForeignAgentKey):
        session.register_agent("bob")  # its own name, but a session never registers
    assert bob.release_lease(keys.WAKE_LEASE, "host:1:mine")
    assert bob.acquire_lease("mine", "host:1:other", 30_000)
    with pytest.raises(Exception, match="lease"):  # a fence of its choosing does not replace the session's
        session.put("notes:plan", "after the lease was lost", fence=("mine", "host:1:other"))
    assert bob.get("notes:plan") == "bob's plan"
