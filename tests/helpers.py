"""What many tests share that is not a fixture: running the command line, waiting, a daemon, the sandbox's canaries.

Fixtures live in the conftest.py of the folder whose tests use them (tests/conftest.py for the whole
suite); the loopback servers that stand in for the outside world are in tests/doubles/, a wake's
plans and karma in tests/wake_helpers.py.

The command line runs in this process (:func:`run_cli`): a subprocess costs a second of interpreter
start and imports, and the suite runs it hundreds of times. :func:`run_cli_process` is the real
process, for what only a process shows (exit by signal, the sleep path's imports, a tty, daemons).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest

from brainstem.core import keys
from tests.cli_inprocess import run_cli_inprocess

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


def redis_unavailable(why: object) -> None:
    """A test that needs a real Redis cannot have one: a failure in CI (BRAINSTEM_REQUIRE_REDIS=1),
    a skip elsewhere."""
    if os.environ.get("BRAINSTEM_REQUIRE_REDIS") == "1":
        pytest.fail(f"BRAINSTEM_REQUIRE_REDIS=1 but {why}")
    pytest.skip(str(why))


def unique_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


# --- the command line, and what it printed -------------------------------------------------------

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


def ok(result) -> str:
    """The command succeeded: exit 0 and no traceback; its stdout."""
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def one_line(stderr: str) -> str:
    """``stderr`` is exactly one line (blank lines aside) and no traceback; that line."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def one_line_error(result, code: int | None = None, *words: str) -> str:
    """The command failed (with exit ``code``, when given) in exactly one line on stderr, no traceback,
    holding each of ``words``; that line."""
    if code is None:
        assert result.returncode != 0, (result.returncode, result.stdout, result.stderr)
    else:
        assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    line = one_line(result.stderr)
    for word in words:
        assert word in line, line
    return line


def put_tool(store, name: str, code: str, meta: dict | str | None = None) -> None:
    """Write a tool as the agent would: its code, and its meta when given (a dict as JSON, text as it is)."""
    store.put(keys.tool_code(name), code)
    if meta is not None:
        store.put(keys.tool_meta(name), meta if isinstance(meta, str) else json.dumps(meta))


# --- ports, processes and metrics -----------------------------------------------------------------

def free_port() -> int:
    """A loopback port nothing listens on (just now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """Stop a server a test started: SIGTERM, then SIGKILL if it has not gone in ten seconds."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def samples(text: str) -> dict[tuple, float]:
    """Prometheus's text format as {(name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(port: int) -> dict[tuple, float]:
    return samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


class Recorder:
    """A stand-in for karma's ``record``: keeps every (event, fields) it is given."""

    def __init__(self):
        self.entries: list[tuple[str, dict]] = []

    def __call__(self, event, **fields):
        self.entries.append((event, fields))

    def of(self, event):
        return [f for e, f in self.entries if e == event]


# --- daemons (`brainstem run` subprocesses) ------------------------------------------------------

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


# --- the sandbox: a stand-in for the runtime's services, tool source, and the canaries -----------

CANARY_ENV_NAME = "BRAINSTEM_CANARY_ENV"
CANARY_ENV = "canary-env-7f3a1c"
CANARY_FILE_TEXT = "canary-file-91b2e4"
CANARY_KV_SECRET = "canary-kv-secret-55c1d9"
CANARY_KV_OTHER = "canary-kv-other-a8d07b"
CANARY_TOKEN = "canary-token-3e6f0a"
CANARIES = (CANARY_ENV, CANARY_FILE_TEXT, CANARY_KV_SECRET, CANARY_KV_OTHER, CANARY_TOKEN)

TRIVIAL = "def execute(args, ctx):\n    return {'ok': args}\n"


class FakeServices:
    """A stand-in for the runtime side of ctx; records every call."""

    def __init__(self, kv_access="none", secrets=None, kv=None, fetch_result=None, fail=None):
        self.kv_access = kv_access
        self.secrets = dict(secrets or {})
        self.kv = dict(kv or {})
        self.fetch_result = fetch_result or {"status": 200, "headers": {"content-type": "text/plain"},
                                             "text": "hello", "json": None}
        self.fail = fail or {}
        self.calls: list[tuple] = []
        self.logs: list[str] = []
        # Something a tool must never reach: it lives only in this process.
        self._token = CANARY_TOKEN

    def _maybe_fail(self, name):
        if name in self.fail:
            raise self.fail[name]

    def kv_get(self, key):
        self.calls.append(("kv_get", key))
        self._maybe_fail("kv_get")
        return self.kv.get(key)

    def kv_put(self, key, value):
        self.calls.append(("kv_put", key, value))
        self._maybe_fail("kv_put")
        self.kv[key] = value

    def kv_list(self, prefix):
        self.calls.append(("kv_list", prefix))
        self._maybe_fail("kv_list")
        return sorted(k for k in self.kv if k.startswith(prefix))

    def kv_delete(self, key):
        self.calls.append(("kv_delete", key))
        self._maybe_fail("kv_delete")
        return self.kv.pop(key, None) is not None

    def fetch(self, url, method, headers, json, data, timeout):
        self.calls.append(("fetch", url, method, headers, json, data, timeout))
        self._maybe_fail("fetch")
        return self.fetch_result

    def log(self, message):
        self.calls.append(("log", message))
        self._maybe_fail("log")
        self.logs.append(message)


def tool(body: str, prelude: str = "", entry: str = "execute", params: str = "args, ctx") -> str:
    """Build tool source: optional module-level prelude, then `def entry(params):` + body."""
    return textwrap.dedent(prelude) + f"\ndef {entry}({params}):\n" + textwrap.indent(
        textwrap.dedent(body).strip("\n"), "    "
    ) + "\n"


def assert_runtime_healthy():
    from brainstem.sandbox import Limits, run

    o = run(TRIVIAL, "execute", [1], services=FakeServices(), limits=Limits(timeout_ms=5000))
    assert o.ok, o
    assert o.value == {"ok": 1}
