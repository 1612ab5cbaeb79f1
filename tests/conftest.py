"""Fixtures for the whole suite: a real redis-server for the session, the three stores, a seeded agent,
the LLM double, daemons and the sandbox's canaries.

Redis tests use, in order: ``REDIS_URL`` if set, else a ``redis-server`` this
session starts on a free port in a temporary directory. Without either they
skip with a reason, except under ``BRAINSTEM_REQUIRE_REDIS=1`` (CI), where a
missing Redis is a failure.

What tests share that is not a fixture (running the command line, waiting, a daemon) is in
tests/helpers.py; a folder's own fixtures are in its conftest.py.
"""

from __future__ import annotations

import os
import uuid

import pytest

from tests.helpers import CANARY_ENV, CANARY_ENV_NAME, CANARY_FILE_TEXT, Daemon, redis_unavailable, unique_prefix


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """URL of a real Redis: REDIS_URL, or a redis-server started for this test session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    from tests.redis_server import RedisServerError, start_redis_server, stop

    try:
        proc, port = start_redis_server(tmp_path_factory.mktemp("redis"), None, "--protected-mode", "yes")
    except RedisServerError as exc:
        redis_unavailable(f"{exc} and no REDIS_URL set")
    yield f"redis://127.0.0.1:{port}/0"
    stop(proc)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """(URL, ports) of a real three-node Redis Cluster started for this test session."""
    from tests.redis_server import RedisServerError, start_redis_cluster, stop

    try:
        procs, ports = start_redis_cluster(tmp_path_factory.mktemp("cluster"))
    except RedisServerError as exc:
        redis_unavailable(exc)
    yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/", ports
    for proc in procs:
        stop(proc)


@pytest.fixture
def own_redis(tmp_path):
    """The port of a redis-server of this test's own, for tests that lock it, restart it or stop it."""
    from tests.redis_server import RedisServerError, start_redis_server, stop

    try:
        proc, port = start_redis_server(tmp_path)
    except RedisServerError as exc:
        redis_unavailable(exc)
    yield port
    stop(proc)


@pytest.fixture
def redis_store(redis_url):
    from brainstem.store.redis.store import RedisStore

    store = RedisStore(redis_url, prefix=unique_prefix())
    yield store
    for k in store._r.scan_iter(match=store.prefix + "*", count=1000):
        store._r.delete(k)
    store.close()


@pytest.fixture
def fake_store():
    import fakeredis

    from brainstem.store.redis.store import RedisStore

    client = fakeredis.FakeRedis(decode_responses=True)
    store = RedisStore("redis://fake/0", prefix="agent:", client=client)
    yield store


@pytest.fixture
def sqlite_store(tmp_path):
    from brainstem.store.sqlite.store import SQLiteStore

    store = SQLiteStore(tmp_path / "store.db")
    yield store
    store.close()


@pytest.fixture(params=["redis", "fakeredis", "sqlite"])
def store(request):
    """The same test against a real Redis, fakeredis and SQLite."""
    return request.getfixturevalue({"redis": "redis_store", "fakeredis": "fake_store",
                                    "sqlite": "sqlite_store"}[request.param])


@pytest.fixture
def url(tmp_path) -> str:
    """The URL of an SQLite store of this test's own, not created yet."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=["redis", "sqlite"])
def real_store_url(request, tmp_path):
    """A store URL for subprocess tests: a real Redis (own prefix) or an SQLite file."""
    if request.param == "redis":
        base = request.getfixturevalue("redis_url")
        prefix = unique_prefix()
        from brainstem.store import open_store

        # The test's own agent, registered as `brainstem seed` would: the commands refuse a name that is not.
        with open_store(base, prefix="") as admin:
            admin.register_agent(prefix)
        return f"{base}?prefix={prefix}"
    return f"sqlite:///{tmp_path / 'store.db'}"


# --- a seeded agent, the LLM double, and the environment of a wake against both ---

@pytest.fixture
def llm():
    """A scripted OpenAI-compatible server on loopback (tests/doubles/llm_server.py)."""
    from tests.doubles import LLMDouble

    with LLMDouble() as d:
        yield d


@pytest.fixture
def st(real_store_url):
    """A real store (Redis or SQLite), seeded with the example soul, prompts and tools."""
    from tests.wake_helpers import seeded

    store = seeded(real_store_url)
    yield store
    store.close()


@pytest.fixture
def env(real_store_url, llm):
    """The environment of a `brainstem wake` subprocess against ``st`` and ``llm``."""
    from tests.wake_helpers import wake_env

    return wake_env(real_store_url, llm)


# --- daemons (`brainstem run` subprocesses) and agents on a real Redis ------------------

@pytest.fixture
def daemons(tmp_path):
    """Start daemons with ``daemons(env, *args)``; any still running at teardown is killed (by its pid)."""
    started: list[Daemon] = []

    def start(env: dict, *args: str) -> Daemon:
        d = Daemon(env, list(args), tmp_path)
        started.append(d)
        return d
    yield start
    for d in started:
        if d.alive():
            d.proc.kill()
            d.proc.wait(5)


@pytest.fixture
def agents(redis_url):
    """``agents(url=None)`` -> (name, store): a new seeded agent under prefix ``NAME:``; removed afterwards."""
    made = []

    def make(url: str | None = None, soul: bool = True):
        from brainstem.state.seed import example_soul_path, seed
        from brainstem.store import open_store

        name = f"run{uuid.uuid4().hex[:8]}"
        store = open_store(url or redis_url, prefix=f"{name}:")
        seed(store, soul_file=example_soul_path() if soul else None)
        made.append(store)
        return name, store
    yield make
    for store in made:
        try:
            for k in store._r.scan_iter(match=store.prefix + "*", count=1000):
                store._r.delete(k)
            store.close()
        except Exception:  # noqa: BLE001 - a test may have stopped its own Redis
            pass


# --- the sandbox's canaries -------------------------------------------------------------------------

@pytest.fixture(scope="session")
def canaries(tmp_path_factory):
    """Plant the canaries: an env var in this (runtime) process, a file, a fake KV."""
    os.environ[CANARY_ENV_NAME] = CANARY_ENV
    path = tmp_path_factory.mktemp("canary") / "canary.txt"
    path.write_text(CANARY_FILE_TEXT)
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    yield {"file": str(path)}
