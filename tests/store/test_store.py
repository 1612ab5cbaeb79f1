"""What the store does when it is not in the state the runtime expects.

Values that are not text, a store that cannot be written (a read-only file or directory, a Redis
replica), a full disk, a refused or missing Redis password, expired keys left behind, and a store
that goes away for a second or two. Every failure is one line on stderr and a documented exit code,
never a traceback; every reading command still works on a store that cannot be written.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from brainstem.core.errors import NotText, StoreFull, StoreReadOnly, StoreUnavailable
from tests.helpers import REPO, free_port, ok, one_line_error, redis_unavailable, run_cli, unique_prefix
from tests.wake_helpers import seeded

BAD = b"I am \xff\xfe not text \xc3\x28"
NO_LLM = {"OPENROUTER_API_KEY": "sk-test-unused", "OPENROUTER_BASE_URL": "http://127.0.0.1:9/v1"}


def write_raw(url: str, key: str, raw: bytes, column: str = "value") -> None:
    """Put bytes that are not UTF-8 under ``key``, around Brainstem: a plain Redis client, or sqlite3."""
    if url.startswith("redis"):
        import redis

        parts = urlsplit(url)
        prefix = parse_qs(parts.query).get("prefix", [""])[0]
        client = redis.Redis.from_url(url.split("?", 1)[0])  # bytes in, bytes out
        client.set(prefix + key, raw)
        client.close()
        return
    db = sqlite3.connect(url[len("sqlite:///"):])
    if column == "value":
        db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                   (key, raw))
        if key != "soul":  # the same bytes typed as TEXT rather than a BLOB: both are found in the wild
            db.execute("UPDATE kv SET value = CAST(value AS TEXT) WHERE key = ?", (key,))
    else:
        db.execute("INSERT INTO kv (key, value, metadata) VALUES (?, 'fine', ?) ON CONFLICT(key) DO UPDATE "
                   "SET metadata = excluded.metadata", (key, raw))
    db.commit()
    db.close()


# --- 1. values that are not text -----------------------------------------------------------

@pytest.mark.parametrize("key", ["soul", "prompt:orient"])
def test_a_soul_or_orient_prompt_that_is_not_text_is_one_line_and_exit_2(st, real_store_url, key):
    write_raw(real_store_url, key, BAD)
    env = {"BRAINSTEM_KV": real_store_url, **NO_LLM}
    one_line_error(run_cli("wake", "--force", env=env), 2, repr(key), "not text")
    one_line_error(run_cli("wake", env=env), 2, repr(key), "not text")  # the bare wake: fast path, then the full one
    err = one_line_error(run_cli("kv", "get", key, env=env), 2, repr(key), "not text", "invalid UTF-8")
    assert "kv put" in err  # it says how to repair it
    assert key in ok(run_cli("kv", "ls", env=env)).split()
    # The operator can replace it (its old bytes cannot be versioned, and are not).
    ok(run_cli("kv", "put", key, "fresh text", *(["--force-soul"] if key == "soul" else []), env=env))
    assert ok(run_cli("kv", "get", key, env=env)) == "fresh text\n"


def test_wisdom_that_is_not_text_is_named_by_kv_get_and_listed(st, real_store_url):
    write_raw(real_store_url, "wisdom", BAD)
    env = {"BRAINSTEM_KV": real_store_url}
    one_line_error(run_cli("kv", "get", "wisdom", env=env), 2, "'wisdom'", "not text")
    assert "wisdom" in ok(run_cli("kv", "ls", env=env)).split()
    assert "wisdom" in ok(run_cli("kv", "ls", "--json", env=env))
    ok(run_cli("kv", "del", "wisdom", env=env))
    assert st.get("wisdom") is None


def test_wake_config_that_is_not_text_is_due_and_repaired(st, real_store_url, monkeypatch, llm):
    """The bare `brainstem wake` asks the light sleep path first: it takes the key as "due". The
    session that follows records the rejection and writes a good schedule over it."""
    write_raw(real_store_url, "wake_config", BAD)
    from brainstem.state.sleep import asleep_fast

    monkeypatch.delenv("BRAINSTEM_KV_PREFIX", raising=False)
    monkeypatch.delenv("BRAINSTEM_ENV_FILE", raising=False)
    monkeypatch.setenv("BRAINSTEM_KV", real_store_url)
    assert asleep_fast() is None  # due: the full path decides
    env = {"BRAINSTEM_KV": real_store_url, "OPENROUTER_API_KEY": "sk-test", "OPENROUTER_BASE_URL": llm.base_url}
    llm.responder = lambda req: '{"steps": []}' if "session_summary" not in str(req) else '{"session_summary": "x"}'
    assert "wake_config" in ok(run_cli("kv", "ls", env=env)).split()
    ok(run_cli("wake", env=env))
    assert isinstance(st.get("wake_config", "json").get("next_wake_after"), str)  # repaired
    out = ok(run_cli("karma", "--json", env=env))
    rejected = [json.loads(ln) for ln in out.splitlines() if '"config_rejected"' in ln]
    assert any(e.get("key") == "wake_config" for e in rejected), rejected


def test_not_text_in_the_store_api_names_the_key(store):
    """Every reader benefits: the store's get path decodes, and says which key is not text."""
    store.put("good", "fine")  # (a named view registers its name on first use)
    if store.__class__.__name__ == "SQLiteStore":
        db = sqlite3.connect(store.path)
        db.execute("INSERT INTO kv (key, value) VALUES ('bad', ?)", (BAD,))
        db.commit()
        db.close()
    else:
        store._r.set(store.prefix + "bad", BAD)  # bytes go in as they are
    for read in (lambda: store.get("bad"), lambda: store.get("bad", "json"), lambda: store.get_with_metadata("bad")):
        with pytest.raises(NotText, match="'bad' is not text"):
            read()
    assert store.get_json("bad", default="fallback") == "fallback"
    assert "bad" in [k.name for k in store.list_all()]


def test_sqlite_metadata_that_is_not_text(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = seeded(url)
    write_raw(url, "notes:x", b"{\"a\": \"\xff\"}", column="metadata")
    assert store.get("notes:x") == "fine"  # the value itself is readable
    with pytest.raises(NotText, match="metadata of 'notes:x' is not text"):
        store.get_with_metadata("notes:x")
    listed = {k.name: k for k in store.list_all("notes:")}
    assert listed["notes:x"].metadata is None
    env = {"BRAINSTEM_KV": url}
    assert ok(run_cli("kv", "get", "notes:x", env=env)) == "fine\n"
    assert '"notes:x"' in ok(run_cli("kv", "ls", "--json", env=env))
    store.close()


# --- 2. a store that cannot be written -----------------------------------------------------

def _without_dac() -> list[str]:
    """A prefix that runs a command subject to file permissions: root ignores them, so drop the
    capabilities that let it (the interpreter under /root stays readable: root owns it)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions cannot be enforced")
    caps = "-dac_override,-dac_read_search,-fowner"
    probe = subprocess.run(["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr.decode().strip()}")
    return ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]


def run_as_user(prefix: list[str], *args: str, env: dict) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    full_env.update(env)
    return subprocess.run([*prefix, sys.executable, "-m", "brainstem", *args], env=full_env, capture_output=True,
                          text=True, timeout=60, cwd=str(REPO))


@pytest.fixture
def read_only_store():
    """An SQLite store with a session in its history, then made read-only: file 0444, directory 0555."""
    from brainstem.core import keys
    from brainstem.state import history as session_history
    from brainstem.store.karma import Karma

    top = Path(tempfile.mkdtemp(prefix="brainstem-ro-"))
    os.chmod(top, 0o755)
    d = top / "store"
    d.mkdir()
    url = f"sqlite:///{d / 'brainstem.db'}"
    store = seeded(url)
    Karma(store, "1-abcdef").record("session_start", session_id="1-abcdef")
    Karma(store, "1-abcdef").record("session_end", outcome="clean")
    store.put(keys.SESSION_LAST_STARTED, "1-abcdef")
    session_history.append(store, {"id": "1-abcdef", "outcome": "clean", "started_at": "2026-01-01T00:00:00Z",
                                   "steps": 1, "cost": 0.01, "summary": "a quiet session"})
    store.put("prompt:orient", "orient v2")
    from brainstem.state.versions import record_write

    record_write(store, "prompt:orient", "orient v1", "orient v2", source="operator")
    store.register_agent("bob")  # an agent exists once registered (seeded); reading it then needs no write
    store.close()  # a clean close removes the write-ahead log: the reader cannot create one
    os.chmod(d / "brainstem.db", 0o444)
    os.chmod(d, 0o555)
    yield url
    os.chmod(d, 0o755)
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("agent", ["", "bob"])
def test_a_read_only_sqlite_store_can_be_inspected(read_only_store, agent):
    prefix = _without_dac()
    env = {"BRAINSTEM_KV": read_only_store, **({"BRAINSTEM_KV_PREFIX": agent} if agent else {})}
    if agent:  # a registered agent is read without writing anything; an unknown one is one line, exit 2
        for args in (["status"], ["sessions"], ["kv", "ls"]):
            ok(run_as_user(prefix, *args, env=env))
        one_line_error(run_as_user(prefix, "kv", "ls", env={**env, "BRAINSTEM_KV_PREFIX": "ghost"}), 2,
                       "no agent 'ghost'")
        return
    assert "1-abcdef" in ok(run_as_user(prefix, "status", env=env))
    assert "a quiet session" in ok(run_as_user(prefix, "sessions", env=env))
    assert "session_end" in ok(run_as_user(prefix, "karma", env=env))
    assert "session_end" in ok(run_as_user(prefix, "karma", "1-abcdef", "--json", env=env))
    assert "Soul" in ok(run_as_user(prefix, "kv", "get", "soul", env=env))
    assert "prompt:orient" in ok(run_as_user(prefix, "kv", "ls", env=env)).split()
    assert "v2" in ok(run_as_user(prefix, "history", "prompt:orient", env=env))
    assert "orient v2" in ok(run_as_user(prefix, "diff", "prompt:orient", env=env))
    # Writing commands: one clear line, non-zero; nothing was created beside the file.
    one_line_error(run_as_user(prefix, "kv", "put", "notes:x", "y", env=env), 3, "read-only")
    one_line_error(run_as_user(prefix, "rollback", "prompt:orient", env=env), 3, "read-only")
    one_line_error(run_as_user(prefix, "wake", "--force", env={**env, **NO_LLM}), 3, "read-only")
    assert sorted(p.name for p in Path(read_only_store[len("sqlite:///"):]).parent.iterdir()) == ["brainstem.db"]


def test_a_read_only_file_in_a_writable_directory(tmp_path):
    prefix = _without_dac()
    top = Path(tempfile.mkdtemp(prefix="brainstem-ro-"))
    try:
        os.chmod(top, 0o777)
        url = f"sqlite:///{top / 'brainstem.db'}"
        seeded(url).close()
        os.chmod(top / "brainstem.db", 0o444)
        env = {"BRAINSTEM_KV": url}
        assert "soul" in ok(run_as_user(prefix, "kv", "ls", env=env)).split()
        ok(run_as_user(prefix, "status", env=env))
        one_line_error(run_as_user(prefix, "kv", "put", "notes:x", "y", env=env), 3, "read-only")
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.redis
def test_a_redis_replica_can_be_read_and_refuses_writes_in_one_line(tmp_path):
    from tests.redis_server import RedisServerError, start_redis_server, stop

    (tmp_path / "master").mkdir()
    (tmp_path / "replica").mkdir()
    try:
        master, mport = start_redis_server(tmp_path / "master")
    except RedisServerError as exc:
        redis_unavailable(exc)
    replica, rport = start_redis_server(tmp_path / "replica", None, "--replicaof", "127.0.0.1", str(mport))
    try:
        seeded(f"redis://127.0.0.1:{mport}/0").close()
        import redis

        r = redis.Redis(port=rport)
        deadline = time.monotonic() + 10
        while r.get("soul") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {"BRAINSTEM_KV": f"redis://127.0.0.1:{rport}/0"}
        assert "Soul" in ok(run_cli("kv", "get", "soul", env=env))
        assert "soul" in ok(run_cli("kv", "ls", env=env)).split()
        ok(run_cli("status", env=env))
        ok(run_cli("sessions", env=env))
        # An agent that was never seeded is one line (nothing is registered, so nothing is written).
        one_line_error(run_cli("kv", "ls", env={**env, "BRAINSTEM_KV_PREFIX": "bob"}), 2, "no agent 'bob'")
        one_line_error(run_cli("kv", "put", "notes:x", "y", env=env), 3, "read-only")
        one_line_error(run_cli("wake", "--force", env={**env, **NO_LLM}), 3, "read-only")
        from brainstem.store.redis.store import RedisStore

        with RedisStore(env["BRAINSTEM_KV"]) as store, pytest.raises(StoreReadOnly):
            store.put("notes:x", "y")  # not retried: a replica stays one
    finally:
        stop(replica)
        stop(master)


def test_a_full_sqlite_store_is_store_full_naming_the_disk(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    store = SQLiteStore(tmp_path / "s.db")
    store.put("a", "x")
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count={pages}")  # SQLITE_FULL from here on
    with pytest.raises(StoreFull, match="the store's disk is full: .*database or disk is full"):
        store.put("big", "y" * 200_000)
    assert isinstance(StoreFull("x"), StoreUnavailable) and StoreFull.exit_code == 3
    assert store.get("a") == "x"  # reads still work, and the failed write left nothing half-done
    assert store.get("big") is None
    store.close()


def _small_tmpfs(size: str):
    """A directory on a tmpfs of ``size`` (root only: mount)."""
    d = Path(tempfile.mkdtemp(prefix="brainstem-full-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield d
    subprocess.run(["umount", str(d)], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def full_disk():
    yield from _small_tmpfs("1m")  # room for a seeded store (its code and the approval of each), no more


@pytest.fixture
def small_disk():
    yield from _small_tmpfs("16m")


def test_a_full_disk_is_one_clear_line(full_disk):
    url = f"sqlite:///{full_disk / 'brainstem.db'}"
    seeded(url).close()
    with open(full_disk / "filler", "wb", buffering=0) as f:  # take what is left
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    # Opened on a disk with no room at all, SQLite cannot make its shared-memory index and says only
    # "disk I/O error": the runtime tells that apart by the free space left, and says the disk is full.
    one_line_error(run_cli("kv", "put", "notes:big", "x" * 100_000, env={"BRAINSTEM_KV": url}), 3,
             "the store's disk is full")
    # With room for that index but not for the write, the write fails the same way and reads still work.
    (full_disk / "filler").write_bytes(b"\0" * ((full_disk / "filler").stat().st_size - 96 * 1024))
    env = {"BRAINSTEM_KV": url}
    one_line_error(run_cli("kv", "put", "notes:big", "x" * 100_000, env=env), 3, "the store's disk is full")
    one_line_error(run_cli("wake", "--force", env={**env, **NO_LLM}), 3, "the store's disk is full")
    assert "Soul" in ok(run_cli("kv", "get", "soul", env=env))  # still readable


@pytest.mark.slow
def test_a_disk_that_fills_mid_session_is_a_store_fault_never_a_crash(small_disk, llm, tmp_path):
    """The session cannot record its end (exit 3); a note on local disk says why, and the next wake,
    once there is room again, records it as store_unavailable, which never counts towards auto-restore."""
    from brainstem.core import keys, outcomes
    from brainstem.state import history as session_history
    from brainstem.store import karma
    from tests.wake_helpers import plan, reflection, start_wake, think, wake_env

    url = f"sqlite:///{small_disk / 'brainstem.db'}"
    seeded(url).close()
    env = wake_env(url, llm, XDG_STATE_HOME=str(tmp_path / "state"))
    llm.queue(plan(think("slow", id="s")), {"content": "answer " + "z" * 2000, "delay": 1.5}, reflection())
    proc = start_wake(env, "--force")
    filler = small_disk / "filler"
    try:
        assert llm.wait_for_requests(2, timeout=30), proc.communicate(timeout=5)
        with open(filler, "wb", buffering=0) as f:  # the disk fills while the step's answer is on its way
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "disk is full" in err, (out, err)
    assert "Traceback" not in err
    assert list((tmp_path / "state" / "brainstem" / "unrecorded").iterdir())  # word of it, on local disk
    filler.unlink()
    llm.queue(plan(), reflection())
    assert run_cli("wake", "--force", env=env).returncode == 0
    from brainstem.store import open_store

    store = open_store(url)
    entries = session_history.read(store)
    assert [h["outcome"] for h in entries] == [outcomes.STORE_UNAVAILABLE, outcomes.CLEAN], entries
    assert not any(e["event"] == "crash_detected" for e in karma.read(store, entries[-1]["id"]))
    assert store.get(keys.SESSION_CURRENT) is None
    store.close()


# --- 3. a refused or missing Redis password ------------------------------------------------

@pytest.fixture(scope="module")
def password_redis(tmp_path_factory):
    from tests.redis_server import RedisServerError, start_redis_server, stop

    try:
        proc, port = start_redis_server(tmp_path_factory.mktemp("authredis"), password="right-pw-7731")
    except RedisServerError as exc:
        redis_unavailable(exc)
    yield port
    stop(proc)


@pytest.mark.redis
def test_a_wrong_redis_password_says_so(password_redis):
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": f"redis://:wrong-pw-1@127.0.0.1:{password_redis}/0"})
    err = one_line_error(r, 3, "refused the password")
    assert "wrong-pw-1" not in err and "cannot reach" not in err
    r = run_cli("status", env={"BRAINSTEM_KV": f"redis://default:wrong-pw-1@127.0.0.1:{password_redis}/0"})
    one_line_error(r, 3, "refused the password")


@pytest.mark.redis
def test_a_missing_redis_password_says_one_is_needed(password_redis):
    r = run_cli("kv", "ls", env={"BRAINSTEM_KV": f"redis://127.0.0.1:{password_redis}/0"})
    err = one_line_error(r, 3, "needs a password")
    assert "cannot reach" not in err
    one_line_error(run_cli("wake", env={"BRAINSTEM_KV": f"redis://127.0.0.1:{password_redis}/0"}), 3,
                   "needs a password")


# --- 4. expired keys leave the SQLite file ---------------------------------------------------

def _rows(path: Path, key: str) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT count(*) FROM kv WHERE key = ?", (key,)).fetchone()[0]
    finally:
        db.close()


def test_expired_rows_are_deleted_when_a_key_with_a_ttl_is_written(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    store.put("short", "x", ttl=0.2)
    store.put("forever", "y")
    time.sleep(0.3)
    assert store.get("short") is None and _rows(path, "short") == 1  # hidden, still on disk
    store.put("other", "z", ttl=60)
    assert _rows(path, "short") == 0  # gone
    assert store.get("other") == "z" and store.get("forever") == "y"
    store.put("again", "x", ttl=0.1)
    time.sleep(0.2)
    assert store.purge_expired() == 1 and _rows(path, "again") == 0
    store.close()


@pytest.mark.redis
def test_an_append_whose_reply_was_lost_is_not_recorded_twice(redis_url):
    """The command ran, then the connection dropped before the reply: the retry must not push it again."""
    import redis as redis_lib

    from brainstem.store.redis.store import RedisStore

    store = RedisStore(redis_url, prefix=unique_prefix())
    try:
        real = store._r.rpush

        def lands_then_drops(*args, **kwargs):
            real(*args, **kwargs)
            raise redis_lib.ConnectionError("Connection closed by server.")

        store._r.rpush = lands_then_drops
        assert store.append("karma:x", {"event": "llm_call", "cost": 0.01}) == 1
        store._r.rpush = real
        assert store.read_log("karma:x") == ['{"event":"llm_call","cost":0.01}']
        store.append("karma:x", {"event": "llm_call", "cost": 0.01})  # a new, identical entry: kept
        assert store.log_length("karma:x") == 2
    finally:
        store.close()


# --- 5. a short outage is survived ------------------------------------------------------------

@pytest.mark.redis
def test_a_redis_restart_during_a_write_is_survived(tmp_path):
    from brainstem.store.redis.store import RedisStore
    from tests.redis_server import RedisServerError, start_redis_server, stop

    port = free_port()
    try:
        proc, _ = start_redis_server(tmp_path, port)
    except RedisServerError as exc:
        redis_unavailable(exc)
    procs = [proc]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", prefix=unique_prefix())
    try:
        store.put("before", "1")
        stop(proc)  # the server goes away...

        def restart():
            time.sleep(1.5)  # ...and is back a moment later, on the same port
            procs.append(start_redis_server(tmp_path, port)[0])
        t = threading.Thread(target=restart)
        t.start()
        started = time.monotonic()
        store.put("during", "2")  # retried until the server answers again
        store.append("log", {"n": 1})
        t.join()
        assert time.monotonic() - started > 1.0
        assert store.get("during") == "2" and store.read_log("log") == ['{"n":1}']
        # A server that stays down: one line naming it, after the retries, and the next command fails at once.
        stop(procs[-1])
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"cannot reach Redis at redis://127.0.0.1:{port}/0"):
            store.put("after", "3")
        assert 4 < time.monotonic() - started < 8
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.get("after")
        assert time.monotonic() - started < 1
    finally:
        store.close()
        for p in procs:
            if p.poll() is None:
                stop(p)


def test_sqlite_locked_beyond_the_busy_timeout_is_retried(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    path = tmp_path / "s.db"
    store = SQLiteStore(path, busy_timeout_ms=100)
    store.put("k", "0")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock for a second
    other.execute("INSERT INTO kv (key, value) VALUES ('other', 'x')")
    t = threading.Timer(1.0, lambda: other.execute("COMMIT"))
    t.start()
    started = time.monotonic()
    store.put("k", "1")
    assert store.incr("n") == 1
    t.join()
    assert time.monotonic() - started > 0.8
    assert store.get("k") == "1" and store.get("other") == "x"
    # Held for good: one line after the retries, not a hang.
    other.execute("BEGIN IMMEDIATE")
    quick = SQLiteStore(path, busy_timeout_ms=100, retry_seconds=0.5)
    with pytest.raises(StoreUnavailable, match="locked"):
        quick.put("k", "2")
    other.execute("ROLLBACK")
    other.close()
    quick.close()
    store.close()


def test_wisdom_that_is_not_text_is_noted_and_the_session_goes_on(st, real_store_url, llm):
    """Not a key the agent needs to wake: it is left out of orient's context and the session is clean."""
    from tests.wake_helpers import answers, events_of, finished, plan, run_wake, set_defaults, wake_env

    set_defaults(st, memory={"default_load_keys": ["wisdom"]})
    write_raw(real_store_url, "wisdom", BAD)
    llm.queue(plan())
    llm.responder = answers()
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), st, "clean")
    assert not events_of(entries, "fatal_error")
