"""The runtime's handle on its fork server: start it, restart it when it died, stop it, ask it for a worker.

One fork server per runtime process, started on first use from a thread that
lives as long as the process (``PR_SET_PDEATHSIG`` fires when the *thread*
that forked the child exits).  :func:`spawn_worker` hands it the worker ends
of two socket pairs (the worker's channel and a status line) over the
control socket (SCM_RIGHTS) and keeps the other ends.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import queue
import socket
import subprocess
import sys
import threading

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
        from brainstem.sandbox.forkserver import BOOT

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", BOOT, json.dumps(sys.path), str(theirs.fileno())],
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

    def spawn(self, params: dict, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.control, [json.dumps(params).encode()], fds)

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


def spawn_worker(params: dict) -> tuple[socket.socket, socket.socket]:
    """Start one worker; return (channel, status) sockets. Restarts a dead fork server once."""
    for attempt in (0, 1):
        server = get_server(restart=attempt == 1)
        chan, chan_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stat, stat_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.spawn(params, [chan_child.fileno(), stat_child.fileno()])
        except OSError:
            chan.close()
            stat.close()
            if attempt == 1:
                raise SandboxUnavailable("fork server is not responding") from None
            continue
        finally:
            chan_child.close()
            stat_child.close()
        return chan, stat
    raise SandboxUnavailable("fork server is not responding")  # pragma: no cover
