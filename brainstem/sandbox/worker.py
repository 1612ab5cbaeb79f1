"""The worker: what runs in each freshly forked child of the fork server.

``child_main`` never returns: it locks the process down, reads its job from
the channel (fd 3, a socket whose other end belongs to the runtime process
that called ``run``), compiles the tool source under RestrictedPython, calls
the entry point with a ``ctx`` whose methods relay over the channel, converts
the result to plain JSON and sends it, then ``os._exit``\\ s.

Lock-down, in order: own session and process group; every fd but the channel
closed (stdin/stdout/stderr included; the fork server's status socket only at
the end, so that a failed lock-down can say why there); empty environment;
when running as root and the fork server found it possible, drop to nobody
(65534) so RLIMIT_NPROC is enforced and no root-owned file is writable;
``PR_SET_PDEATHSIG=SIGKILL`` (set after the uid change, which would clear it)
and a check that the fork server is still our parent; ``PR_SET_NO_NEW_PRIVS``;
rlimits (AS, CPU, NPROC 0, FSIZE 0, NOFILE, CORE 0); last
:func:`kernel.lockdown.lock_worker`, which adds the worker's part of the
seccomp filter.  Before all that the worker inherited what the fork server
did to itself: network (and user) namespace, reduced capabilities, Landlock
or an empty root, the bulk of the seccomp filter.
"""

from __future__ import annotations

import _signal
import binascii
import ctypes
import marshal
import math
import os
import resource
import signal
import time
import types
from typing import Any, NoReturn

from brainstem.core.errors import one_line
from brainstem.sandbox import restricted, tool_builtins
from brainstem.sandbox.kernel import lockdown
from brainstem.sandbox.kernel.caps import NOBODY
from brainstem.sandbox.kernel.libc import LockDownFailed, reason
from brainstem.sandbox.protocol import (
    ONE_WAY,
    FrameTooLarge,
    NotJSON,
    dumps,
    encode_frame,
    read_frame_fd,
    to_plain,
    write_all,
)

CHANNEL_FD = 3
STATUS_FD = 4  # during the lock-down only
NOFILE_LIMIT = 8

# Frame caps on the worker side.
MAX_INIT_BYTES = 64 * 1024 * 1024
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_CTX_CALLS = 1000
MAX_ERROR_CHARS = 400
# The CPU limit a worker is locked down with while it waits for a job, which lowers it to its own.
WAITING_TIMEOUT_MS = 3_600_000

_DEFAULT_SIGNALS = tuple(int(s) for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                            signal.SIGXCPU))
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_NO_NEW_PRIVS = 38

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # pragma: no cover - non-Linux
    _prctl = None


def prctl(option: int, arg: int | bytes = 0) -> None:
    if _prctl is not None:
        _prctl(option, arg, 0, 0, 0)


# --------------------------------------------------------------------------- lock-down


def _lock_down(chan_fd: int, server_pid: int, timeout_ms: int, memory_mb: int, status_fd: int = -1) -> None:
    """Raises :class:`LockDownFailed` naming the step that failed.

    ``status_fd`` (the fork server's status socket for this worker) is kept
    at STATUS_FD until the end, so that a failure can be told there.
    """
    global _status_fd
    _status_fd = status_fd
    step = "signals"
    try:
        # _signal, not signal: its enum conversions would write to pages that are otherwise left shared
        _signal.set_wakeup_fd(-1)
        for sig in _DEFAULT_SIGNALS:
            _signal.signal(sig, _signal.SIG_DFL)
        step = "fds"
        os.setsid()
        if _status_fd == CHANNEL_FD:
            _status_fd = os.dup(_status_fd)
        if chan_fd != CHANNEL_FD:
            os.dup2(chan_fd, CHANNEL_FD)
        if _status_fd >= 0:
            os.dup2(_status_fd, STATUS_FD)
            _status_fd = STATUS_FD
        os.closerange(0, CHANNEL_FD)
        os.closerange(CHANNEL_FD + 1 if _status_fd < 0 else STATUS_FD + 1, 1 << 20)
        os.environ.clear()
        step = f"switching to uid {NOBODY}"
        lockdown.become_nobody()
        step = "parent-death signal"
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(70)
        prctl(_PR_SET_NO_NEW_PRIVS, 1)
        prctl(_PR_SET_NAME, b"brainstem-tool")
        tool_builtins.reseed()
        step = "rlimits"
        cpu = max(1, math.ceil(timeout_ms / 1000)) + 1
        memory = memory_mb * 1024 * 1024
        for res, value in (
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_FSIZE, 0),
            (resource.RLIMIT_NPROC, 0),
            (resource.RLIMIT_NOFILE, NOFILE_LIMIT),
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, memory),
        ):
            soft, hard = value if isinstance(value, tuple) else (value, value)
            resource.setrlimit(res, (soft, hard))
        step = "capabilities, Landlock, seccomp"
        lockdown.lock_worker()
    except Exception as e:
        raise LockDownFailed(f"{step}: {reason(e)}") from None
    if _status_fd >= 0:
        os.close(_status_fd)
        _status_fd = -1


_status_fd = -1  # where a failed lock-down can say why


def _tell_failure(e: BaseException) -> None:
    """One line on the fork server's status socket, which the runtime reports as the call's error."""
    if _status_fd < 0:
        return
    line = one_line(f"worker could not start: {reason(e)}", MAX_ERROR_CHARS)
    try:
        os.write(_status_fd, dumps({"error": line}) + b"\n")
    except BaseException:  # noqa: BLE001 - the exit status still tells
        pass


# --------------------------------------------------------------------------- messages


def _safe_str(x: Any) -> str:
    try:
        s = str(x)
    except BaseException:  # noqa: BLE001 - tool objects may raise anything
        return ""
    return s if type(s) is str else ""


def describe_exception(e: BaseException, memory_mb: int) -> str:
    if isinstance(e, MemoryError):
        return f"memory limit ({memory_mb} MB) exceeded"
    if isinstance(e, RecursionError):
        return "RecursionError: maximum recursion depth exceeded"
    name = type(e).__name__
    if type(name) is not str:
        name = "Exception"
    message = _safe_str(e)
    line = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == restricted.TOOL_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    text = f"{name}: {message}" if message else name
    if line is not None:
        text += f" (line {line})"
    return one_line(text, MAX_ERROR_CHARS)


# --------------------------------------------------------------------------- ctx


def _check_str(value: Any, what: str) -> str:
    if type(value) is not str:
        raise TypeError(f"{what} must be a str")
    return value


def build_ctx(call, kv_granted: bool, secrets: dict[str, str]):
    """The ``ctx`` object: methods only; the channel lives in the ``call`` closure."""

    secret_view = types.MappingProxyType(dict(secrets))

    class Kv:
        __slots__ = ()

        def get(self, key):
            return call("kv_get", {"key": _check_str(key, "key")})

        def put(self, key, value):
            key = _check_str(key, "key")
            if type(value) is not str:
                value = dumps(to_plain(value, max_bytes=MAX_REQUEST_BYTES, what="kv value")).decode(
                    "utf-8", "surrogatepass"
                )
            call("kv_put", {"key": key, "value": value})

        def list(self, prefix=""):
            return call("kv_list", {"prefix": _check_str(prefix, "prefix")})

        def delete(self, key):
            return call("kv_delete", {"key": _check_str(key, "key")})

        def __repr__(self):
            return "<ctx.kv>"

    class Ctx:
        __slots__ = ()
        kv = Kv() if kv_granted else None
        secrets = secret_view

        def fetch(self, url, method="GET", headers=None, json=None, data=None, timeout=None):
            _check_str(url, "url")
            _check_str(method, "method")
            if headers is not None:
                if type(headers) is not dict or any(
                    type(k) is not str or type(v) is not str for k, v in headers.items()
                ):
                    raise TypeError("headers must be a dict of str to str")
                headers = dict(headers)
            if json is not None:
                json = to_plain(json, max_bytes=MAX_REQUEST_BYTES, what="json body")
            if data is not None:
                if type(data) is bytes:
                    try:
                        data = data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise TypeError("data bytes must be UTF-8 text") from None
                elif type(data) is dict:
                    data = to_plain(data, max_bytes=MAX_REQUEST_BYTES, what="form data")
                    if any(type(v) is not str for v in data.values()):
                        raise TypeError("form data values must be str")
                elif type(data) is not str:
                    raise TypeError("data must be a str, bytes or a dict of str")
            if timeout is not None:
                if type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0:
                    raise TypeError("timeout must be a positive number of seconds")
            return call(
                "fetch",
                {"url": url, "method": method, "headers": headers, "json": json, "data": data,
                 "timeout": timeout},
            )

        def log(self, message):
            if type(message) is not str:
                message = _safe_str(message)
            call("log", {"message": message})

        def send_telegram(self, text):
            """Send ``text`` to the operator's Telegram chat; the runtime sends it (this process never
            holds the bot token). ``{"message_id": ...}``, or RuntimeError saying why not."""
            return call("send_telegram", {"text": _check_str(text, "text")})

        def __repr__(self):
            return "<ctx>"

    return Ctx()


def make_caller(fd: int, sink: restricted.OutputSink, max_output: int):
    calls = 0

    def call(op: str, payload: dict) -> Any:
        nonlocal calls
        calls += 1
        if calls > MAX_CTX_CALLS:
            raise RuntimeError(f"too many ctx calls (limit {MAX_CTX_CALLS} per execution)")
        if op == "log":
            n = len(payload["message"].encode("utf-8", "surrogatepass"))
            if sink.size + n > max_output:
                sink.size = max_output + 1
                if sink.on_overflow is not None:
                    sink.on_overflow()
            sink.size += n
        error = None
        try:
            frame = encode_frame({"op": op, **payload}, MAX_REQUEST_BYTES)
        except FrameTooLarge:
            error = f"ctx request too large (limit {MAX_REQUEST_BYTES} bytes)"
        except (ValueError, TypeError) as e:
            error = f"ctx request is not JSON: {e}"
        if error is not None:
            raise RuntimeError(error)
        try:
            write_all(fd, frame)
            if op in ONE_WAY:
                return None
            response = read_frame_fd(fd, MAX_RESPONSE_BYTES)
        except (OSError, FrameTooLarge, ValueError):
            response = None
        if type(response) is not dict:
            os._exit(75)  # the runtime has gone away or broke protocol: nothing left to do
        if response.get("ok") is True:
            return response.get("value")
        message = response.get("error")
        raise RuntimeError(message if type(message) is str else "ctx call failed")

    return call


# --------------------------------------------------------------------------- main


def _finishing() -> None:
    """Renamed before the result goes out: once the runtime has it, the process still exiting
    (seccomp makes exit a little slower) is no longer a worker running tool code to ``ps``."""
    try:
        prctl(_PR_SET_NAME, b"brainstem-done")
    except BaseException:  # noqa: BLE001 - never at the cost of the result
        pass


def _send_and_exit(fd: int, message: dict, code: int) -> NoReturn:
    try:
        frame = encode_frame(message)
        _finishing()
        write_all(fd, frame)
    except BaseException:  # noqa: BLE001
        os._exit(code or 74)
    os._exit(code)


def child_main(chan_fd: int, server_pid: int, memory_mb: int, status_fd: int = -1) -> NoReturn:
    """Entry point in the forked child; never returns.

    Locks down at once, before any job exists; then warms up and waits (as
    ``brainstem-idle``) for its one job.  The job's own limits only lower the
    ones it was locked down with.
    """
    try:
        try:
            _lock_down(chan_fd, server_pid, WAITING_TIMEOUT_MS, memory_mb, status_fd)
        except LockDownFailed as e:
            _tell_failure(e)
            os._exit(72)
        _warm_up()
        prctl(_PR_SET_NAME, b"brainstem-idle")
        _run(memory_mb)
    except MemoryError:
        if _memory_frame:
            try:
                _finishing()
                write_all(CHANNEL_FD, _memory_frame)
            except BaseException:  # noqa: BLE001
                pass
        os._exit(71)
    except BaseException as e:  # noqa: BLE001 - nothing may escape the child
        try:
            _finishing()
            write_all(CHANNEL_FD, encode_frame({"op": "result", "ok": False,
                                                "error": one_line(f"sandbox worker failed: {reason(e)}",
                                                                  MAX_ERROR_CHARS)}))
        except BaseException:  # noqa: BLE001 - the exit status still tells
            pass
        os._exit(72)
    os._exit(0)


_memory_frame = b""  # the result a worker that ran out of memory sends


def _warm_up() -> None:
    """Go once through what a call does, so that the pages it writes are copied from the fork server
    now, while the worker waits, rather than during the call that is waiting for it."""
    glb = restricted.make_globals(restricted.OutputSink(1 << 10))
    exec(_code_from_text(_WARM_UP_CODE), glb)
    encode_frame({"op": "result", "ok": True, "value": to_plain(glb["execute"]({"n": 1}, None), max_bytes=64),
                  "output": ""})


def _code_as_text(code: types.CodeType) -> str:
    """Compiled code as the runtime keeps it (:mod:`brainstem.sandbox.compiled`): marshalled, in base64."""
    return binascii.b2a_base64(marshal.dumps(code), newline=False).decode("ascii")


def _code_from_text(text: str) -> types.CodeType:
    return marshal.loads(binascii.a2b_base64(text))


# Compiled once, in the fork server: the workers' warm-up loads it as a call with cached code does.
_WARM_UP_CODE = _code_as_text(restricted.compile_tool("def execute(args, ctx):\n    return {'n': args['n'] + 1}\n"))


def _lower_limits(timeout_ms: int, memory_mb: int) -> None:
    """The job's limits: CPU time counted from now, and at most the memory the worker was locked down with."""
    used = time.process_time()  # clock_gettime: the filter allows it, and not getrusage
    cpu = int(used) + max(1, math.ceil(timeout_ms / 1000)) + 1
    _, hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard_cpu), min(cpu + 1, hard_cpu)))
    _, hard_as = resource.getrlimit(resource.RLIMIT_AS)
    memory = memory_mb * 1024 * 1024
    if 0 < memory < hard_as:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))


def _run(memory_mb: int) -> NoReturn:
    fd = CHANNEL_FD
    init = read_frame_fd(fd, MAX_INIT_BYTES)
    if type(init) is not dict:
        os._exit(73)  # the runtime closed the channel (a pool being drained) or broke protocol
    global _memory_frame
    limits = init["limits"]
    _lower_limits(int(limits["timeout_ms"]), int(limits["memory_mb"]))
    prctl(_PR_SET_NAME, b"brainstem-tool")  # once its limits are the job's: ps then shows them
    memory_mb = min(memory_mb, int(limits["memory_mb"]))
    # Made now: once memory has run out, there may be none left to make it.
    _memory_frame = encode_frame({"op": "result", "ok": False, "error": f"memory limit ({memory_mb} MB) exceeded"})
    max_result = int(limits["max_result_bytes"])
    max_output = int(limits["max_output_bytes"])

    def overflow() -> NoReturn:
        _send_and_exit(
            fd, {"op": "result", "ok": False, "error": f"output limit ({max_output} bytes) exceeded"}, 0
        )

    sink = restricted.OutputSink(max_output, on_overflow=overflow)
    call = make_caller(fd, sink, max_output)
    ctx = build_ctx(call, bool(init.get("kv")), init.get("secrets") or {})
    entrypoint = init["entrypoint"]
    args = init["args"]
    source = init["code"]
    send_compiled = init.get("send_compiled") is True

    def fail(error: str) -> NoReturn:
        _send_and_exit(fd, {"op": "result", "ok": False, "error": error, "output": sink.text()}, 0)

    compiled = init.get("compiled")
    if type(compiled) is str:  # this source's code, as an earlier worker compiled it
        code = _code_from_text(compiled)
    else:
        try:
            code = restricted.compile_tool(source)
        except restricted.CompileError as e:
            fail(str(e))
        except BaseException as e:  # noqa: BLE001 - e.g. RecursionError on absurdly nested source
            fail("compile failed: " + describe_exception(e, memory_mb))
        if send_compiled:  # before any of the tool's code runs
            write_all(fd, encode_frame({"op": "compiled", "code": _code_as_text(code)}))
    source = compiled = init = None  # drop the job message

    glb = restricted.make_globals(sink)
    error = None
    value = None
    try:
        exec(code, glb)
        entry = glb.get(entrypoint)
        if type(entry) is not types.FunctionType:
            error = f"no function {entrypoint}() defined"
        else:
            value = entry(*args, ctx)
    except BaseException as e:  # noqa: BLE001 - SystemExit & co. are tool failures
        error = describe_exception(e, memory_mb)
    if error is not None:
        value = None
        fail(error)
    try:
        plain = to_plain(value, max_bytes=max_result)
        value = None
        body = dumps(plain)
    except NotJSON as e:
        fail(str(e))
    except RecursionError:
        fail("result is not JSON: nested too deeply")
    except (ValueError, TypeError) as e:
        fail(one_line(f"result is not JSON: {e}", MAX_ERROR_CHARS))
    if len(body) > max_result:
        fail(f"result too large ({len(body)} bytes, limit {max_result})")
    del body
    _send_and_exit(fd, {"op": "result", "ok": True, "value": plain, "output": sink.text()}, 0)
