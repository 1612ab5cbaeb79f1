"""The fork server: one per runtime process, forks one worker per execution.

Started by :mod:`brainstem.sandbox.runner` as ``python -I -S -c BOOT`` with an
empty environment and a SOCK_SEQPACKET control socket.  It imports
RestrictedPython and the prepared namespaces once (``restricted.warm_up``), says
``ready`` (or ``error: ...`` and exits, if it could not set itself up), then
loops:

Control packets are three numbers (``protocol.CONTROL``: op, worker id,
value), so that the loop between two forks touches as little of the
server's memory as it can: every page it writes is copied once per fork.

* a control packet ``(FORK, id, memory_mb)`` carrying two fds (the
  worker's channel, whose other end the runtime keeps, and a status socket)
  makes it fork a worker, which runs :func:`worker.child_main` and never
  returns: it locks itself down and waits for its one job on the channel.
  The server closes its copy of the channel at once and writes ``{"pid": N}``
  then, after reaping, ``{"exit": {...}}`` lines on the status socket; a
  worker whose lock-down fails writes ``{"error": "..."}`` there first,
  naming the step and the reason;
* a control packet ``(START, id, timeout_ms)`` says that worker
  is being given its job: at ``timeout_ms`` from then the server SIGKILLs its
  process group (the worker called ``setsid``) and marks it ``timed_out``.  A
  worker's clock is started once; a worker waiting for a job has none;
* a control packet ``(REPORT, 0, 0)`` carrying one fd gets the isolation
  report (see :mod:`brainstem.sandbox.kernel.report`) written to that fd;
* when the control socket closes (the runtime exited or died) it kills every
  worker and exits.  ``PR_SET_PDEATHSIG=SIGKILL`` covers the case where it
  would not even get to read that EOF; each worker has the same death signal
  towards the server, so killing the runtime with SIGKILL leaves nothing
  behind.

The server never sees tool code, arguments or secrets: those travel from the
runtime to the worker over the channel.

Before its first fork it isolates itself and prepares what each worker adds
(``kernel.setup.setup_server``): its own network namespace (and user namespace
when workers cannot be made nobody), a reduced capability set, Landlock or an
empty root, a seccomp filter; then it checks all that on a probe worker.
``BOOT`` is built when the runtime starts the server, so it carries the
runtime's ``BRAINSTEM_SANDBOX_ISOLATION`` (the server itself gets an empty
environment).
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import time

from brainstem.sandbox.kernel.switch import switch_from_env
from brainstem.sandbox.protocol import CONTROL, FORK, REPORT, START


def _boot() -> str:
    disabled = switch_from_env()  # a tuple of known layer names only
    return (
        "import sys,json;sys.path[:]=json.loads(sys.argv[1]);"
        f"from brainstem.sandbox.forkserver import main;main(int(sys.argv[2]),{disabled!r})"
    )


def __getattr__(name: str) -> str:
    # ``from .forkserver import BOOT`` reads the switch at the moment the server starts.
    if name == "BOOT":
        return _boot()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


WAITING = float("inf")  # the deadline of a worker that has no job yet


class _Child:
    __slots__ = ("pid", "id", "deadline", "stat_fd", "timed_out")

    def __init__(self, pid: int, id: int, stat_fd: int):
        self.pid = pid
        self.id = id
        self.deadline = WAITING
        self.stat_fd = stat_fd
        self.timed_out = False


def _write_line(fd: int, obj: dict) -> None:
    _write_raw(fd, json.dumps(obj).encode() + b"\n")


def _write_raw(fd: int, line: bytes) -> None:
    try:
        os.write(fd, line)
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _kill(pid: int) -> None:
    for fn in (os.killpg, os.kill):
        try:
            fn(pid, signal.SIGKILL)
        except OSError:
            pass


def main(control_fd: int, disabled: tuple[str, ...] = ()) -> None:
    # Only the server runs main: the runtime imports this module for BOOT, and never the workers' modules.
    from brainstem.sandbox import worker  # noqa: PLC0415 -- also restricted (RestrictedPython, namespaces)

    parent = os.getppid()
    try:
        setup = _set_up(disabled, parent)
    except Exception as e:  # noqa: BLE001 - the runtime says why no tool can run
        _write_all(control_fd, f"error: {type(e).__name__}: {e}".encode()[:2000])
        os._exit(1)
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)

    gc.collect()
    gc.freeze()
    server_pid = os.getpid()
    children: dict[int, _Child] = {}
    control.send(b"ready")
    try:
        while True:
            timeout = None
            deadline = min((c.deadline for c in children.values()), default=WAITING)
            if deadline != WAITING:
                timeout = max(0.0, deadline - time.monotonic())
            try:
                ready, _, _ = select.select([control, wake_r], [], [], timeout)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                _drain(wake_r)
            if control in ready:
                try:
                    packet, fds, _flags, _addr = socket.recv_fds(control, 65536, 4)
                except OSError:
                    break
                if not packet:
                    for fd in fds:
                        _close(fd)
                    break
                _handle(packet, fds, children, setup, server_pid, worker.child_main)
            _reap(children)
            _kill_overdue(children)
            if os.getppid() != parent:
                break
    finally:
        for child in list(children.values()):
            _kill(child.pid)
        deadline = time.monotonic() + 2.0
        while children and time.monotonic() < deadline:
            _reap(children)
            time.sleep(0.01)
        os._exit(0)


def _set_up(disabled: tuple[str, ...], parent: int):
    """Warm the interpreter, build the kernel isolation (or say why not), and die with the runtime."""
    from brainstem.sandbox import worker  # noqa: PLC0415 -- the server's alone (see main)
    from brainstem.sandbox.kernel.setup import setup_failed, setup_server  # noqa: PLC0415 -- the server's alone

    worker.prctl(worker._PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent == 1:
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker.restricted.warm_up()
    try:
        setup = setup_server(tuple(disabled), worker._lock_down)
    except Exception as e:  # noqa: BLE001 - the sandbox must stay usable: run without, and say so
        setup = setup_failed(tuple(disabled), e)
    # Entering a user namespace clears the parent-death signal: set it again.
    worker.prctl(worker._PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(0)
    # Named only now, so the probe worker of setup_server is no child of a "brainstem-fsrv".
    worker.prctl(worker._PR_SET_NAME, b"brainstem-fsrv")
    return setup


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(children: dict[int, _Child]) -> None:
    """Collect every exited worker and tell its runner how it ended."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is None:
            continue
        info = {"code": None, "signal": None, "timed_out": child.timed_out}
        if os.WIFSIGNALED(status):
            info["signal"] = os.WTERMSIG(status)
        elif os.WIFEXITED(status):
            info["code"] = os.WEXITSTATUS(status)
        _write_line(child.stat_fd, {"exit": info})
        _close(child.stat_fd)


def _kill_overdue(children: dict[int, _Child]) -> None:
    now = time.monotonic()
    for child in children.values():
        if not child.timed_out and now >= child.deadline:
            child.timed_out = True
            _kill(child.pid)


def _handle(packet: bytes, fds: list[int], children: dict[int, _Child], setup, server_pid: int, child_main) -> None:
    """One request from the runtime: fork a worker, start one's clock, or answer the isolation report."""
    try:
        op, worker_id, value = CONTROL.unpack(packet)
        if op == START and not fds:
            _start(children, worker_id, value)
            return
        if op == REPORT and len(fds) == 1:
            os.set_blocking(fds[0], True)
            _write_all(fds[0], setup.report_bytes)
            _close(fds[0])
            return
        if op != FORK:
            raise ValueError(op)
        memory_mb = value
        chan_fd, stat_fd = fds
    except Exception:  # noqa: BLE001 - malformed request: drop it
        for fd in fds:
            _close(fd)
        return
    try:
        pid = os.fork()
    except OSError as e:
        _write_line(stat_fd, {"error": f"fork failed: {e}"})
        _close(chan_fd)
        _close(stat_fd)
        return
    if pid == 0:  # the worker
        try:
            child_main(chan_fd, server_pid, memory_mb, stat_fd)
        finally:
            os._exit(1)
    _close(chan_fd)
    children[pid] = _Child(pid, worker_id, stat_fd)
    _write_raw(stat_fd, b'{"pid":%d}\n' % pid)


def _start(children: dict[int, _Child], worker_id: int, timeout_ms: int) -> None:
    """The worker's job goes out now: its clock starts (once; a worker already running keeps its own)."""
    for child in children.values():
        if child.id == worker_id:
            if child.deadline == WAITING:
                child.deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
            return
