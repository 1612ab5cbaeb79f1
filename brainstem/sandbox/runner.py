"""``run()``: execute KV-stored code in a fresh, locked-down worker process.

The runtime side of the sandbox.  For each execution it takes a worker that
is already forked, locked down and waiting (:mod:`.pool`), tells the fork
server that the worker's clock starts, and sends the whole job (code, entry
point, arguments, granted secrets, limits) in one frame over the worker's
channel; then it serves the worker's ``ctx`` requests by calling ``services``
*in this process* until the result arrives or the worker dies.  A call
without ``ctx`` requests is one round trip; ``ctx.log`` is one-way.  Nothing
but JSON text crosses: the worker's result is re-parsed here with
``json.loads``.

A worker's death (timeout kill, signal, memory cap, any exit) is a failed
``Outcome``, never an exception of the runtime.  See ``fork_client`` (the
fork server that forks workers) and ``ctx`` (what a ``ctx`` request gets).
"""

from __future__ import annotations

import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from brainstem.core.errors import one_line
from brainstem.sandbox import compiled, pool
from brainstem.sandbox.ctx import MAX_RESPONSE_BYTES, Services, StopExecution, answer, inspect_with, scrub_with
from brainstem.sandbox.fork_client import SandboxUnavailable, StatusLine, start
from brainstem.sandbox.protocol import HEADER, ONE_WAY, FrameTooLarge, NotJSON, encode_frame, loads, to_plain

# How long past timeout_ms the runtime waits before it kills the worker itself
# (the fork server normally does it at timeout_ms).
GRACE_S = 1.0
MAX_CTX_CALLS = 1000
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # worker -> runtime ctx request


@dataclass(frozen=True)
class Limits:
    timeout_ms: int = 10_000
    memory_mb: int = 1024
    max_result_bytes: int = 1_000_000
    max_output_bytes: int = 65_536  # captured print/log text cap


@dataclass
class Outcome:
    ok: bool
    value: Any  # the JSON-parsed result when ok
    error: str | None  # one line, operator-readable
    duration_ms: float
    output: str = ""  # what the tool printed (capped by Limits.max_output_bytes)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class _Execution:
    def __init__(self, services: Services, limits: Limits, kv_granted: bool, start: float,
                 source_key: str | None = None):
        self.services = services
        self.source_key = source_key  # set when the worker was asked for its compiled code
        self.limits = limits
        self.kv_granted = kv_granted
        self.start = start
        self.deadline = start + limits.timeout_ms / 1000.0
        self.hard_deadline = self.deadline + GRACE_S
        self.calls = 0
        self.max_result_frame = limits.max_result_bytes + 6 * limits.max_output_bytes + 65_536

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.start) * 1000.0

    # -- frames
    def _recv_exact(self, sock: socket.socket, n: int) -> bytes | None:
        chunks = []
        while n:
            remaining = self.hard_deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError()
            sock.settimeout(remaining)
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _recv_frame(self, sock: socket.socket) -> Any:
        head = self._recv_exact(sock, HEADER.size)
        if head is None:
            return None
        (size,) = HEADER.unpack(head)
        if size > max(MAX_REQUEST_BYTES, self.max_result_frame):
            raise FrameTooLarge(f"worker sent a {size}-byte message")
        body = self._recv_exact(sock, size)
        if body is None:
            return None
        return loads(body)

    # -- the loop
    def serve(self, chan: socket.socket, status: StatusLine, job: bytes) -> Outcome:
        failed = self._send(chan, status, job)
        if failed is not None:
            return failed
        try:
            pool.refill()  # while the job runs
        except (SandboxUnavailable, OSError):
            pass  # the next call forks its own worker, or says why it cannot
        while True:
            try:
                msg = self._recv_frame(chan)
            except TimeoutError:
                return self._timed_out(status)
            except FrameTooLarge as e:
                status.kill()
                return self._fail(f"worker protocol error: {e}")
            except (OSError, ValueError):
                msg = None
            if msg is None:
                return self._dead(status)
            if type(msg) is not dict:
                status.kill()
                return self._fail("worker protocol error: bad message")
            op = msg.get("op")
            if op == "compiled":
                if self.source_key is not None:  # its first frame, sent before the tool's code ran
                    compiled.put(self.source_key, msg.get("code"))
                self.source_key = None
                continue
            self.source_key = None  # only a first frame is taken for the compiled code
            try:
                if op == "result":
                    inspect_with(self.services, msg)
                    return self._result(msg)
                response = self._handle(op, msg)
            except StopExecution as e:
                status.kill()
                return self._fail(one_line(str(e)))
            if op in ONE_WAY:
                if response.get("ok") is not True:  # not recorded: the call ends here rather than go on without it
                    status.kill()
                    return self._fail(f"ctx.{op} failed: {one_line(str(response.get('error')))}")
                continue
            try:
                frame = encode_frame(response, MAX_RESPONSE_BYTES)
            except (FrameTooLarge, ValueError, TypeError) as e:
                frame = encode_frame({"ok": False, "error": f"ctx.{op}: response not sendable: {e}"})
            failed = self._send(chan, status, frame)
            if failed is not None:
                return failed

    def _send(self, chan: socket.socket, status: StatusLine, data: bytes) -> Outcome | None:
        """Send within the hard deadline; the failed Outcome if the worker is too slow or gone."""
        try:
            chan.settimeout(max(0.05, self.hard_deadline - time.monotonic()))
            chan.sendall(data)
        except TimeoutError:
            return self._timed_out(status)
        except OSError:
            return self._dead(status)
        return None

    def _result(self, msg: dict) -> Outcome:
        output = msg.get("output")
        output = output if type(output) is str else ""
        if msg.get("ok") is True:
            return Outcome(True, msg.get("value"), None, self.elapsed_ms(), output)
        error = msg.get("error")
        return Outcome(False, None, one_line(error) if type(error) is str else "tool failed",
                       self.elapsed_ms(), output)

    def _fail(self, error: str) -> Outcome:
        return Outcome(False, None, error, self.elapsed_ms())

    def _timed_out(self, status: StatusLine) -> Outcome:
        status.kill()
        return self._fail(f"timed out after {self.limits.timeout_ms} ms")

    def _dead(self, status: StatusLine) -> Outcome:
        """The channel closed without a result: say why the worker died."""
        status.wait_exit(time.monotonic() + 2.0)
        if status.error:
            return self._fail(f"sandbox error: {status.error}")
        info = status.exit
        if info is None:
            status.kill()
            return self._fail("sandbox worker lost (fork server died)")
        if info.get("timed_out"):
            return self._fail(f"timed out after {self.limits.timeout_ms} ms")
        sig = info.get("signal")
        if sig == signal.SIGXCPU:
            return self._fail(f"CPU time limit exceeded (timed out after {self.limits.timeout_ms} ms)")
        if sig:
            return self._fail(f"killed by signal {_signal_name(sig)}")
        code = info.get("code")
        if code == 71:
            return self._fail(f"memory limit ({self.limits.memory_mb} MB) exceeded")
        return self._fail(f"worker exited with status {code} without a result")

    # -- ctx requests
    def _handle(self, op: Any, msg: dict) -> dict:
        """One ctx request, counted against the run's limit; see :func:`ctx.answer`."""
        self.calls += 1
        if self.calls > MAX_CTX_CALLS:
            return {"ok": False, "error": f"too many ctx calls (limit {MAX_CTX_CALLS} per execution)"}
        return answer(self.services, op, msg, self.kv_granted, self.deadline)


# --------------------------------------------------------------------------- public entry point


def run(code: str, entrypoint: str, args: list, *, services: Services, limits: Limits = Limits()) -> Outcome:
    """Run ``entrypoint(*args, ctx)`` from ``code`` in a fresh sandboxed worker."""
    start_time = time.monotonic()

    def fail(error: str) -> Outcome:
        return Outcome(False, None, error, (time.monotonic() - start_time) * 1000.0)

    if type(code) is not str:
        return fail("tool code must be a str")
    if type(entrypoint) is not str or not entrypoint.isidentifier() or entrypoint.startswith("_"):
        return fail(f"invalid entry point {str(entrypoint)[:40]!r}")
    if limits.timeout_ms <= 0 or limits.memory_mb <= 0:
        return fail("invalid limits")
    try:
        kv_granted = getattr(services, "kv_access", "none") in ("own", "read_all")
        raw_secrets = getattr(services, "secrets", None) or {}
        secrets = {str(k): str(v) for k, v in dict(raw_secrets).items()}
        source_key = compiled.key(code)
        blob = compiled.get(source_key)
        job = encode_frame(
            {
                "code": "" if blob else code,
                "compiled": blob,
                "send_compiled": blob is None,
                "entrypoint": entrypoint,
                "args": scrub_with(services, to_plain(list(args), max_bytes=32 * 1024 * 1024, what="args")),
                "secrets": secrets,
                "kv": kv_granted,
                "limits": {
                    "timeout_ms": int(limits.timeout_ms),
                    "memory_mb": int(limits.memory_mb),
                    "max_result_bytes": int(limits.max_result_bytes),
                    "max_output_bytes": int(limits.max_output_bytes),
                },
            }
        )
    except NotJSON as e:
        return fail(str(e))
    except (TypeError, ValueError) as e:
        return fail(f"bad arguments: {one_line(e)}")
    except StopExecution as e:  # its input held what it must not be handed: it never starts
        return fail(one_line(str(e)))

    try:
        worker = _started_worker(limits)
    except (SandboxUnavailable, OSError) as e:
        return fail(f"sandbox unavailable: {one_line(e)}")
    execution = _Execution(services, limits, kv_granted, start_time, None if blob else source_key)
    try:
        return execution.serve(worker.chan, worker.status, job)
    except Exception as e:  # noqa: BLE001 - never let a tool break the runtime
        worker.status.kill()
        return fail(f"sandbox error: {one_line(f'{type(e).__name__}: {e}')}")
    finally:
        worker.close()


def _started_worker(limits: Limits):
    """A worker whose clock the fork server has started. A server found dead here (nothing sent yet) is
    restarted once: the pool's workers died with it."""
    for attempt in (0, 1):
        worker = pool.take(int(limits.memory_mb))
        try:
            start(worker, int(limits.timeout_ms))
            return worker
        except OSError:
            worker.close()
            pool.drain()
            if attempt == 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
