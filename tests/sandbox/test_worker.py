"""Resource limits, worker lock-down as seen from /proc, and no orphans after the runtime dies."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from brainstem.sandbox import Limits, run, server_pid
from tests.helpers import FakeServices, assert_runtime_healthy, tool
from tests.sandbox.procfs import PROC, children, descendants, stat, wait_for

REPO = str(Path(__file__).resolve().parents[2])
pytestmark = pytest.mark.skipif(not PROC.is_dir(), reason="needs /proc (Linux)")


def _alive(pid: int, starttime: int) -> bool:
    st = stat(pid)
    return st is not None and st[5] == starttime and st[1] not in ("Z", "X")


@pytest.mark.slow
def test_cpu_bound_tool_killed_within_timeout():
    code = tool("""
        n = 0
        while True:
            n = (n * 31 + 7) % 1000003
    """)
    t = time.monotonic()
    o = run(code, "execute", [{}], services=FakeServices(), limits=Limits(timeout_ms=1500))
    elapsed = time.monotonic() - t
    assert not o.ok and o.error == "timed out after 1500 ms"
    assert elapsed < 1.5 + 1.0
    assert_runtime_healthy()


def test_pow_bomb_killed():
    t = time.monotonic()
    o = run(tool("return pow(7, 10 ** 12)"), "execute", [{}], services=FakeServices(),
            limits=Limits(timeout_ms=500))
    assert not o.ok and ("timed out" in o.error or "memory limit" in o.error)
    assert time.monotonic() - t < 1.5


def test_memory_bomb_stops_at_cap():
    o = run(tool("x = [0] * (10 ** 10)\nreturn 1"), "execute", [{}], services=FakeServices(),
            limits=Limits(timeout_ms=5000, memory_mb=128))
    assert not o.ok and o.error == "memory limit (128 MB) exceeded"
    assert_runtime_healthy()


def test_worker_lockdown_seen_from_proc():
    """While a tool sleeps, inspect its worker: env, fds, uid, rlimits, process group."""
    limits = Limits(timeout_ms=4000, memory_mb=300)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "o", run("import time\ndef execute(args, ctx):\n    time.sleep(1.0)\n    return 'done'\n",
                 "execute", [{}], services=FakeServices(), limits=limits)))
    assert run("def execute(a, c):\n    return 1\n", "execute", [{}], services=FakeServices()).ok
    t.start()
    srv = server_pid()
    assert srv
    workers = wait_for(lambda: [p for p in children(srv) if (stat(p) or ("",))[0] == "brainstem-tool"], 2.0)
    assert workers, "worker not found"
    pid = workers[0]
    base = PROC / str(pid)
    environ = (base / "environ").read_bytes()
    fds = sorted(os.listdir(base / "fd"))
    status = (base / "status").read_text()
    limits_text = (base / "limits").read_text()
    comm, state, ppid, pgrp, session, _ = stat(pid)
    t.join(5)
    assert result["o"].ok and result["o"].value == "done"

    assert environ == b""  # exec'd env of the fork server is empty; the worker also clears os.environ
    assert fds == ["3"]  # only the channel
    assert ppid == srv and pgrp == pid and session == pid  # own session / process group
    assert "NoNewPrivs:\t1" in status
    if os.geteuid() == 0:
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == ["65534"] * 4

    def limit(name: str) -> str:
        line = next(line for line in limits_text.splitlines() if line.startswith(name))
        return line[len(name):].split()[0]

    assert limit("Max address space") == str(300 * 1024 * 1024)
    assert limit("Max file size") == "0"
    assert limit("Max processes") == "0"
    assert limit("Max open files") == "8"
    assert limit("Max core file size") == "0"
    assert limit("Max cpu time") == str(math.ceil(4000 / 1000) + 1)


@pytest.mark.slow
def test_no_worker_survives_sigkill_of_runtime():
    marker = f"brainstem-orphan-test-{os.getpid()}-{time.time_ns()}"
    script = (
        "import sys\n"
        f"sys.path.insert(0, {REPO!r})\n"
        "from brainstem.sandbox import run, Limits\n"
        "class S:\n"
        "    secrets = {}\n"
        "    kv_access = 'none'\n"
        "print('ready', flush=True)\n"
        "run('def execute(args, ctx):\\n    while True:\\n        pass\\n', 'execute', [{}],\n"
        "    services=S(), limits=Limits(timeout_ms=120000))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, marker], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout.readline().strip() == b"ready"

        def spinning_worker():
            desc = descendants(proc.pid)
            names = {p: (stat(p) or ("",))[0] for p in desc}
            if "brainstem-tool" in names.values() and "brainstem-fsrv" in names.values():
                return desc
            return None

        desc = wait_for(spinning_worker, 10.0)
        assert desc, "runtime subprocess never started a worker"
        # The fork server and the worker, identified by ancestry (exact) and
        # remembered with their start times (so a reused pid cannot confuse us).
        tracked = {p: stat(p)[5] for p in desc if stat(p)}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        survivors = wait_for(lambda: not [p for p, st in tracked.items() if _alive(p, st)], 2.0)
        assert survivors, f"left behind: {[p for p, st in tracked.items() if _alive(p, st)]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_locked_down_process_cannot_fork_or_write_files(tmp_path):
    """Even given `os` (which tool code never gets), a locked-down worker cannot
    fork (RLIMIT_NPROC 0; as root the worker first drops to nobody, since the
    kernel never enforces RLIMIT_NPROC for uid 0) nor write a byte (RLIMIT_FSIZE 0)."""
    from brainstem.sandbox import worker
    from brainstem.sandbox.kernel import caps, lockdown

    os.chmod(tmp_path, 0o777)
    target = str(tmp_path / "written")
    r, w = os.pipe()
    parent = os.getpid()
    nobody = os.geteuid() == 0 and not caps.uid_switch_error()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            # The rlimits alone: seccomp and Landlock would refuse both before the limits are reached.
            lockdown.use(lockdown.Plan(nobody, True, None, None))
            worker._lock_down(w, parent, 2000, 256)
            report = []
            try:
                child = os.fork()
                if child == 0:
                    os._exit(0)
                report.append("forked")
            except OSError as e:
                report.append(f"fork:{e.errno}")
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    os.write(fd, b"x")
                    report.append("wrote")
                except OSError as e:
                    report.append(f"write:{e.errno}")
            except OSError as e:
                report.append(f"open:{e.errno}")
            os.write(worker.CHANNEL_FD, ",".join(report).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1024):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    import errno

    fork_result, write_result = data.decode().split(",")
    assert fork_result == f"fork:{errno.EAGAIN}"
    assert write_result in (f"write:{errno.EFBIG}", f"open:{errno.EACCES}")
    assert not os.path.exists(target) or os.path.getsize(target) == 0
