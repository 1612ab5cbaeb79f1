"""``ctx.fetch`` never reaches the runtime's own listening ports (dashboard, metrics), even with loopback allowed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from brainstem.core import keys
from brainstem.sandbox import own_ports
from brainstem.state.guarded import AgentKV
from brainstem.store import open_store
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import run_tool
from tests.doubles.hostile import Host

FETCH = "def execute(a, ctx):\n    try:\n        return ctx.fetch(a['url'])['status']\n    except Exception as e:\n" \
        "        return 'error: ' + str(e)\n"


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    store.put(keys.tool_code("f"), FETCH)
    store.put(keys.tool_meta("f"), json.dumps({}))

    def fetch(url: str):
        out = run_tool("f", {"url": url}, store=store, agent_kv=AgentKV(store), record=lambda *a, **k: None,
                       policy=ToolPolicy(fetch_allow=["127.0.0.1", "localhost"]))
        assert out.ok, out.error
        return out.value

    yield fetch
    store.close()


def test_the_metrics_port_of_this_process_is_refused(run):
    from brainstem.operator.metrics import Metrics, serve

    other = Host("127.0.0.1")
    server, _thread = serve(Metrics(), 0)
    try:
        port = server.server_port
        assert run(other.base + "/") == 200  # loopback is allowed here
        for url in (f"http://127.0.0.1:{port}/metrics", f"http://localhost:{port}/metrics",  # 127.0.0.2: not allowed
                    f"http://127.0.0.2:{port}/metrics"):
            out = run(url)
            assert out.startswith("error: ") and ("runtime itself listens on" in out or "loopback" in out), (url, out)
    finally:
        server.shutdown()
        other.close()


def test_a_dashboard_in_another_process_is_refused_while_it_runs(run, tmp_path):
    other = Host("127.0.0.1")
    port = int(other.base.rsplit(":", 1)[1])
    code = ("import sys, time; from brainstem.sandbox import own_ports; own_ports.register(int(sys.argv[1])); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True,
                            env={"XDG_STATE_HOME": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert "runtime itself listens on" in run(other.base + "/")
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while port in own_ports.ports() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run(other.base + "/") == 200  # its process is gone: an ordinary loopback port again
    other.close()
