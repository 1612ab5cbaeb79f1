"""Shared fixtures: a real redis-server for the session, the three stores, and the command line.

Redis tests use, in order: ``REDIS_URL`` if set, else a ``redis-server`` this
session starts on a free port in a temporary directory. Without either they
skip with a reason, except under ``BRAINSTEM_REQUIRE_REDIS=1`` (CI), where a
missing Redis is a failure.

The command line runs in this process (:func:`run_cli`): a subprocess costs a
second of interpreter start and imports, and the suite runs it hundreds of
times. :func:`run_cli_process` is the real process, for what only a process
shows (exit by signal, the sleep path's imports, a tty, daemons).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .cli_inprocess import run_cli_inprocess

REPO = Path(__file__).resolve().parent.parent


def wait_for(predicate, timeout: float = 10.0, what: str = "the condition", daemon=None, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass (a failure
    naming ``what``): a test waits for what it needs, never a fixed sleep that is too long or too short.
    With ``daemon`` (a :class:`Daemon`), its exit fails the wait at once, with its stderr."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if daemon is not None and not daemon.alive():
            pytest.fail(f"brainstem run exited ({daemon.proc.returncode}) while waiting for {what}:\n"
                        f"{daemon.stderr[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}"
                        + (f"\nstderr:\n{daemon.stderr[-2000:]}" if daemon is not None else ""))
        time.sleep(interval)


def _require_redis() -> bool:
    return os.environ.get("BRAINSTEM_REQUIRE_REDIS") == "1"


def redis_unavailable(why: object) -> None:
    """A test that needs a real Redis cannot have one: a failure in CI (BRAINSTEM_REQUIRE_REDIS=1),
    a skip elsewhere."""
    if _require_redis():
        pytest.fail(f"BRAINSTEM_REQUIRE_REDIS=1 but {why}")
    pytest.skip(str(why))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """URL of a real Redis: REDIS_URL, or a redis-server started for this test session."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    from .redis_server import RedisServerError, start_redis_server, stop

    try:
        proc, port = start_redis_server(tmp_path_factory.mktemp("redis"), None, "--protected-mode", "yes")
    except RedisServerError as exc:
        redis_unavailable(f"{exc} and no REDIS_URL set")
    yield f"redis://127.0.0.1:{port}/0"
    stop(proc)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """(URL, ports) of a real three-node Redis Cluster started for this test session."""
    from .redis_server import RedisServerError, start_redis_cluster, stop

    try:
        procs, ports = start_redis_cluster(tmp_path_factory.mktemp("cluster"))
    except RedisServerError as exc:
        redis_unavailable(exc)
    yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/", ports
    for proc in procs:
        stop(proc)


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
def own_redis(tmp_path):
    """The port of a redis-server of this test's own, for tests that lock it, restart it or stop it."""
    from .redis_server import RedisServerError, start_redis_server, stop

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


def clean_env(env: dict | None = None) -> dict[str, str]:
    """The environment a command gets: this process's without any ``BRAINSTEM_*`` / ``OPENROUTER_*``, then ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    full_env.update(env or {})
    return full_env


def run_cli(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 60):
    """Run ``brainstem ARGS`` as an operator would, with a clean environment, in this process
    (see tests/cli_inprocess.py); a CompletedProcess like :func:`run_cli_process`'s."""
    return run_cli_inprocess(*args, env=env, input=input, timeout=timeout)


def run_cli_process(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 60):
    """Run ``python -m brainstem ARGS`` as a real process: for exit codes of the process itself, signals,
    the sleep path's imports, stdin and tty behaviour."""
    return subprocess.run([sys.executable, "-m", "brainstem", *args], env=clean_env(env), input=input,
                          capture_output=True, text=True, timeout=timeout)


# --- a seeded agent, the LLM double, and the environment of a wake against both ---

@pytest.fixture
def llm():
    """A scripted OpenAI-compatible server on loopback (tests/doubles/llm_server.py)."""
    from .doubles import LLMDouble

    with LLMDouble() as d:
        yield d


@pytest.fixture
def st(real_store_url):
    """A real store (Redis or SQLite), seeded with the example soul, prompts and tools."""
    from .wake_helpers import seeded

    store = seeded(real_store_url)
    yield store
    store.close()


@pytest.fixture
def env(real_store_url, llm):
    """The environment of a `brainstem wake` subprocess against ``st`` and ``llm``."""
    from .wake_helpers import wake_env

    return wake_env(real_store_url, llm)


# --- daemons (`brainstem run` subprocesses) and agents on a real Redis ------------------

class Daemon:
    """One ``brainstem run`` process; stdout and stderr go to files (a chatty daemon never blocks on a pipe)."""

    def __init__(self, env: dict, args: list[str], workdir: Path):
        tag = uuid.uuid4().hex[:6]
        self.out_path, self.err_path = workdir / f"run-{tag}.out", workdir / f"run-{tag}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "brainstem", "run", *args], env=env,
                                         stdout=out, stderr=err)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds it took to exit)."""
        t0 = time.monotonic()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"brainstem run did not exit within {timeout}s of SIGTERM:\n{self.stderr[-2000:]}")
        return rc, time.monotonic() - t0


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
