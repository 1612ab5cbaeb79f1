"""The MCP client against real servers: ``mcp-server-time`` and ``mcp-server-fetch`` from PyPI (nobody here
wrote them), and small servers on the SDK's own server that fail, hang, crash, answer too much or echo
their credential (tests/doubles/mcp_server.py). Each ends honestly within the time it was given."""

from __future__ import annotations

import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from brainstem.core.mcp_config import parse, secret_values
from brainstem.store.karma import Redactor
from brainstem.tools.mcp_client import MAX_RESULT_CHARS, MCPServers

DOUBLE = str(Path(__file__).resolve().parent.parent / "doubles" / "mcp_server.py")
SECRET = "sk-mcp-probe-secret-4f9a2c7e1b"
BASICS = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LC_CTYPE"}  # LC_CTYPE: Python's own (PEP 538)


def double(mode: str, **extra) -> dict:
    return {"command": sys.executable, "args": [DOUBLE, mode], **extra}


def servers(**config) -> MCPServers:
    cfg = parse(json.dumps({"mcpServers": config}))
    return MCPServers(cfg, redact=Redactor(secret_values(cfg)))


def state_of(pid: int) -> str | None:
    """A process's state letter (Z: dead, not yet reaped), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.slow
def test_a_real_server_from_pypi_lists_and_answers():
    s = servers(time={"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]})
    try:
        listing = s.list_tools("time", 30)
        assert listing.error is None
        tools = {t["name"]: t for t in listing.tools}
        assert {"get_current_time", "convert_time"} <= set(tools)
        assert tools["get_current_time"]["input"]["required"] == ["timezone"]
        out = s.call_tool("time", "get_current_time", {"timezone": "Europe/Paris"}, 30)
        assert out.ok and out.value["timezone"] == "Europe/Paris" and out.value["datetime"][:2] == "20"
        bad = s.call_tool("time", "get_current_time", {"timezone": "Nowhere/Else"}, 30)
        assert not bad.ok and "Nowhere/Else" in bad.error
    finally:
        s.close()


@pytest.mark.slow
def test_the_fetch_server_from_pypi_reads_a_loopback_page(tmp_path):
    (tmp_path / "page.html").write_text("<html><body><h1>Loopback</h1><p>the quokka sleeps at noon</p></body></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(tmp_path), **k)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    s = servers(fetch={"command": sys.executable,
                       "args": ["-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips"]})
    try:
        out = s.call_tool("fetch", "fetch", {"url": f"http://127.0.0.1:{httpd.server_port}/page.html"}, 60)
        assert out.ok, out.error
        assert "the quokka sleeps at noon" in json.dumps(out.value)
    finally:
        s.close()
        httpd.shutdown()


@pytest.mark.slow
def test_a_stdio_server_runs_apart_and_ends_with_the_session():
    """Its own session and process group, only the basics of the environment and the operator's env, and
    nothing of it left once the session's servers are closed, what it started included."""
    os.environ["BRAINSTEM_SOMETHING_OF_OURS"] = "must-not-reach-the-server"
    try:
        s = servers(probe=double("probe", env={"PROBE_SECRET": SECRET}))
        who = s.call_tool("probe", "whoami", {}, 30)
        child = s.call_tool("probe", "spawn", {}, 30)
    finally:
        del os.environ["BRAINSTEM_SOMETHING_OF_OURS"]
    try:
        assert who.ok and child.ok, (who, child)
        me = json.loads(who.value) if isinstance(who.value, str) else who.value
        # under its keeper (the group's leader), apart from us
        assert me["pgid"] == me["sid"] == me["ppid"] != me["pid"] and me["pgid"] != os.getpgid(0)
        assert "mcp_launch.py" in Path(f"/proc/{me['ppid']}/cmdline").read_text()
        assert set(me["env"]) - BASICS == {"PROBE_SECRET", "BRAINSTEM_MCP_SERVER"}
        leaked = s.call_tool("probe", "leak", {}, 30)
        assert leaked.ok and SECRET not in json.dumps(leaked.value) and "[REDACTED:mcp:probe:env:PROBE_SECRET]" \
            in json.dumps(leaked.value)
    finally:
        s.close()
    pid = child.value["result"]
    deadline = time.monotonic() + 5
    while state_of(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state_of(pid) in (None, "Z")  # killed with its group, though its server had exited on its own
    assert state_of(me["pid"]) in (None, "Z")


@pytest.mark.slow
def test_failing_servers_are_one_line_each():
    s = servers(exits=double("exit"), fail=double("fail"), missing={"command": "/nonexistent/mcp-server"})
    try:
        t0 = time.monotonic()
        listed = s.list_all(20)
        assert "bad configuration" in listed["exits"].error and "\n" not in listed["exits"].error
        assert "No such file" in listed["missing"].error
        assert listed["fail"].error is None
        broken = s.call_tool("fail", "broken", {"what": "db"}, 20)
        assert not broken.ok and "broken" in broken.error
        crashed = s.call_tool("fail", "crash", {}, 20)
        assert not crashed.ok and "closed" in crashed.error.lower()
        again = s.call_tool("fail", "broken", {}, 20)  # the crashed server is started again for the next call
        assert not again.ok and "closed" not in again.error.lower()
        assert time.monotonic() - t0 < 20
    finally:
        s.close()


@pytest.mark.slow
def test_a_hanging_server_ends_within_the_time_given():
    s = servers(hang=double("hang"), deaf=double("no-start"))
    try:
        t0 = time.monotonic()
        out = s.call_tool("hang", "wait", {}, 1.5)
        took = time.monotonic() - t0
        assert not out.ok and "no answer" in out.error and "stopped" in out.error
        assert 1.4 < took < 3.5
        t0 = time.monotonic()
        deaf = s.call_tool("deaf", "anything", {}, 1.5)
        assert not deaf.ok and "did not finish starting" in deaf.error and time.monotonic() - t0 < 3.5
    finally:
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 10


@pytest.mark.slow
def test_a_huge_answer_is_cut_and_says_so():
    s = servers(huge=double("huge"))
    try:
        out = s.call_tool("huge", "big", {"n": 4}, 60)
        assert out.ok and isinstance(out.value, str)
        assert len(out.value) < MAX_RESULT_CHARS + 100 and out.value.endswith("more characters]")
    finally:
        s.close()


@pytest.mark.slow
def test_an_http_server_gets_its_headers_and_its_echo_of_them_is_redacted():
    from tests.helpers import free_port

    port = free_port()
    import subprocess

    proc = subprocess.Popen([sys.executable, DOUBLE, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        s = servers(web={"url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": f"Bearer {SECRET}"}})
        deadline = time.monotonic() + 20
        while True:
            listing = s.list_tools("web", 10)
            if listing.error is None or time.monotonic() > deadline:
                break
            s.close()  # not up yet: a new set of connections
            time.sleep(0.3)
            s = servers(web={"url": f"http://127.0.0.1:{port}/mcp",
                             "headers": {"Authorization": f"Bearer {SECRET}"}})
        assert listing.error is None, listing.error
        out = s.call_tool("web", "header", {}, 20)
        assert out.ok and SECRET not in json.dumps(out.value) and "REDACTED" in json.dumps(out.value)
        s.close()
    finally:
        proc.terminate()
        proc.wait(10)
