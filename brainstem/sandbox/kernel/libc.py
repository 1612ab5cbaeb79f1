"""The ctypes plumbing: libc, raw syscalls, ``prctl``, ``unshare``, the flag values, and how a refusal is told.

Two sets of entry points into libc.  The generic ones (``LIBC``, ``syscall``)
keep errno for the error message.  The workers' path (``syscall_ptr_size_flags``,
``syscall_fd_flags``, ``prctl_ptr``) has fixed prototypes and no errno
bookkeeping, because every page a fresh worker touches is a copy-on-write
fault (about 12 fewer than the generic calls); a failure is retried through
the generic calls for its errno.
"""

from __future__ import annotations

import ctypes
import errno
import os

try:
    LIBC = ctypes.CDLL(None, use_errno=True)
    syscall = LIBC.syscall
    syscall.restype = ctypes.c_long
    _prctl_fn = LIBC.prctl
    _prctl_fn.restype = ctypes.c_int
    _lean = ctypes.CDLL(None)
    syscall_ptr_size_flags = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_uint32)(("syscall", _lean))
    syscall_fd_flags = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_uint32)(
        ("syscall", _lean))
    prctl_ptr = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                 ctypes.c_ulong)(("prctl", _lean))
except (OSError, AttributeError):  # pragma: no cover - non-Linux: every layer is then reported off
    LIBC = syscall = _prctl_fn = syscall_ptr_size_flags = syscall_fd_flags = prctl_ptr = None

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_GET_SECCOMP = 21
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                   | CLONE_NEWPID | CLONE_NEWNET)


def err(what: str) -> OSError:
    """The OSError for a libc call that just failed, with its errno."""
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def prctl(option: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> int:
    if LIBC is None:  # pragma: no cover
        raise OSError(errno.ENOSYS, "prctl unavailable")
    r = _prctl_fn(ctypes.c_int(option), ctypes.c_ulong(a), ctypes.c_ulong(b), ctypes.c_ulong(c),
                  ctypes.c_ulong(d))
    if r < 0:
        raise err(f"prctl({option})")
    return r


def unshare(flags: int) -> None:
    if LIBC.unshare(ctypes.c_int(flags)) < 0:
        raise err("unshare")


class LockDownFailed(Exception):
    """A worker's lock-down failed; the message says at which step and why, in one line."""


def reason(e: BaseException) -> str:
    """One line saying why a step failed: the errno's name and text, or the exception's."""
    if isinstance(e, LockDownFailed):
        return str(e)
    if isinstance(e, OSError) and e.errno is not None:
        return f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror or os.strerror(e.errno)})"
    return f"{type(e).__name__}: {e}"
