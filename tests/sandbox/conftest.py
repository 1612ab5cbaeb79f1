"""Shared fixtures for the sandbox tests: fake services and the canaries."""

from __future__ import annotations

import os
import textwrap

import pytest

from brainstem.sandbox import Limits, run

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
    o = run(TRIVIAL, "execute", [1], services=FakeServices(), limits=Limits(timeout_ms=5000))
    assert o.ok, o
    assert o.value == {"ok": 1}


@pytest.fixture
def services():
    return FakeServices()


@pytest.fixture(scope="session")
def canaries(tmp_path_factory):
    """Plant the canaries: an env var in this (runtime) process, a file, a fake KV."""
    os.environ[CANARY_ENV_NAME] = CANARY_ENV
    path = tmp_path_factory.mktemp("canary") / "canary.txt"
    path.write_text(CANARY_FILE_TEXT)
    os.chmod(path, 0o644)
    os.chmod(path.parent, 0o755)
    yield {"file": str(path)}
