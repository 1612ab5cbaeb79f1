"""The runtime's handle on its fork server: start it, restart it when it died, stop it, ask it for workers.

One fork server per runtime process, started on first use from a thread that
lives as long as the process (``PR_SET_PDEATHSIG`` fires when the *thread*
that forked the child exits).  :func:`fork_worker` hands it the worker ends
of two socket pairs (the worker's channel and a status line) over the
control socket (SCM_RIGHTS) and keeps the other ends: the worker locks
itself down and waits for its job.  :func:`start` tells the server a job is
going out, which starts the worker's wall clock.  :class:`StatusLine` reads
what the server says of one worker (its pid, how it ended).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from brainstem.sandbox import forkserver
from brainstem.sandbox.protocol import CONTROL, FORK, START

START_TIMEOUT_S = 20.0


class SandboxUnavailable(Exception):
    pass


class _Keeper:
    """A thread that lives as long as the process and starts fork servers.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits,
    so the fork server must not be started from a short-lived worker thread.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="brainstem-sandbox-keeper", daemon=True
                )
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        return future.result()

    def _loop(self) -> None:
        while True:
            fn, future = self._queue.get()
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001
                future.set_exception(e)


_keeper = _Keeper()


class ForkServer:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", forkserver.BOOT, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            theirs.close()
        self.control = ours
        self.lock = threading.Lock()
        ours.settimeout(START_TIMEOUT_S)
        try:
            hello = ours.recv(4096)
        except OSError as e:
            self.stop()
            raise SandboxUnavailable(f"fork server did not start: {e}") from None
        if hello != b"ready":
            self.stop()
            why = hello.decode(errors="replace")[len("error: "):] if hello.startswith(b"error: ") else ""
            raise SandboxUnavailable(f"fork server did not start: {why}" if why else "fork server did not start")
        ours.settimeout(5.0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, op: int, worker_id: int = 0, value: int = 0, fds: list[int] = ()) -> None:
        """One control packet (see ``protocol.CONTROL``), with the fds it hands over."""
        with self.lock:
            socket.send_fds(self.control, [CONTROL.pack(op, worker_id, value)], list(fds))

    def stop(self) -> None:
        try:
            self.control.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def get_server(restart: bool = False) -> ForkServer:
    global _server
    with _server_lock:
        if restart or _server is None or not _server.alive():
            if _server is not None:
                _server.stop()
                _server = None
            _server = _keeper.call(ForkServer)
        return _server


def shutdown() -> None:
    """Stop the fork server (it kills any worker still running)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.stop()
            _server = None


atexit.register(shutdown)


def server_pid() -> int | None:
    """The fork server's pid, if it is running (for diagnostics and tests)."""
    services = _server
    return services.proc.pid if services is not None and services.alive() else None


class Worker:
    """A worker the runtime holds: its channel, its status line, and the server that forked it."""

    __slots__ = ("id", "chan", "status", "server", "memory_mb")

    def __init__(self, id: int, chan: socket.socket, status: StatusLine, server: ForkServer, memory_mb: int):
        self.id = id
        self.chan = chan
        self.status = status
        self.server = server
        self.memory_mb = memory_mb

    def usable(self) -> bool:
        """Its server is the live one and, as far as the status line says yet, it has not ended."""
        if self.server is not _server or not self.server.alive():
            return False
        self.status.poll(0.0)
        return self.status.exit is None and self.status.error is None and not self.status.closed

    def close(self) -> None:
        """Drop it: a worker still waiting reads the end of its channel and exits."""
        self.chan.close()
        self.status.sock.close()


_ids = itertools.count(1)


def fork_worker(memory_mb: int) -> Worker:
    """Have the fork server fork one worker, which locks itself down and waits for a job.

    Does not wait for the fork: the request is one message.  Restarts a dead fork server once.
    """
    for attempt in (0, 1):
        server = get_server(restart=attempt == 1)
        chan, chan_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stat, stat_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        worker_id = next(_ids)
        try:
            server.send(FORK, worker_id, int(memory_mb), [chan_child.fileno(), stat_child.fileno()])
        except OSError:
            chan.close()
            stat.close()
            if attempt == 1:
                raise SandboxUnavailable("fork server is not responding") from None
            continue
        finally:
            chan_child.close()
            stat_child.close()
        return Worker(worker_id, chan, StatusLine(stat), server, int(memory_mb))
    raise SandboxUnavailable("fork server is not responding")  # pragma: no cover


def start(worker: Worker, timeout_ms: int) -> None:
    """Its job goes out now: the fork server kills it ``timeout_ms`` from now. Raises OSError if the server is gone."""
    worker.server.send(START, worker.id, max(0, min(int(timeout_ms), 0xFFFFFFFF)))


class StatusLine:
    """Reads the fork server's line-per-event status socket of one worker: its pid, then how it ended."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.pid: int | None = None
        self.exit: dict | None = None
        self.error: str | None = None
        self.closed = False

    def poll(self, timeout: float) -> None:
        """Read what is available (waiting up to timeout for the first bytes)."""
        if self.closed:
            return
        self.sock.settimeout(max(0.0, timeout))
        try:
            data = self.sock.recv(4096)
        except (TimeoutError, BlockingIOError):
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "pid" in msg:
                self.pid = int(msg["pid"])
            if "exit" in msg:
                self.exit = msg["exit"]
            if "error" in msg:
                self.error = str(msg["error"])

    def wait_exit(self, until: float) -> None:
        while self.exit is None and not self.closed and self.error is None:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self.poll(remaining)

    def kill(self) -> None:
        self.poll(0.0 if self.pid is not None else 0.2)
        if self.exit is None and not self.closed:
            self.poll(0.0)
        if self.pid is not None and self.exit is None:
            for fn in (os.killpg, os.kill):
                try:
                    fn(self.pid, signal.SIGKILL)
                except OSError:
                    pass
