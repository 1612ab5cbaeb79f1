"""Kernel isolation of the workers (brainstem/sandbox/kernel/), checked on real processes.

* a running worker, seen from /proc: seccomp filter mode, its own network namespace;
* a process given the workers' lock-down and then raw Python (as if tool code
  had escaped RestrictedPython) cannot exec, make sockets, read files, touch
  another process's limits, priority, CPUs or I/O priority, signal it, or
  make any syscall off the allowlist;
* the fork server's capabilities are reduced;
* the report says what is on, and why anything is off;
* the runtime as a non-root user (user namespace), as uid 0 of a user
  namespace without uid 65534 (``unshare -rn``), and with user namespaces or
  Landlock refused (as in a container), still runs tools;
* a worker or fork server that cannot start says why.

The BPF program and the syscall table, on paper: test_seccomp.py.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import site
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from brainstem.sandbox import Limits, fork_client, report, run, server_pid, shutdown, worker
from brainstem.sandbox.kernel import caps, landlock, libc, lockdown, seccomp, setup, switch, syscalls
from tests import helpers
from tests.helpers import FakeServices, assert_runtime_healthy, tool
from tests.sandbox.procfs import PROC, children, descendants, read_all, stat, wait_for, write_all

REPO = str(helpers.REPO)
pytestmark = pytest.mark.skipif(not PROC.is_dir(), reason="needs /proc (Linux)")

ARCH, _ = seccomp.seccomp_arch()
LANDLOCK_ABI, _ = landlock.landlock_abi()
ROOT = os.geteuid() == 0
SLEEPER = "import time\ndef execute(args, ctx):\n    time.sleep(args['s'])\n    return 'done'\n"


# --------------------------------------------------------------------------- helpers


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def _kernel_can_unshare_net() -> bool:
    """Whether this process could make a network namespace (tried in a throwaway child)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        lib = ctypes.CDLL(None, use_errno=True)
        flags = libc.CLONE_NEWNET | (0 if ROOT else libc.CLONE_NEWUSER)
        os._exit(0 if lib.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


CAN_NETNS = _kernel_can_unshare_net()


SLEEPER_MB = 333  # tells the sleeping worker apart from any other child of the fork server


def _address_space_limit(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "limits").read_text().splitlines():
            if line.startswith("Max address space"):
                return int(line.split()[3])
    except (OSError, ValueError):
        pass
    return None


@pytest.fixture
def running_worker():
    """Start a sleeping tool in a thread; yield (worker pid, fork server pid); join it."""
    assert run(tool("return 1"), "execute", [{}], services=FakeServices()).ok  # server up
    result: dict = {}
    limits = Limits(timeout_ms=5000, memory_mb=SLEEPER_MB)
    t = threading.Thread(target=lambda: result.setdefault(
        "o", run(SLEEPER, "execute", [{"s": 1.0}], services=FakeServices(), limits=limits)))
    t.start()
    srv = server_pid()
    pids = wait_for(lambda: [p for p in children(srv) if (stat(p) or ("",))[0] == "brainstem-tool"
                              and _address_space_limit(p) == SLEEPER_MB << 20], 3.0)
    assert pids, "worker not found"
    yield pids[0], srv
    t.join(10)
    assert result["o"].ok and result["o"].value == "done", result.get("o")


# --------------------------------------------------------------------------- a running worker


@pytest.mark.skipif(ARCH is None, reason="no seccomp syscall table for this machine")
def test_running_worker_has_seccomp_filter(running_worker):
    pid, srv = running_worker
    status = _status(pid)
    assert status["Seccomp"] == "2"
    assert int(status["Seccomp_filters"]) >= 2  # the fork server's, inherited, and its own
    assert status["NoNewPrivs"] == "1"
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert _status(srv)["Seccomp"] == "2"


@pytest.mark.slow
def test_a_tool_run_from_the_command_line_runs_behind_seccomp_and_its_own_network(tmp_path):
    """Black box: `brainstem tool run` of a tool that sleeps, its worker looked at from outside."""
    from brainstem.core import keys
    from brainstem.store import open_store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = open_store(url)
    store.put(keys.tool_code("sleeper"), SLEEPER)
    store.put(keys.tool_meta("sleeper"), json.dumps({"timeout_ms": 10000}))
    store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    env["BRAINSTEM_KV"] = url
    proc = subprocess.Popen([sys.executable, "-m", "brainstem", "tool", "run", "sleeper", "--input", '{"s": 2.5}'],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        workers = wait_for(lambda: [p for p in descendants(proc.pid) if (stat(p) or ("",))[0] == "brainstem-tool"], 8.0)
        assert workers, "no worker"
        status = _status(workers[0])
        if ARCH:
            assert status["Seccomp"] == "2" and status["NoNewPrivs"] == "1"
        assert int(status["CapEff"], 16) == 0
        if CAN_NETNS:
            assert os.readlink(f"/proc/{workers[0]}/ns/net") != os.readlink("/proc/self/ns/net")
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and json.loads(out) == "done", err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


@pytest.mark.skipif(not CAN_NETNS, reason="this process cannot make a network namespace")
def test_running_worker_has_its_own_network_namespace(running_worker):
    pid, srv = running_worker
    ours = os.readlink("/proc/self/ns/net")
    theirs = os.readlink(f"/proc/{pid}/ns/net")
    assert theirs != ours
    assert os.readlink(f"/proc/{srv}/ns/net") == theirs  # one namespace, made once by the fork server
    # Nothing up in it, not even loopback (the interface list as the worker's namespace has it).
    dev = (PROC / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in dev] == ["lo"]
    if ROOT:  # ask the kernel, from inside that namespace, whether lo is up
        with socket.socket(fileno=_socket_in_ns(pid)) as s:
            res = fcntl.ioctl(s.fileno(), 0x8913, struct.pack("16sH14x", b"lo", 0))  # SIOCGIFFLAGS
            (if_flags,) = struct.unpack("16xH14x", res)
        assert if_flags & 0x1 == 0  # IFF_UP clear


def _socket_in_ns(pid: int) -> int:
    """A datagram socket created inside the network namespace of ``pid`` (via a forked setns child)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    child = os.fork()
    if child == 0:  # pragma: no cover - child
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            if lib.setns(fd, libc.CLONE_NEWNET) != 0:
                os._exit(2)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socket.send_fds(b, [b"s"], [s.fileno()])
            os._exit(0)
        finally:
            os._exit(3)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "could not enter the worker's namespace"
    _, fds, _, _ = socket.recv_fds(a, 16, 1)
    a.close()
    b.close()
    return fds[0]


@pytest.mark.skipif(not ROOT, reason="capabilities are dropped from a root fork server")
def test_fork_server_capabilities_reduced():
    assert_runtime_healthy()
    srv = server_pid()
    status, ours = _status(srv), _status(os.getpid())
    keep = (1 << 5) | (1 << 6) | (1 << 7)  # CAP_KILL, CAP_SETGID, CAP_SETUID
    assert int(status["CapEff"], 16) == keep & int(ours["CapEff"], 16)
    assert int(status["CapPrm"], 16) == keep & int(ours["CapPrm"], 16)
    assert int(status["CapBnd"], 16) == keep & int(ours["CapBnd"], 16)
    assert int(status["CapInh"], 16) == 0 and int(status["CapAmb"], 16) == 0
    assert int(ours["CapEff"], 16) & ~keep  # the runtime itself had more
    assert status["NoNewPrivs"] == "1"
    assert status["Uid"].split()[0] == "0"  # still root, with almost nothing of root's power


# --------------------------------------------------------------------------- an escaped tool


def _locked_child(body, tmp_path, as_fork_server_does: bool = False) -> tuple[dict, int]:
    """Fork; in the child run the workers' lock-down, then ``body(report)`` with raw Python.

    ``as_fork_server_does``: first what the fork server does to itself (Landlock, its seccomp
    filter), then the lock-down adding each worker's part, instead of one whole filter.
    ``body`` fills a dict that comes back as JSON; returns (dict, wait status).
    """
    r, w = os.pipe()
    parent = os.getpid()
    nobody = ROOT and not caps.uid_switch_error()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            if as_fork_server_does:
                libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
                if LANDLOCK_ABI:
                    landlock.Landlock(LANDLOCK_ABI).restrict()
                server, extra = seccomp.worker_filters(ARCH)
                server.install()
                lockdown.use(lockdown.Plan(nobody, False, None, extra))
            worker._lock_down(w, parent, 5000, 256)
            out: dict = {}
            try:
                body(out)
            except BaseException as e:  # noqa: BLE001
                out["crash"] = f"{type(e).__name__}: {e}"
            write_all(worker.CHANNEL_FD, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = read_all(r)
    _, status = os.waitpid(pid, 0)
    return (json.loads(data) if data else {}), status


def _attempt(fn) -> str:
    """'ok' or the errno name of the OSError that fn raised."""
    try:
        result = fn()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    if isinstance(result, socket.socket):
        result.close()
    return "ok"


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _raw(name: str, *args) -> str:
    nr = syscalls.SYSCALLS[name][syscalls.ARCHES[ARCH][0]]
    if nr is None:
        return "n/a"
    r = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


@pytest.mark.skipif(ARCH is None, reason="no seccomp syscall table for this machine")
def test_escaped_tool_code_cannot_reach_the_system(tmp_path, canaries):
    """Raw Python (no RestrictedPython at all) after the workers' lock-down."""
    os.chmod(tmp_path, 0o777)
    target = tmp_path / "written"
    own_file = tmp_path / "readable"
    own_file.write_text("x")
    os.chmod(own_file, 0o666)
    parent = os.getpid()
    setup.preload_codecs()  # as the fork server does: nothing can be imported after the lock-down

    def body(out):
        out["execv"] = _attempt(lambda: os.execv("/bin/true", ["true"]))
        out["socket_inet"] = _attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        out["socket_unix"] = _attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        out["socketpair"] = _attempt(lambda: socket.socketpair())
        out["etc_passwd"] = _attempt(lambda: open("/etc/passwd").read())
        out["canary"] = _attempt(lambda: open(canaries["file"]).read())
        out["world_readable"] = _attempt(lambda: open(own_file).read())
        out["listdir_root"] = _attempt(lambda: os.listdir("/"))
        out["proc_parent"] = _attempt(lambda: open(f"/proc/{parent}/environ", "rb").read())
        out["create"] = _attempt(lambda: open(target, "w"))
        out["chmod"] = _attempt(lambda: os.chmod(own_file, 0o777))
        out["unlink"] = _attempt(lambda: os.unlink(own_file))
        out["mkdir"] = _attempt(lambda: os.mkdir(tmp_path / "d"))
        out["symlink"] = _attempt(lambda: os.symlink("/etc/passwd", tmp_path / "l"))
        out["kill_parent"] = _attempt(lambda: os.kill(parent, 0))
        out["setuid"] = _attempt(lambda: os.setuid(0))
        out["fork"] = _attempt(lambda: os.fork())
        out["ptrace"] = _raw("ptrace", 16, parent, 0, 0)  # PTRACE_ATTACH
        out["process_vm_readv"] = _raw("process_vm_readv", parent, 0, 0, 0, 0, 0)
        out["unshare_user"] = _raw("unshare", libc.CLONE_NEWUSER)
        out["unshare_net"] = _raw("unshare", libc.CLONE_NEWNET)
        out["setns"] = _raw("setns", 0, 0)
        out["mount"] = _raw("mount", None, None, None, 0, None)
        out["chroot"] = _raw("chroot", ctypes.c_char_p(b"/"))
        out["clone_newuser"] = _raw("clone", libc.CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)
        out["clone3"] = _raw("clone3", 0, 0)
        out["bpf"] = _raw("bpf", 0, 0, 0)
        out["perf_event_open"] = _raw("perf_event_open", 0, 0, -1, -1, 0)
        out["io_uring_setup"] = _raw("io_uring_setup", 1, 0)
        out["userfaultfd"] = _raw("userfaultfd", 0)
        out["keyctl"] = _raw("keyctl", 0, 0, 0, 0, 0)
        out["add_key"] = _raw("add_key", 0, 0, 0, 0, 0)
        out["personality"] = _raw("personality", 0xFFFFFFFF)
        out["memfd_create"] = _raw("memfd_create", ctypes.c_char_p(b"x"), 0)
        out["shmget"] = _raw("shmget", 0, 4096, 0o1600)
        out["init_module"] = _raw("init_module", 0, 0, 0)
        out["open_by_handle_at"] = _raw("open_by_handle_at", 0, 0, 0)
        out["unknown_syscall"] = _raw_nr(syscalls.UNKNOWN_SYSCALL)
        # What a worker does need still works.
        out["getpid"] = os.getpid()
        out["json"] = json.loads(json.dumps({"a": [1, 2]}))
        out["time"] = time.time() > 0
        out["encode"] = "é€".encode("utf-16-le").hex() + "é".encode("cp437").hex() + "x".encode("shift_jis").hex()

    out, status = _locked_child(body, tmp_path)
    assert os.WIFEXITED(status), status
    assert "crash" not in out, out.get("crash")
    eperm = {"execv", "socket_inet", "socket_unix", "socketpair", "chmod", "unlink", "mkdir", "symlink",
             "kill_parent", "setuid", "fork", "unknown_syscall", "ptrace", "process_vm_readv", "unshare_user",
             "unshare_net", "setns", "mount", "chroot", "clone_newuser", "bpf", "perf_event_open",
             "io_uring_setup", "userfaultfd", "keyctl", "add_key", "personality", "memfd_create", "shmget",
             "init_module", "open_by_handle_at"}
    for name in sorted(eperm):
        assert out[name] == "EPERM", (name, out[name])
    assert out["clone3"] == "ENOSYS"
    assert out["create"] == "EACCES"
    assert not target.exists() and own_file.exists()
    unreadable = {"EACCES"} if LANDLOCK_ABI else {"EACCES", "ENOENT", "ok"}
    for name in ("etc_passwd", "canary", "world_readable", "listdir_root", "proc_parent"):
        assert out[name] in unreadable, (name, out[name])
    assert out["getpid"] > 0 and out["json"] == {"a": [1, 2]} and out["time"] is True
    assert out["encode"] == "e900ac20" + "82" + "78"


def _other_process_calls(parent: int):
    """A body trying, on ``parent``, what reaches another process: each with values that change
    nothing (its own nice value, CPU mask and I/O priority, signal 0) should it get through."""
    nice = os.getpriority(os.PRIO_PROCESS, parent)
    cpus = os.sched_getaffinity(parent)
    mask = ctypes.create_string_buffer(sum(1 << c for c in cpus).to_bytes(128, "little"), 128)
    ioprio_get = {"x86_64": 252, "aarch64": 31}[ARCH]
    ioprio = _libc.syscall(ctypes.c_long(ioprio_get), ctypes.c_long(1), ctypes.c_long(parent))  # IOPRIO_WHO_PROCESS

    def body(out):
        limit = ctypes.create_string_buffer(16)
        param = ctypes.c_int(0)
        out["prlimit64_self"] = _raw("prlimit64", 0, 7, None, limit)  # RLIMIT_NOFILE, read only
        out["prlimit64"] = _raw("prlimit64", parent, 7, None, limit)
        out["setpriority"] = _raw("setpriority", 0, parent, nice)  # PRIO_PROCESS
        out["sched_setaffinity"] = _raw("sched_setaffinity", parent, 128, mask)
        out["sched_setparam"] = _raw("sched_setparam", parent, ctypes.byref(param))
        out["ioprio_set"] = _raw("ioprio_set", 1, parent, ioprio)
        out["kill"] = _raw("kill", parent, 0)
        out["tgkill"] = _raw("tgkill", parent, parent, 0)
        out["pidfd_open"] = _raw("pidfd_open", parent, 0)
        out["unknown_syscall"] = _raw_nr(syscalls.UNKNOWN_SYSCALL)
        out["just_past_the_table"] = _raw_nr(max(n for nrs in syscalls.SYSCALLS.values() for n in nrs if n) + 1)
    return body


OTHER_PROCESS_CALLS = ("prlimit64", "setpriority", "sched_setaffinity", "sched_setparam", "ioprio_set", "kill",
                       "tgkill", "pidfd_open")


@pytest.mark.skipif(ARCH is None, reason="no seccomp syscall table for this machine")
@pytest.mark.parametrize("as_fork_server_does", [False, True], ids=["one filter", "fork server's two"])
def test_escaped_tool_code_cannot_touch_other_processes(tmp_path, as_fork_server_does):
    """Limits, priority, CPU affinity, I/O priority, signals of the parent (the runtime, or a sibling
    worker as root): EPERM, and so is any syscall not on the allowlist."""
    parent = os.getpid()
    out, status = _locked_child(_other_process_calls(parent), tmp_path, as_fork_server_does)
    assert os.WIFEXITED(status) and "crash" not in out, (status, out)
    for name in (*OTHER_PROCESS_CALLS, "unknown_syscall", "just_past_the_table"):
        assert out[name] == "EPERM", (name, out[name])
    assert out["prlimit64_self"] == "ok"  # its own limits it may read


@pytest.mark.skipif(ARCH is None, reason="no seccomp syscall table for this machine")
def test_other_process_calls_reach_the_parent_without_the_filter():
    """The control for the test above: the same calls from an unfiltered child do get through."""
    r, w = os.pipe()
    body = _other_process_calls(os.getpid())
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            out: dict = {}
            body(out)
            write_all(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = json.loads(read_all(r))
    os.waitpid(pid, 0)
    assert {name: out[name] for name in OTHER_PROCESS_CALLS} == dict.fromkeys(OTHER_PROCESS_CALLS, "ok")
    assert out["unknown_syscall"] == "ENOSYS"


def _raw_nr(nr: int) -> str:
    r = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(0))
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


@pytest.mark.skipif(ARCH != "x86_64", reason="the x32 ABI exists on x86_64 only")
def test_x32_syscall_kills_the_process(tmp_path):
    def body(out):
        _libc.syscall(ctypes.c_long(0x40000000 | 39))  # x32 getpid
        out["survived"] = True

    out, status = _locked_child(body, tmp_path)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS, (status, out)


def test_escape_attempt_is_a_clean_failed_outcome():
    """Whatever reaches a denied syscall through the sandbox fails the call, not the runtime."""
    # The worker's own code path: a codec tool code may name, after the lock-down.
    o = run(tool("return 'é€'.encode('utf-16-le').hex() + 'x'.encode('cp1251').hex()"), "execute", [{}],
            services=FakeServices())
    assert o.ok and o.value == "e900ac2078", o
    o = run(tool("return 'x'.encode('no-such-codec')"), "execute", [{}], services=FakeServices())
    assert not o.ok and "LookupError" in o.error
    assert_runtime_healthy()


# --------------------------------------------------------------------------- the report


def test_report_says_what_is_on():
    shutdown()
    r = report()
    assert r["available"] and r["switch"] == "on"
    p = r["protections"]
    assert set(p) == {"uid_drop", "user_namespace", "network_namespace", "seccomp", "filesystem",
                      "capabilities", "no_new_privs", "rlimits"}
    for name, v in p.items():
        assert v["state"] in ("on", "off", "not needed") and v["detail"], name
    assert r["off"] == [n for n, v in p.items() if v["state"] == "off"]
    # Every layer this kernel allows is on: none is silently off.
    if ARCH:
        assert p["seccomp"]["state"] == "on", p["seccomp"]
    if LANDLOCK_ABI:
        assert p["filesystem"]["state"] == "on" and f"ABI {LANDLOCK_ABI}" in p["filesystem"]["detail"]
    if CAN_NETNS:
        assert p["network_namespace"]["state"] == "on", p["network_namespace"]
    assert p["no_new_privs"]["state"] == "on" and p["rlimits"]["state"] == "on"
    assert p["capabilities"]["state"] == "on", p["capabilities"]
    if ROOT:
        assert p["uid_drop"]["state"] == "on" and p["user_namespace"]["state"] == "not needed"
        assert r["fork_server"]["CapEff"] == "00000000000000e0"
    assert r["probe"]["seccomp_mode"] == (2 if ARCH else 0)
    # Cheap once the server has answered.
    t = time.perf_counter()
    assert report()["protections"] == p
    assert time.perf_counter() - t < 0.05


def test_report_never_raises(monkeypatch):
    def boom(restart=False):
        raise fork_client.SandboxUnavailable("no fork server here")

    monkeypatch.setattr(fork_client, "get_server", boom)
    r = report()
    assert r["available"] is False and "no fork server here" in r["error"]


def test_failed_setup_is_reported_and_leaves_workers_usable(monkeypatch, tmp_path):
    """A bug in the setup must cost the layers, not the sandbox: workers then get none, and the report says why."""
    monkeypatch.setattr(lockdown, "_plan", None)
    s = setup.setup_failed((), RuntimeError("boom"))
    r = json.loads(s.report_bytes)
    assert set(r["off"]) >= {"network_namespace", "seccomp", "filesystem", "capabilities"}
    assert "setup failed" in r["protections"]["seccomp"]["detail"] and "boom" in r["protections"]["seccomp"]["detail"]

    def body(out):
        out["mode"] = libc.prctl(libc.PR_GET_SECCOMP)

    out, status = _locked_child(body, tmp_path)
    assert os.WIFEXITED(status) and out == {"mode": 0}


def _setup_in_child(lock_down) -> dict:
    """Run the fork server's setup_server in a throwaway child; return its report."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            write_all(w, setup.setup_server((), lock_down).report_bytes)
        finally:
            os._exit(0)
    os.close(w)
    data = read_all(r)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.mark.skipif(ARCH is None, reason="no seccomp syscall table for this machine")
def test_a_layer_that_breaks_the_probe_worker_is_backed_off_and_reported():
    def lock_down_that_breaks_under_seccomp(*args):
        worker._lock_down(*args)
        if libc.prctl(libc.PR_GET_SECCOMP) == 2:
            os._exit(9)

    r = _setup_in_child(lock_down_that_breaks_under_seccomp)
    p = r["protections"]
    assert p["seccomp"]["state"] == "off"
    assert p["seccomp"]["detail"] == "the filter broke the probe worker (probe worker exited with status 9)"
    if LANDLOCK_ABI:
        assert p["filesystem"]["state"] == "on"  # only the culprit is backed off
    assert r["probe"]["seccomp_mode"] == 0 and "probe_error" not in r["notes"]


def test_switch_off_is_reported_and_really_off(monkeypatch):
    monkeypatch.setenv(switch.ENV_SWITCH, "off")
    shutdown()
    try:
        r = report()
        p = r["protections"]
        for name in ("network_namespace", "seccomp", "filesystem", "capabilities"):
            assert p[name]["state"] == "off" and switch.ENV_SWITCH in p[name]["detail"], (name, p[name])
        assert "weakens the sandbox" in p["seccomp"]["detail"]
        assert r["probe"]["seccomp_mode"] == 0
        if ROOT:
            assert p["uid_drop"]["state"] == "on"  # the old lock-down stays whatever the switch says
        assert_runtime_healthy()
    finally:
        monkeypatch.delenv(switch.ENV_SWITCH)
        shutdown()
    assert report()["switch"] == "on"


def test_switch_values():
    f = switch.switch_from_env
    assert f({}) == () and f({switch.ENV_SWITCH: "on"}) == ()
    assert f({switch.ENV_SWITCH: "OFF"}) == switch.LAYERS
    assert f({switch.ENV_SWITCH: "off:seccomp, landlock,bogus"}) == ("landlock", "seccomp")
    assert f({switch.ENV_SWITCH: "no"}) == ()  # anything unknown keeps everything on


# --------------------------------------------------------------------------- other environments

RUNTIME_SCRIPT = r"""
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
deny = json.loads(sys.argv[2])  # syscalls refused to the whole runtime, as a container profile might
from brainstem.sandbox.kernel import libc, seccomp
if deny:
    arch, _ = seccomp.seccomp_arch()
    libc.prctl(38, 1)
    rules = {n: seccomp.RET_ERRNO | e for e, names in ((1, deny["eperm"]), (38, deny["enosys"])) for n in names}
    seccomp.Filter(seccomp.build_filter(arch, rules, default=seccomp.RET_ALLOW)).install()
from brainstem.sandbox import run, Limits, report
class S:
    secrets = {}
    kv_access = "none"
    def log(self, message): pass
out = {}
o = run("def execute(args, ctx):\n    return 'é'.encode('utf-16-le').hex()\n", "execute", [{}], services=S())
out["trivial"] = [o.ok, o.value, o.error]
o = run("def execute(args, ctx):\n    return {}['missing']\n", "execute", [{}], services=S())
out["raises"] = [o.ok, o.error]
out["report"] = report()
print(json.dumps(out), flush=True)
if "--sleep" in sys.argv:
    o = run("import time\ndef execute(args, ctx):\n    time.sleep(1.5)\n    return 1\n", "execute", [{}],
            services=S(), limits=Limits(timeout_ms=5000))
    print(json.dumps({"slept": o.ok}), flush=True)
"""


_PATH: list[str] = []


def _sys_path() -> list[str]:
    return _PATH or [REPO, *site.getsitepackages()]


def _readable_copy() -> list[str]:
    """The checkout and the one dependency the sandbox needs, copied where another user can read them:
    a clone made by ``mktemp -d`` (mode 0700), or a venv under /root, is out of that user's reach."""
    import atexit
    import tempfile

    import RestrictedPython

    root = tempfile.mkdtemp(prefix="brainstem-unpriv-")
    atexit.register(shutil.rmtree, root, True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(REPO) / "brainstem", Path(root) / "brainstem", ignore=ignore)
    shutil.copytree(Path(RestrictedPython.__file__).parent, Path(root) / "RestrictedPython", ignore=ignore)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return [root]


def _runtime(prefix: list[str], python: str, deny: dict | None = None, sleep: bool = False,
             env: dict | None = None) -> subprocess.Popen:
    args = [*prefix, python, "-c", RUNTIME_SCRIPT, json.dumps(_sys_path()), json.dumps(deny or {})]
    if sleep:
        args.append("--sleep")
    base = {k: v for k, v in os.environ.items() if k != switch.ENV_SWITCH}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                            env={**base, **(env or {})})


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[0])


UNPRIVILEGED = 65533


def _setpriv() -> list[str]:
    return ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all"]


def _unprivileged_python() -> str | None:
    """An interpreter a non-root user can run (and re-run: the fork server is started from
    sys.executable) with this checkout and its dependencies importable."""
    if not ROOT or shutil.which("setpriv") is None:
        return None
    probe = "import sys,json,os;sys.path[:0]=json.loads(sys.argv[1]);import RestrictedPython,brainstem.sandbox;" \
            "assert os.access(sys.executable,os.X_OK) and os.getuid()!=0"
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or "",
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    for attempt in ("as it is", "a readable copy"):
        if attempt == "a readable copy":
            _PATH[:] = _readable_copy()
        for python in dict.fromkeys(c for c in candidates if c):
            try:
                done = subprocess.run([*_setpriv(), python, "-c", probe, json.dumps(_sys_path())], cwd="/",
                                      capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if done.returncode == 0:
                return python
    _PATH.clear()
    return None


UNPRIV_PYTHON = _unprivileged_python()
needs_unprivileged = pytest.mark.skipif(
    UNPRIV_PYTHON is None, reason="needs root (to become another user), setpriv, and a Python that user can run")


def _assert_tools_work(out: dict) -> None:
    assert out["trivial"] == [True, "e900", None], out["trivial"]
    assert out["raises"][0] is False and out["raises"][1].startswith("KeyError"), out["raises"]


@needs_unprivileged
@pytest.mark.slow
def test_non_root_runtime_uses_a_user_namespace():
    proc = _runtime(_setpriv(), UNPRIV_PYTHON, sleep=True)
    try:
        out = json.loads(proc.stdout.readline())
        _assert_tools_work(out)
        r = out["report"]
        p = r["protections"]
        assert r["runtime"] == f"non-root (uid {UNPRIVILEGED})"
        assert p["uid_drop"]["state"] == "off" and f"uid {UNPRIVILEGED}" in p["uid_drop"]["detail"]
        assert r["probe"]["uid"] == caps.NOBODY  # as seen inside the namespace
        if CAN_NETNS:
            assert p["user_namespace"]["state"] == "on" and p["network_namespace"]["state"] == "on"
        if ARCH:
            assert p["seccomp"]["state"] == "on"
        if LANDLOCK_ABI:
            assert p["filesystem"]["state"] == "on"
        assert p["capabilities"]["state"] == "on" and r["fork_server"]["CapEff"] == "0000000000000000"

        # The sleeping worker, from outside.
        workers = wait_for(lambda: [p for p in descendants(proc.pid)
                                     if (stat(p) or ("",))[0] == "brainstem-tool"], 5.0)
        assert workers, "no worker"
        status = _status(workers[0])
        assert status["Uid"].split()[0] == str(UNPRIVILEGED)
        if ARCH:
            assert status["Seccomp"] == "2"
        if CAN_NETNS:
            assert os.readlink(f"/proc/{workers[0]}/ns/user") != os.readlink("/proc/self/ns/user")
            assert os.readlink(f"/proc/{workers[0]}/ns/net") != os.readlink("/proc/self/ns/net")
        assert json.loads(proc.stdout.readline()) == {"slept": True}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@needs_unprivileged
@pytest.mark.slow
def test_non_root_runtime_without_user_namespaces_degrades():
    """As under a container's default seccomp profile: unshare refused to the whole runtime."""
    out = _finish(_runtime(_setpriv(), UNPRIV_PYTHON, deny={"eperm": ["unshare"], "enosys": []}))
    _assert_tools_work(out)
    p = out["report"]["protections"]
    assert p["user_namespace"]["state"] == "off" and "EPERM" in p["user_namespace"]["detail"]
    assert p["network_namespace"]["state"] == "off" and "user namespace" in p["network_namespace"]["detail"]
    assert p["uid_drop"]["state"] == "off"
    if ARCH:
        assert p["seccomp"]["state"] == "on"
    if LANDLOCK_ABI:
        assert p["filesystem"]["state"] == "on"
    assert set(out["report"]["off"]) == {"uid_drop", "user_namespace", "network_namespace"}


@needs_unprivileged
@pytest.mark.slow
def test_non_root_runtime_without_user_namespaces_or_landlock_degrades():
    deny = {"eperm": ["unshare"], "enosys": ["landlock_create_ruleset", "landlock_restrict_self"]}
    out = _finish(_runtime(_setpriv(), UNPRIV_PYTHON, deny=deny))
    _assert_tools_work(out)
    p = out["report"]["protections"]
    assert p["filesystem"]["state"] == "off"
    assert "no Landlock" in p["filesystem"]["detail"] and "no chroot" in p["filesystem"]["detail"]
    if ARCH:
        assert p["seccomp"]["state"] == "on"
        assert "cannot open files for writing" in p["filesystem"]["detail"]


@pytest.mark.skipif(not ROOT, reason="the empty-root fallback is for a root runtime (or a user namespace)")
@pytest.mark.slow
def test_root_runtime_without_landlock_uses_an_empty_root():
    deny = {"eperm": [], "enosys": ["landlock_create_ruleset", "landlock_restrict_self"]}
    out = _finish(_runtime([], sys.executable, deny=deny))
    _assert_tools_work(out)
    r = out["report"]
    assert r["protections"]["filesystem"]["state"] == "on", r["protections"]["filesystem"]
    assert "empty root" in r["protections"]["filesystem"]["detail"]
    # An empty directory, made by root with mode 0700: the nobody worker may not even list it.
    assert r["probe"]["root_dir"] in ("0 entries", "EACCES")
    assert r["probe"]["etc_passwd"] in ("ENOENT", "EACCES")


@needs_unprivileged
@pytest.mark.slow
def test_non_root_runtime_without_landlock_uses_an_empty_root_in_its_user_namespace():
    deny = {"eperm": [], "enosys": ["landlock_create_ruleset", "landlock_restrict_self"]}
    out = _finish(_runtime(_setpriv(), UNPRIV_PYTHON, deny=deny))
    _assert_tools_work(out)
    r = out["report"]
    if CAN_NETNS:
        assert r["protections"]["filesystem"]["state"] == "on", r["protections"]["filesystem"]
        assert r["probe"]["root_dir"] == "0 entries"


def _unshare_r_permitted() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_unshare_r = pytest.mark.skipif(not _unshare_r_permitted(), reason="`unshare -rn` is not permitted here")


def _assert_rootless(r: dict) -> None:
    p = r["protections"]
    assert r["runtime"] == f"uid 0 that cannot switch to uid {caps.NOBODY}", r["runtime"]
    assert p["uid_drop"]["state"] == "off"
    assert f"cannot make workers uid {caps.NOBODY}" in p["uid_drop"]["detail"]
    assert "refused" in p["uid_drop"]["detail"] and "uid_map" in p["uid_drop"]["detail"]
    if ARCH:
        assert p["seccomp"]["state"] == "on", p["seccomp"]
        assert r["probe"]["unknown_syscall"] == "EPERM" and r["probe"]["socket"] == "EPERM"
    if LANDLOCK_ABI:
        assert p["filesystem"]["state"] == "on" and "Landlock" in p["filesystem"]["detail"], p["filesystem"]
    for name in ("capabilities", "no_new_privs", "rlimits"):
        assert p[name]["state"] == "on", (name, p[name])
    assert r["fork_server"]["CapEff"] == "0000000000000000" and r["probe"]["caps"] == 0
    assert "probe_error" not in r["notes"]


@needs_unshare_r
@pytest.mark.slow
def test_root_in_a_user_namespace_without_uid_65534_runs_tools():
    """`unshare -rn`, rootless containers: uid 0 maps to one uid outside and 65534 to none, so workers
    cannot become nobody; they keep every other layer, in a user namespace of their own."""
    out = _finish(_runtime(["unshare", "-rn"], sys.executable))
    _assert_tools_work(out)
    r = out["report"]
    _assert_rootless(r)
    p = r["protections"]
    assert p["user_namespace"]["state"] == "on" and p["network_namespace"]["state"] == "on"
    assert r["probe"]["uid"] == caps.NOBODY  # as seen inside the fork server's user namespace


@needs_unprivileged
@needs_unshare_r
@pytest.mark.slow
def test_a_user_as_root_of_its_own_user_namespace_runs_tools():
    """Rootless containers as most run them: an ordinary user, uid 0 in a namespace mapping only it."""
    if subprocess.run([*_setpriv(), "unshare", "-rn", "true"], capture_output=True, timeout=30).returncode:
        pytest.skip("`unshare -rn` is not permitted to an unprivileged user here")
    out = _finish(_runtime([*_setpriv(), "unshare", "-rn"], UNPRIV_PYTHON))
    _assert_tools_work(out)
    _assert_rootless(out["report"])
    assert f"uid_map: 0 {UNPRIVILEGED} 1" in out["report"]["protections"]["uid_drop"]["detail"]


@needs_unshare_r
@pytest.mark.slow
def test_root_in_a_user_namespace_without_uid_65534_or_unshare_runs_tools():
    """The same where no namespace can be made (as under a container's seccomp profile): workers stay
    uid 0 of the runtime's namespace, with no capability."""
    out = _finish(_runtime(["unshare", "-rn"], sys.executable, deny={"eperm": ["unshare"], "enosys": []}))
    _assert_tools_work(out)
    r = out["report"]
    _assert_rootless(r)
    assert r["protections"]["user_namespace"]["state"] == "off"
    assert r["probe"]["uid"] == 0


# --------------------------------------------------------------------------- why a sandbox cannot start


def _start_fork_server_with(patch: str):
    """Restart the fork server with ``patch`` (Python, with ``lockdown`` and ``worker`` imported) run first."""
    from brainstem.sandbox import forkserver

    shutdown()
    forkserver.BOOT = ("import sys,json\nsys.path[:]=json.loads(sys.argv[1])\n"
                       "from brainstem.sandbox import worker\nfrom brainstem.sandbox.kernel import lockdown\n"
                       + patch + "\n"
                       "from brainstem.sandbox.forkserver import main\nmain(int(sys.argv[2]),())\n")


def _restore_fork_server():
    from brainstem.sandbox import forkserver

    del forkserver.BOOT  # back to the one built from the environment at each start
    shutdown()


def test_a_worker_that_cannot_start_says_why():
    _start_fork_server_with("def refuse():\n    raise OSError(22, 'Invalid argument')\n"
                            "lockdown.become_nobody = refuse")
    try:
        o = run(tool("return 1"), "execute", [{}], services=FakeServices())
        assert not o.ok
        assert o.error == f"sandbox error: worker could not start: switching to uid {caps.NOBODY}: " \
                          f"EINVAL (Invalid argument)", o.error
        r = report(refresh=True)
        assert "could not start: switching to uid" in r["notes"]["probe_error"], r["notes"]
    finally:
        _restore_fork_server()
    assert_runtime_healthy()


def test_a_fork_server_that_cannot_start_says_why():
    _start_fork_server_with("def boom():\n    raise RuntimeError('no warm-up today')\n"
                            "worker.restricted.warm_up = boom")
    try:
        o = run(tool("return 1"), "execute", [{}], services=FakeServices())
        assert not o.ok
        assert o.error == "sandbox unavailable: fork server did not start: RuntimeError: no warm-up today", o.error
    finally:
        _restore_fork_server()
    assert_runtime_healthy()
