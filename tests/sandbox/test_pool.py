"""The pool: workers forked and locked down before a call needs them, each still used for one call.

Seen from /proc: a waiting worker already has every protection; a call runs
in a worker that was waiting; it then dies and no other call sees it; the
job's limits lower the worker's; its clock starts with the call; a drained
or disabled pool leaves no worker; an escaped tool cannot reach a waiting
worker.  Also the compiled-code cache the workers' jobs carry.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from brainstem.sandbox import Limits, compiled, pool, run, server_pid
from brainstem.sandbox.kernel import caps
from tests.helpers import FakeServices, assert_runtime_healthy, tool
from tests.sandbox.procfs import PROC, comm, named, read_memory, stat, wait_for

pytestmark = pytest.mark.skipif(not PROC.is_dir(), reason="needs /proc (Linux)")

REPO = str(Path(__file__).resolve().parents[2])
ROOT = os.geteuid() == 0
SLEEPER = "import time\ndef execute(args, ctx):\n    time.sleep(args['s'])\n    return 'done'\n"


@pytest.fixture(autouse=True)
def a_pool_of_two():
    pool.configure(2)
    yield
    pool.drain()
    # A drained worker exits on its own time; the next test must not mistake it for one of its own.
    assert wait_for(lambda: not named("brainstem-idle"), 5.0), "drained workers still waiting"
    pool.configure(pool.DEFAULT_SIZE)


def _waiting(n: int = 1) -> list[int]:
    """The pids of at least ``n`` workers waiting for a job (after a call has filled the pool)."""
    pids = wait_for(lambda: (lambda found: found if len(found) >= n else None)(named("brainstem-idle")), 5.0)
    assert pids, "no waiting worker"
    return pids


def _status(pid: int) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in (PROC / str(pid) / "status").read_text()
                                         .splitlines())}


def _limit(pid: int, name: str) -> str:
    line = next(line for line in (PROC / str(pid) / "limits").read_text().splitlines() if line.startswith(name))
    return line[len(name):].split()[0]


SLEEPER_LIMITS = Limits(timeout_ms=5000)


def _sleeping_call(seconds: float, limits: Limits = SLEEPER_LIMITS):
    """Start a sleeping tool in a thread; return (thread, result dict, the pid of the worker running it)."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "o", run(SLEEPER, "execute", [{"s": seconds}], services=FakeServices(), limits=limits)))
    t.start()
    running = wait_for(lambda: named("brainstem-tool"), 3.0)
    assert running, "no running worker"
    return t, result, running[0]


def test_a_call_runs_in_a_worker_that_was_waiting_for_it():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok  # fills the pool
    waiting = set(_waiting(2))
    t, result, pid = _sleeping_call(0.5)
    assert pid in waiting
    t.join(10)
    assert result["o"].ok and result["o"].value == "done"


def test_a_waiting_worker_is_locked_down_before_it_has_a_job():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    pid = _waiting()[0]
    status = _status(pid)
    assert status["NoNewPrivs"] == "1"
    if status.get("Seccomp") is not None and os.path.exists("/proc/self/status"):
        assert status["Seccomp"] in ("0", "2")
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    if ROOT and not caps.uid_switch_error():
        assert status["Uid"].split() == ["65534"] * 4
    assert (PROC / str(pid) / "environ").read_bytes() == b""
    assert sorted(os.listdir(PROC / str(pid) / "fd")) == ["3"]  # its channel, nothing else
    assert _limit(pid, "Max processes") == "0" and _limit(pid, "Max file size") == "0"
    assert _limit(pid, "Max open files") == "8" and _limit(pid, "Max core file size") == "0"
    assert _limit(pid, "Max address space") == str(Limits().memory_mb * 1024 * 1024)
    _, _, ppid, pgrp, session, _ = stat(pid)
    assert ppid == server_pid() and pgrp == pid and session == pid


def test_every_protection_a_running_worker_has_a_waiting_one_has_too():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    t, result, pid = _sleeping_call(1.0)
    waiting_pid = next(p for p in _waiting() if p != pid)
    waiting, running = _status(waiting_pid), _status(pid)
    net = os.readlink(f"/proc/{pid}/ns/net"), os.readlink(f"/proc/{waiting_pid}/ns/net")
    t.join(10)
    for field in ("Seccomp", "Seccomp_filters", "NoNewPrivs", "CapEff", "CapPrm", "CapBnd", "Uid", "Gid"):
        assert waiting.get(field) == running.get(field), field
    assert net[0] == net[1]  # the same namespace, whichever the host allowed
    assert result["o"].ok


def test_a_worker_runs_one_call_then_is_gone():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    seen = []
    for _ in range(3):
        t, result, pid = _sleeping_call(0.3)
        t.join(10)
        assert result["o"].ok, result
        seen.append(pid)
        assert wait_for(lambda p=pid: not (PROC / str(p)).exists() or (stat(p) or ("", "Z"))[1] == "Z", 5.0), \
            f"worker {pid} still there after its call: {stat(pid)}"
    assert len(set(seen)) == 3, seen


def test_nothing_of_one_call_reaches_the_next():
    """The random generator a tool may seed: its state does not carry to the next call, and workers
    forked from one server do not share a sequence."""
    seeded = run(tool("random.seed(42)\nreturn random.random()", prelude="import random"), "execute", [{}],
                 services=FakeServices())
    assert seeded.ok, seeded
    draws = [run(tool("return random.random()", prelude="import random"), "execute", [{}],
                 services=FakeServices()).value for _ in range(4)]
    assert seeded.value not in draws and len(set(draws)) == 4


def test_code_and_secrets_reach_only_the_worker_that_runs_them():
    """A job goes from the runtime straight to its worker: the fork server, and the workers still
    waiting for a later call, never hold its code or its secrets."""
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    code_mark, secret = f"code-mark-{os.urandom(8).hex()}", f"secret-value-{os.urandom(8).hex()}"
    source = (f"import time\ndef execute(args, ctx):\n    held = ctx.secrets['K']\n    time.sleep(1.0)\n"
              f"    return {code_mark!r}\n")
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "o", run(source, "execute", [{}], services=FakeServices(secrets={"K": secret}), limits=SLEEPER_LIMITS)))
    t.start()
    running = wait_for(lambda: named("brainstem-tool"), 3.0)
    assert running, "no running worker"
    time.sleep(0.3)  # the job is in, the worker asleep with its secret in hand
    others = [server_pid(), *(p for p in _waiting(2) if p != running[0])]
    memory = {pid: read_memory(pid) for pid in [running[0], *others]}
    t.join(10)
    assert result["o"].ok and result["o"].value == code_mark
    assert code_mark.encode() in memory[running[0]] and secret.encode() in memory[running[0]]  # the reading works
    for pid in others:
        assert memory[pid], pid
        assert code_mark.encode() not in memory[pid] and secret.encode() not in memory[pid], (pid, comm(pid))


def test_the_job_lowers_the_limits_the_worker_waited_with():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    t, result, pid = _sleeping_call(0.6, Limits(timeout_ms=2000, memory_mb=300))
    address_space, cpu = _limit(pid, "Max address space"), _limit(pid, "Max cpu time")
    t.join(10)
    assert result["o"].ok
    assert address_space == str(300 * 1024 * 1024)
    assert cpu == "3"  # 2 s of timeout and one to spare, counted from the job


def test_a_call_asking_more_memory_than_the_pool_gets_a_worker_of_its_own():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices(), limits=Limits(memory_mb=256)).ok
    _waiting(2)
    t, result, pid = _sleeping_call(0.5, Limits(timeout_ms=5000, memory_mb=512))
    address_space = _limit(pid, "Max address space")
    t.join(10)
    assert result["o"].ok and address_space == str(512 * 1024 * 1024)


def test_the_clock_starts_with_the_call_not_the_fork():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    _waiting(2)
    time.sleep(1.2)  # the waiting workers are older than the call's whole timeout
    o = run(SLEEPER, "execute", [{"s": 0.3}], services=FakeServices(), limits=Limits(timeout_ms=1000))
    assert o.ok, o
    t0 = time.monotonic()
    o = run(SLEEPER, "execute", [{"s": 5}], services=FakeServices(), limits=Limits(timeout_ms=800))
    assert not o.ok and o.error == "timed out after 800 ms"
    assert 0.7 < time.monotonic() - t0 < 2.5


def test_drain_and_a_pool_of_zero_leave_no_waiting_worker():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    _waiting(2)
    pool.drain()
    assert wait_for(lambda: not named("brainstem-idle"), 3.0)
    pool.configure(0)
    assert run(tool("return 2"), "execute", [{}], services=FakeServices()).ok
    time.sleep(0.3)
    assert not named("brainstem-idle") and pool.ready() == []


def test_the_pool_is_given_back_only_when_its_last_user_leaves():
    """Two users at once (two sessions of one daemon): the first to leave takes nothing from the other,
    whose next call is served by a worker that was waiting; the last to leave drains the pool."""
    pool.drain()
    with pool.use(2):
        with pool.use(3):  # a later user shares the pool as its first user sized it
            assert pool.users() == 2 and pool.size() == 2
            assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
            waiting = set(_waiting(2))
        assert pool.users() == 1 and len(pool.ready()) == 2
        t, result, pid = _sleeping_call(0.3)
        t.join(10)
        assert result["o"].ok and pid in waiting
    assert pool.users() == 0 and pool.ready() == []
    assert wait_for(lambda: not named("brainstem-idle"), 3.0)


def test_pool_size_is_bounded():
    for bad in (-1, pool.MAX_SIZE + 1):
        with pytest.raises(ValueError):
            pool.configure(bad)


def test_a_dead_fork_server_takes_its_waiting_workers_and_the_next_call_still_runs():
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    waiting = _waiting(2)
    os.kill(server_pid(), signal.SIGKILL)
    assert wait_for(lambda: all(not (PROC / str(p)).exists() for p in waiting), 5.0)
    o = run(tool("return 2"), "execute", [{}], services=FakeServices())
    assert o.ok and o.value == 2, o
    assert_runtime_healthy()


def test_concurrent_calls_each_get_their_own_worker():
    from concurrent.futures import ThreadPoolExecutor

    code = "def execute(args, ctx):\n    ctx.log(str(args))\n    return args * 3\n"
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda i: run(code, "execute", [i], services=FakeServices()), range(40)))
    assert [o.value for o in outs] == [i * 3 for i in range(40)]


# --------------------------------------------------------------------------- an escaped tool


def test_escaped_tool_code_cannot_reach_a_waiting_worker(tmp_path):
    """A waiting worker will get another call's job (and secrets): a tool that escaped the interpreter
    must not be able to signal, trace or read it."""
    from tests.sandbox.kernel.test_setup import ARCH, _attempt, _locked_child

    if ARCH is None:
        pytest.skip("no seccomp syscall table for this machine")
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok
    target = _waiting()[0]
    libc = ctypes.CDLL(None, use_errno=True)

    def body(out):
        out["kill"] = _attempt(lambda: os.kill(target, signal.SIGKILL))
        out["mem"] = _attempt(lambda: os.close(os.open(f"/proc/{target}/mem", os.O_RDWR)))
        r = libc.ptrace(16, target, None, None)  # PTRACE_ATTACH
        out["ptrace"] = "ok" if r == 0 else errno.errorcode.get(ctypes.get_errno(), "?")

    out, status = _locked_child(body, tmp_path, as_fork_server_does=True)
    assert "crash" not in out, out
    assert out["kill"] == "EPERM" and out["ptrace"] == "EPERM"
    assert out["mem"] != "ok"
    assert target in named("brainstem-idle")  # untouched, still waiting
    assert run(tool("return 3"), "execute", [{}], services=FakeServices()).ok


# --------------------------------------------------------------------------- compiled code


def test_the_first_call_of_a_source_keeps_its_compiled_code_and_the_next_uses_it():
    compiled.clear()
    source = tool("return {'doubled': args['n'] * 2}")
    assert compiled.get(compiled.key(source)) is None
    o = run(source, "execute", [{"n": 4}], services=FakeServices())
    assert o.ok and o.value == {"doubled": 8}
    assert compiled.get(compiled.key(source))
    o = run(source, "execute", [{"n": 5}], services=FakeServices())
    assert o.ok and o.value == {"doubled": 10}


def test_code_that_does_not_compile_is_not_kept_and_errors_keep_their_line():
    compiled.clear()
    bad = "def execute(args, ctx):\n    return args.__class__\n"
    o = run(bad, "execute", [{}], services=FakeServices())
    assert not o.ok and "not allowed" in o.error
    assert compiled.get(compiled.key(bad)) is None
    failing = tool("x = 1\nraise ValueError('boom')")
    for _ in range(2):  # compiled, then loaded: the error names the same line
        o = run(failing, "execute", [{}], services=FakeServices())
        assert not o.ok and o.error.startswith("ValueError: boom (line ")
    assert compiled.get(compiled.key(failing))


def test_the_cache_takes_only_text_blobs_and_stays_bounded():
    compiled.clear()
    compiled.put("k", b"bytes")
    compiled.put("k", "")
    compiled.put("k", "x" * (compiled.MAX_BLOB_CHARS + 1))
    assert compiled.get("k") is None
    for i in range(compiled.MAX_ENTRIES + 10):
        compiled.put(f"k{i}", "blob")
    assert compiled.get("k0") is None and compiled.get(f"k{compiled.MAX_ENTRIES + 9}") == "blob"
    compiled.clear()


def test_a_worker_cannot_choose_what_is_kept_for_another_source():
    """The key is the runtime's hash of the source it sent; a later frame claiming code is ignored."""
    compiled.clear()
    source = tool("return 7")
    assert run(source, "execute", [{}], services=FakeServices()).ok
    kept = compiled.get(compiled.key(source))
    other = tool("return 8")
    assert run(other, "execute", [{}], services=FakeServices()).value == 8
    assert compiled.get(compiled.key(source)) == kept


# --------------------------------------------------------------------------- an idle runtime


def test_an_asleep_wake_starts_no_pool(tmp_path):
    """`brainstem wake` for an agent that is asleep imports nothing of the sandbox."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    env.update(BRAINSTEM_KV=url, OPENROUTER_API_KEY="sk-test")
    subprocess.run([sys.executable, "-m", "brainstem", "seed"], env=env, cwd=REPO, check=True,
                   capture_output=True, timeout=60)
    from brainstem.core import keys
    from brainstem.store import open_store

    store = open_store(url)
    wake_config = store.get_json(keys.WAKE_CONFIG) or {}
    store.put(keys.WAKE_CONFIG, json.dumps({**wake_config, "next_wake_after": "2999-01-01T00:00:00Z"}))
    store.close()
    script = ("import sys\nsys.argv = ['brainstem', 'wake']\nfrom brainstem.__main__ import main\n"
              "try:\n    main()\nexcept SystemExit:\n    pass\n"
              "print('SANDBOX', sorted(m for m in sys.modules if m.startswith('brainstem.sandbox')))\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "SANDBOX []" in out.stdout, out
    store = open_store(url)
    assert store.get(keys.SESSION_COUNTER) is None  # it slept: no session ran
    store.close()
