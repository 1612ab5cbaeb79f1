"""The probe: what a locked-down worker can still do, tried at fork server start.

:func:`self_test` forks a probe worker, puts it through what the fork server
is about to do to itself and the workers' lock-down, then runs :func:`probe`
in it: its ids, ``NO_NEW_PRIVS``, seccomp mode and capabilities, and whether
it can make a socket, exec, make a syscall off the table, list ``/`` or read
``/etc/passwd``.  Those findings are what the report shows.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import signal
import time
from collections.abc import Callable
from typing import Any

from brainstem.sandbox.kernel.caps import capget
from brainstem.sandbox.kernel.libc import LIBC, PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP, prctl, reason, syscall
from brainstem.sandbox.kernel.syscalls import ARCHES, MACHINE, SYSCALLS, UNKNOWN_SYSCALL


def _errno_name(e: int) -> str:
    return errno.errorcode.get(e, str(e))


def probe() -> dict[str, Any]:
    """Run inside a locked-down worker: what can it still do?  (Uses nothing that imports.)"""
    out: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
    out["no_new_privs"] = prctl(PR_GET_NO_NEW_PRIVS)
    out["seccomp_mode"] = prctl(PR_GET_SECCOMP)
    eff, prm = capget()
    out["caps"] = eff | prm
    fd = LIBC.socket(ctypes.c_int(2), ctypes.c_int(1), ctypes.c_int(0))  # AF_INET, SOCK_STREAM
    if fd >= 0:
        os.close(fd)
        out["socket"] = "allowed"
    else:
        out["socket"] = _errno_name(ctypes.get_errno())
    if MACHINE in ARCHES:  # a path that does not exist: nothing runs even if exec is allowed
        execve = SYSCALLS["execve"][ARCHES[MACHINE][0]]
        r = syscall(ctypes.c_long(execve), ctypes.c_char_p(b"/nonexistent/brainstem-probe"), None, None)
        out["execve"] = _errno_name(ctypes.get_errno()) if r < 0 else "allowed"
    else:
        out["execve"] = "not checked"
    r = syscall(ctypes.c_long(UNKNOWN_SYSCALL), None)  # under the allowlist: EPERM, not ENOSYS
    out["unknown_syscall"] = _errno_name(ctypes.get_errno()) if r < 0 else "allowed"
    try:
        out["root_dir"] = f"{len(os.listdir('/'))} entries"
    except OSError as e:
        out["root_dir"] = _errno_name(e.errno or 0)
    try:
        os.close(os.open("/etc/passwd", os.O_RDONLY))
        out["etc_passwd"] = "readable"
    except OSError as e:
        out["etc_passwd"] = _errno_name(e.errno or 0)
    out["rlimits"] = {name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[0]
                      for name in ("AS", "CPU", "NPROC", "FSIZE", "NOFILE", "CORE")}
    return out


def self_test(lock_down: Callable[[int, int, int, int], None], pre: Callable[[], None] | None = None,
              timeout: float = 10.0) -> tuple[dict | None, str]:
    """Fork a probe worker through ``pre`` (what the fork server is about to do to itself, and
    workers will inherit), ``lock_down`` and :func:`probe`; (findings, "") or (None, why)."""
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe worker
        code = 1
        try:
            os.dup2(w, 3)  # where the lock-down keeps the channel: a failure can be told through it
            try:
                if pre is not None:
                    pre()
                lock_down(3, parent, 2000, 256)
                found = probe()
                code = 0
            except BaseException as e:  # noqa: BLE001 - told to the fork server
                found = {"error": reason(e)}
            data = json.dumps(found).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(3, view):]
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return None, f"probe worker killed by signal {os.WTERMSIG(status)}"
    try:
        found = json.loads(b"".join(chunks))
    except ValueError:
        found = None
    if os.WEXITSTATUS(status) != 0:
        if type(found) is dict and type(found.get("error")) is str:
            return None, f"probe worker could not start: {found['error']}"
        return None, f"probe worker exited with status {os.WEXITSTATUS(status)}"
    if type(found) is not dict:
        return None, "probe worker sent no findings"
    return found, ""
