"""Kernel-level isolation of sandbox workers: the walls behind the interpreter.

RestrictedPython is the first wall: it decides what tool code can *name*.
This module is for the day it fails.  Whatever tool code reaches inside the
interpreter, the worker process it runs in can do next to nothing with the
kernel:

* **network namespace** -- the fork server unshares ``CLONE_NEWNET`` once at
  start, so it and every worker live in a namespace with no interface up (not
  even loopback).  A worker talks to the world only through its channel, an
  AF_UNIX socketpair made before the fork (socketpairs are not bound to a
  namespace).  ``ctx.fetch`` is done by the runtime, outside.  Once per fork
  server rather than once per worker: a per-worker namespace costs 0.3-2 ms
  per call here and buys nothing more, since workers cannot make sockets.
* **user namespace** (runtime not root, or root that cannot make a child
  uid 65534: ``unshare -r`` and rootless containers map uid 0 only) -- the
  fork server unshares ``CLONE_NEWUSER | CLONE_NEWNET`` and maps uid/gid
  65534 inside to the runtime's uid/gid outside; that is what lets an
  unprivileged runtime have a network namespace.  To the kernel the workers
  still own the runtime's files and processes: Landlock and seccomp keep them
  away from those.  Whether a root runtime can switch is tried once, in a
  throwaway child; if not, the uid drop is off and :func:`report` says why.
* **capabilities** -- as root the fork server keeps only CAP_SETUID,
  CAP_SETGID (to turn workers into nobody) and CAP_KILL (to kill them on
  timeout), in its effective, permitted and bounding sets; otherwise it
  keeps none.  Workers hold none.
* **filesystem** -- Landlock (when the kernel has it): a ruleset handling
  every filesystem access right the kernel knows, with no rule, so nothing is
  readable, writable or executable; TCP bind/connect (ABI >= 4), signals and
  abstract unix sockets (ABI >= 6) are scoped the same way.  Applied once, to
  the fork server before its first fork: every worker inherits the domain.
  (A domain per worker would also scope signals between workers; seccomp
  already denies them, and a domain per worker cost 0.1-0.4 ms per call.)
  Without Landlock, and when root or in a user namespace, the fork server
  chroots into an empty, deleted directory instead.  Either way every module
  a tool may need, codecs included, is imported first.
* **seccomp** -- an allowlist, as BPF built here from an explicit syscall
  table for x86_64 and aarch64 (see ``WORKER_ALLOW``): a worker may touch
  its own memory, clocks, signal handlers, ids and limits, and do I/O on the
  fds it holds; every other syscall (sockets, exec, fork, signals, ptrace,
  other processes' limits, priority and CPUs, namespaces, mounts, keys, bpf,
  io_uring, IPC, file changes, credentials, a syscall newer than the table)
  fails with EPERM, and opening for writing with EACCES, so Python raises
  PermissionError and the tool fails cleanly; a foreign architecture or the
  x32 ABI kills the process.  Installed in two parts because attaching a
  filter costs in proportion to its length: the fork server installs the
  bulk once for itself (the workers' list plus what it needs to fork, reap,
  kill and make nobody of them: ``SERVER_ONLY``), and each worker, after
  ``PR_SET_NO_NEW_PRIVS`` and just before tool code runs, adds a short
  filter taking ``SERVER_ONLY`` away again.

Nothing here may make the sandbox unusable: a layer that cannot be enabled is
left off and :func:`report` says why; a layer that can be enabled is.  The
fork server checks its work at start by locking down a probe worker and
trying what tool code must not be able to do; that probe's findings are what
:func:`report` shows.

``BRAINSTEM_SANDBOX_ISOLATION=off`` (read by the runtime when it starts the
fork server) turns these layers off, and ``off:LAYER,...`` only some of them
(``netns``, ``userns``, ``caps``, ``landlock``, ``chroot``, ``seccomp``).
It exists for the benchmark and the tests and WEAKENS THE SANDBOX; the
interpreter restrictions, uid drop, rlimits, empty environment and closed fds
stay on whatever it says.  Any other value means on.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import select
import signal
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

ENV_SWITCH = "BRAINSTEM_SANDBOX_ISOLATION"
LAYERS = ("netns", "userns", "caps", "landlock", "chroot", "seccomp")
NOBODY = 65534

# --------------------------------------------------------------------------- libc

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
    _prctl_fn = _libc.prctl
    _prctl_fn.restype = ctypes.c_int
    # The workers' path: fixed prototypes and no errno bookkeeping, because every
    # page a fresh worker touches is a copy-on-write fault (about 12 fewer than the
    # generic calls); a failure is retried through the calls above for its errno.
    _lean = ctypes.CDLL(None)
    _syscall_ptr_size_flags = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_uint32)(("syscall", _lean))
    _syscall_fd_flags = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_uint32)(
        ("syscall", _lean))
    _prctl_ptr = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                                  ctypes.c_ulong)(("prctl", _lean))
except (OSError, AttributeError):  # pragma: no cover - non-Linux
    _libc = None

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_GET_SECCOMP = 21
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
                   | CLONE_NEWPID | CLONE_NEWNET)
# open(2)/openat(2) flags that write or create (same values on x86_64 and aarch64).
OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC

CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_NAMES = {CAP_KILL: "CAP_KILL", CAP_SETGID: "CAP_SETGID", CAP_SETUID: "CAP_SETUID"}
ROOT_SERVER_CAPS = frozenset(CAP_NAMES)


def _err(what: str) -> OSError:
    e = ctypes.get_errno()
    return OSError(e, f"{what}: {os.strerror(e)}")


def _prctl(option: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> int:
    if _libc is None:  # pragma: no cover
        raise OSError(errno.ENOSYS, "prctl unavailable")
    r = _prctl_fn(ctypes.c_int(option), ctypes.c_ulong(a), ctypes.c_ulong(b), ctypes.c_ulong(c),
                  ctypes.c_ulong(d))
    if r < 0:
        raise _err(f"prctl({option})")
    return r


class LockDownFailed(Exception):
    """A worker's lock-down failed; the message says at which step and why, in one line."""


def reason(e: BaseException) -> str:
    if isinstance(e, LockDownFailed):
        return str(e)
    if isinstance(e, OSError) and e.errno is not None:
        return f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror or os.strerror(e.errno)})"
    return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------- syscall table
#
# name: (x86_64 number, aarch64 number); None where the architecture has no
# such call.  From the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h (aarch64); numbers from 424 up are the
# same on every architecture.  tests/sandbox/test_isolation.py checks this
# table against the installed kernel headers and libseccomp.

SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    # I/O on open fds
    "read": (0, 63), "write": (1, 64), "readv": (19, 65), "writev": (20, 66), "pread64": (17, 67),
    "recvfrom": (45, 207), "sendto": (44, 206), "recvmsg": (47, 212), "sendmsg": (46, 211),
    "close": (3, 57), "lseek": (8, 62), "fstat": (5, 80), "newfstatat": (262, 79), "statx": (332, 291),
    "getdents64": (217, 61), "fcntl": (72, 25), "ioctl": (16, 29),
    # memory
    "brk": (12, 214), "mmap": (9, 222), "munmap": (11, 215), "mprotect": (10, 226),
    "mremap": (25, 216), "madvise": (28, 233), "futex": (202, 98),
    # time
    "clock_gettime": (228, 113), "clock_getres": (229, 114), "gettimeofday": (96, 169),
    "time": (201, None), "nanosleep": (35, 101), "clock_nanosleep": (230, 115),
    # the process's own signal state, ids and limits
    "rt_sigaction": (13, 134), "rt_sigprocmask": (14, 135), "rt_sigreturn": (15, 139),
    "sigaltstack": (131, 132), "restart_syscall": (219, 128), "getpid": (39, 172),
    "gettid": (186, 178), "getppid": (110, 173), "getuid": (102, 174), "geteuid": (107, 175),
    "getgid": (104, 176), "getegid": (108, 177), "getgroups": (115, 158), "getresuid": (118, 148),
    "getresgid": (120, 150), "capget": (125, 90), "prlimit64": (302, 261), "prctl": (157, 167),
    "getrandom": (318, 278), "sched_yield": (24, 124), "set_robust_list": (273, 99),
    "rseq": (334, 293), "exit": (60, 93), "exit_group": (231, 94),
    # what the fork server needs besides
    "wait4": (61, 260), "setsid": (112, 157), "dup2": (33, None), "dup3": (292, 24),
    "close_range": (436, 436), "pipe2": (293, 59), "getsockname": (51, 204),
    "getsockopt": (55, 209), "select": (23, None), "pselect6": (270, 72),
    # sockets: the channel already exists
    "socket": (41, 198), "socketpair": (53, 199), "connect": (42, 203), "bind": (49, 200),
    "listen": (50, 201), "accept": (43, 202), "accept4": (288, 242),
    # running other programs
    "execve": (59, 221), "execveat": (322, 281),
    # reaching into other processes
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "pidfd_open": (434, 434), "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440), "process_mrelease": (448, 448),
    "migrate_pages": (256, 238), "move_pages": (279, 239), "setpriority": (141, 140),
    "sched_setaffinity": (203, 122), "sched_setscheduler": (144, 119), "sched_setparam": (142, 118),
    "sched_setattr": (314, 274), "ioprio_set": (251, 30),
    # signals
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240), "pidfd_send_signal": (424, 424),
    # namespaces and mounts
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "statmount": (457, 457), "listmount": (458, 458),
    "open_tree_attr": (467, 467),
    # kernel attack surface
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "perf_event_open": (298, 241), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "userfaultfd": (323, 282), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "personality": (135, 92), "modify_ldt": (154, None),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None), "acct": (163, 89),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "syslog": (103, 116),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "adjtimex": (159, 171), "sethostname": (170, 161), "setdomainname": (171, 162),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "vhangup": (153, 58),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262), "fanotify_mark": (301, 263), "lookup_dcookie": (212, 18),
    "nfsservctl": (180, 42), "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "seccomp": (317, 277), "lsm_set_self_attr": (460, 460), "fork": (57, None), "vfork": (58, None),
    # credentials
    "setuid": (105, 146), "setgid": (106, 144), "setreuid": (113, 145), "setregid": (114, 143),
    "setresuid": (117, 147), "setresgid": (119, 149), "setgroups": (116, 159),
    "setfsuid": (122, 151), "setfsgid": (123, 152), "capset": (126, 91),
    # SysV and POSIX IPC: shared with every process of the IPC namespace
    "shmget": (29, 194), "shmat": (30, 196), "shmdt": (67, 197), "shmctl": (31, 195),
    "semget": (64, 190), "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192),
    "msgget": (68, 186), "msgsnd": (69, 189), "msgrcv": (70, 188), "msgctl": (71, 187),
    "mq_open": (240, 180), "mq_unlink": (241, 181), "mq_timedsend": (242, 182),
    "mq_timedreceive": (243, 183), "mq_notify": (244, 184), "mq_getsetattr": (245, 185),
    # changing the filesystem
    "creat": (85, None), "mknod": (133, None), "mknodat": (259, 33), "mkdir": (83, None),
    "mkdirat": (258, 34), "rmdir": (84, None), "unlink": (87, None), "unlinkat": (263, 35),
    "rename": (82, None), "renameat": (264, 38), "renameat2": (316, 276), "link": (86, None),
    "linkat": (265, 37), "symlink": (88, None), "symlinkat": (266, 36), "chmod": (90, None),
    "fchmod": (91, 52), "fchmodat": (268, 53), "fchmodat2": (452, 452), "chown": (92, None),
    "fchown": (93, 55), "lchown": (94, None), "fchownat": (260, 54), "truncate": (76, 45),
    "ftruncate": (77, 46), "setxattr": (188, 5), "lsetxattr": (189, 6), "fsetxattr": (190, 7),
    "removexattr": (197, 14), "lremovexattr": (198, 15), "fremovexattr": (199, 16),
    "setxattrat": (463, 463), "removexattrat": (466, 466), "file_setattr": (469, 469),
    "utime": (132, None), "utimes": (235, None), "futimesat": (261, None),
    "utimensat": (280, 88), "inotify_init": (253, None), "inotify_init1": (294, 26),
    "inotify_add_watch": (254, 27), "openat2": (437, 437),
    # allowed with a check of their arguments (clone3: ENOSYS, for libc to fall back to clone)
    "clone": (56, 220), "clone3": (435, 435), "open": (2, None), "openat": (257, 56),
    # used to build Landlock rulesets (before any filter)
    "landlock_create_ruleset": (444, 444), "landlock_restrict_self": (446, 446),
}

# No syscall has it (the table ends near 470): without a filter it gets ENOSYS.
UNKNOWN_SYSCALL = 1023

ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # table column, AUDIT_ARCH_*
_X32_SYSCALL_BIT = 0x40000000

# --------------------------------------------------------------------------- the policy
#
# An allowlist: a worker may make the syscalls below and no other; anything
# else (a syscall added to the kernel next year included) fails with EPERM,
# so Python raises PermissionError and the call fails cleanly.  The list is
# what CPython needs to run tool code and talk over the channel, found by
# tracing workers through the test suites.

# Calls that act only on the worker itself or on fds it already holds.
WORKER_ALLOW: tuple[str, ...] = (
    # I/O on the channel (no new fd but a read-only open, which Landlock refuses)
    "read", "write", "readv", "writev", "pread64", "recvfrom", "sendto", "recvmsg", "sendmsg",
    "close", "lseek", "fstat", "newfstatat", "statx", "getdents64",
    "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "futex",
    # the vDSO answers most clock reads; these are its fallbacks, and sleep (select on some builds)
    "clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep", "clock_nanosleep",
    "select", "pselect6",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall",
    "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getgroups",
    "getresuid", "getresgid", "capget",
    "getrandom", "sched_yield", "set_robust_list", "rseq", "exit", "exit_group",
)


class ArgIn:
    """Allowed when argument ``arg`` (its low 32 bits: an int in the kernel) is one of ``values``."""

    def __init__(self, arg: int, values: tuple[int, ...], errno_: int = errno.EPERM):
        self.arg, self.values, self.errno = arg, values, errno_


class ArgNoBits:
    """Allowed unless argument ``arg`` has a bit of ``mask`` in its low 32 bits."""

    def __init__(self, arg: int, mask: int, errno_: int):
        self.arg, self.mask, self.errno = arg, mask, errno_


_F_GETFD, _F_SETFD, _F_GETFL, _F_SETFL, _F_DUPFD_CLOEXEC = 1, 2, 3, 4, 1030
_FIONBIO, _FIONCLEX, _FIOCLEX = 0x5421, 0x5450, 0x5451
# Options that act on the caller only (no PR_SCHED_CORE, PR_SET_PTRACER, PR_SET_MM, ...).
PRCTL_OPTIONS = (_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_GET_SECCOMP, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS,
                 _PR_GET_NO_NEW_PRIVS, _PR_CAP_AMBIENT)
ARG_RULES: dict[str, ArgIn | ArgNoBits] = {
    "open": ArgNoBits(1, OPEN_WRITE_FLAGS, errno.EACCES),  # as a refused open says it
    "openat": ArgNoBits(2, OPEN_WRITE_FLAGS, errno.EACCES),
    "prlimit64": ArgIn(0, (0,)),  # pid 0: its own limits, never another process's
    "prctl": ArgIn(0, PRCTL_OPTIONS),
    # fork server only (each worker's addition denies them)
    "clone": ArgNoBits(0, NAMESPACE_FLAGS, errno.EPERM),
    "fcntl": ArgIn(1, (_F_GETFD, _F_SETFD, _F_GETFL, _F_SETFL, _F_DUPFD_CLOEXEC)),  # not F_SETOWN: SIGIO
    "ioctl": ArgIn(1, (_FIONBIO, _FIONCLEX, _FIOCLEX)),  # not TIOCSTI & co.
}
# ENOSYS: libc then falls back to clone(), whose flags a filter can see.
ERRNO_RULES = {"clone3": errno.ENOSYS}
# What the fork server needs besides, to start workers (fork, make them nobody, drop their
# capabilities, hand them their fds), reap and kill them, and serve its control socket.  Each
# worker, just before tool code runs, adds a filter that takes these away again.
SERVER_ONLY: tuple[str, ...] = (
    "clone", "wait4", "kill", "setuid", "setgid", "setgroups", "capset", "setsid", "dup2", "dup3",
    "close_range", "pipe2", "getsockname", "getsockopt", "fcntl", "ioctl",
)
SERVER_ALLOW: tuple[str, ...] = WORKER_ALLOW + tuple(n for n in SERVER_ONLY if n not in ARG_RULES)

# Never on either list, whatever is added: what reaches other processes, the system or privilege.
NEVER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sockets", ("socket", "socketpair", "connect", "bind", "listen", "accept", "accept4")),
    ("exec", ("execve", "execveat")),
    ("other processes", ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open",
                         "pidfd_getfd", "process_madvise", "process_mrelease", "migrate_pages",
                         "move_pages", "setpriority", "sched_setaffinity", "sched_setscheduler",
                         "sched_setparam", "sched_setattr", "ioprio_set")),
    ("signals", ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                 "pidfd_send_signal")),
    ("namespaces and mounts", ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
                               "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
                               "fspick", "mount_setattr", "statmount", "listmount",
                               "open_tree_attr")),
    ("kernel attack surface", ("keyctl", "add_key", "request_key", "bpf", "perf_event_open",
                               "io_uring_setup", "io_uring_enter", "io_uring_register",
                               "userfaultfd", "kexec_load", "kexec_file_load", "init_module",
                               "finit_module", "delete_module", "personality", "modify_ldt",
                               "iopl", "ioperm", "uselib", "acct", "swapon", "swapoff", "reboot",
                               "syslog", "settimeofday", "clock_settime", "clock_adjtime",
                               "adjtimex", "sethostname", "setdomainname", "quotactl",
                               "quotactl_fd", "vhangup", "name_to_handle_at",
                               "open_by_handle_at", "fanotify_init", "fanotify_mark",
                               "lookup_dcookie", "nfsservctl", "memfd_create", "memfd_secret",
                               "seccomp", "lsm_set_self_attr", "fork", "vfork", "clone3")),
    ("credentials", ("setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid",
                     "setgroups", "setfsuid", "setfsgid", "capset")),
    ("IPC", ("shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semctl", "semtimedop",
             "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend",
             "mq_timedreceive", "mq_notify", "mq_getsetattr")),
    ("filesystem changes", ("creat", "mknod", "mknodat", "mkdir", "mkdirat", "rmdir", "unlink",
                            "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
                            "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "fchmodat2",
                            "chown", "fchown", "lchown", "fchownat", "truncate", "ftruncate",
                            "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
                            "fremovexattr", "setxattrat", "removexattrat", "file_setattr",
                            "utime", "utimes", "futimesat", "utimensat", "inotify_init",
                            "inotify_init1", "inotify_add_watch", "openat2")),
)


def worker_rules() -> dict:
    """A worker's whole policy, as one filter: the allowlist and the argument checks."""
    rules: dict = {name: RET_ALLOW for name in WORKER_ALLOW}
    rules.update((n, r) for n, r in ARG_RULES.items() if n not in SERVER_ONLY)
    rules.update((n, RET_ERRNO | e) for n, e in ERRNO_RULES.items())
    return rules


def server_rules() -> dict:
    """The fork server's filter, which its workers inherit: theirs plus what only it needs."""
    rules = worker_rules()
    rules.update((name, RET_ALLOW) for name in SERVER_ALLOW)
    rules.update(ARG_RULES)
    return rules


def worker_extra_rules() -> dict:
    """What each worker adds on top of the inherited server filter: no SERVER_ONLY call at all."""
    return {name: RET_ERRNO | errno.EPERM for name in SERVER_ONLY}

# --------------------------------------------------------------------------- BPF

_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARGS = 16


def build_filter(arch: str, rules: dict, default: int = RET_ERRNO | errno.EPERM) -> bytes:
    """A seccomp BPF program (packed ``struct sock_filter`` array) for ``arch``.

    A foreign architecture or the x32 ABI kills the process.  ``rules`` maps
    a syscall name to an action (``RET_ALLOW``, ``RET_ERRNO | e``) or to an
    :class:`ArgIn` / :class:`ArgNoBits` check; every other syscall gets
    ``default``.
    """
    column, audit_arch = ARCHES[arch]
    prog: list[tuple[int, int, int, int]] = [
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_BPF_JEQ_K, 1, 0, audit_arch),
        (_BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        (_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":
        prog += [(_BPF_JGE_K, 0, 1, _X32_SYSCALL_BIT), (_BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    # Argument checks first: the kernel caches what is always allowed, so these run most.
    for name, rule in sorted(rules.items(), key=lambda item: isinstance(item[1], int)):
        nr = SYSCALLS[name][column]
        if nr is None:
            continue
        if not isinstance(rule, int):
            load = (_BPF_LD_W_ABS, 0, 0, _OFF_ARGS + 8 * rule.arg)  # low half (little-endian)
        if isinstance(rule, ArgIn):
            n = len(rule.values)
            prog += [(_BPF_JEQ_K, 0, n + 3, nr), load]
            prog += [(_BPF_JEQ_K, n - i, 0, v) for i, v in enumerate(rule.values)]
            prog += [(_BPF_RET_K, 0, 0, RET_ERRNO | rule.errno), (_BPF_RET_K, 0, 0, RET_ALLOW)]
        elif isinstance(rule, ArgNoBits):
            prog += [(_BPF_JEQ_K, 0, 4, nr), load, (_BPF_JSET_K, 0, 1, rule.mask),
                     (_BPF_RET_K, 0, 0, RET_ERRNO | rule.errno), (_BPF_RET_K, 0, 0, RET_ALLOW)]
        elif rule != default:
            prog += [(_BPF_JEQ_K, 0, 1, nr), (_BPF_RET_K, 0, 0, rule)]
    prog.append((_BPF_RET_K, 0, 0, default))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Filter:
    """A BPF program kept in memory that survives fork, ready to install."""

    def __init__(self, program: bytes):
        self.program = program
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._fprog = _SockFprog(len(program) // 8, ctypes.addressof(self._buf))
        self._fprog_ptr = ctypes.addressof(self._fprog)

    def install(self) -> None:
        """Needs NO_NEW_PRIVS (or CAP_SYS_ADMIN); cannot be undone."""
        if _prctl_ptr(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog_ptr, 0, 0) < 0:
            _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._fprog_ptr)  # again, for the errno


_MACHINE = platform.machine()


def seccomp_arch() -> tuple[str | None, str]:
    """(arch, "") when this process can use the table, else (None, why not)."""
    machine = _MACHINE
    if machine not in ARCHES:
        return None, f"no syscall table for {machine or 'this machine'}"
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        return None, f"not a 64-bit little-endian {machine} process"
    return machine, ""


# --------------------------------------------------------------------------- Landlock

_LL_CREATE = SYSCALLS["landlock_create_ruleset"][0]  # the same number on every architecture
_LL_RESTRICT = SYSCALLS["landlock_restrict_self"][0]
_LL_VERSION = 1
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: 1 << 13, 3: 1 << 14, 5: 1 << 15}  # rights added by each ABI
_LL_NET_TCP = (1 << 0) | (1 << 1)  # BIND_TCP | CONNECT_TCP, ABI 4
_LL_SCOPES = (1 << 0) | (1 << 1)  # ABSTRACT_UNIX_SOCKET | SIGNAL, ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


def landlock_abi() -> tuple[int, str]:
    """(ABI version, "") or (0, why not)."""
    if _libc is None:  # pragma: no cover
        return 0, "no libc"
    r = _syscall(ctypes.c_long(_LL_CREATE), None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_VERSION))
    if r < 0:
        e = ctypes.get_errno()
        if e == errno.ENOSYS:
            return 0, "the kernel has no Landlock (ENOSYS)"
        if e == errno.EOPNOTSUPP:
            return 0, "Landlock is built in but not enabled at boot (EOPNOTSUPP)"
        return 0, f"landlock_create_ruleset refused: {errno.errorcode.get(e, e)}"
    return int(r), ""


class Landlock:
    """A deny-everything ruleset for a given ABI, applied with :meth:`restrict`."""

    def __init__(self, abi: int):
        self.abi = abi
        fs = 0
        for version, rights in _LL_FS_BY_ABI.items():
            if abi >= version:
                fs |= rights
        self.attr = _RulesetAttr(fs, _LL_NET_TCP if abi >= 4 else 0, _LL_SCOPES if abi >= 6 else 0)
        self.size = 8 if abi < 4 else 16 if abi < 6 else 24
        self._attr_ptr = ctypes.addressof(self.attr)

    def describe(self) -> str:
        parts = [f"Landlock ABI {self.abi}: every filesystem access right handled, none granted"]
        if self.abi >= 4:
            parts.append("TCP bind/connect denied")
        if self.abi >= 6:
            parts.append("signals and abstract unix sockets scoped to the domain")
        return "; ".join(parts)

    def restrict(self) -> None:
        fd = _syscall_ptr_size_flags(_LL_CREATE, self._attr_ptr, self.size, 0)
        if fd < 0:  # again, for the errno
            fd = _syscall(ctypes.c_long(_LL_CREATE), ctypes.c_void_p(self._attr_ptr),
                          ctypes.c_size_t(self.size), ctypes.c_uint32(0))
            if fd < 0:
                raise _err("landlock_create_ruleset")
        try:
            if _syscall_fd_flags(_LL_RESTRICT, fd, 0) < 0:
                if _syscall(ctypes.c_long(_LL_RESTRICT), ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
                    raise _err("landlock_restrict_self")
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- capabilities


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_CAP_V3 = 0x20080522


def capget() -> tuple[int, int]:
    """(effective, permitted) of this process as 64-bit masks."""
    hdr = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(hdr), data) < 0:
        raise _err("capget")
    eff = data[0].effective | (data[1].effective << 32)
    prm = data[0].permitted | (data[1].permitted << 32)
    return eff, prm


def capset(keep: frozenset[int]) -> None:
    """Effective = permitted = ``keep`` (must be held already), inheritable and ambient empty."""
    hdr = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    for cap in keep:
        data[cap // 32].effective |= 1 << (cap % 32)
        data[cap // 32].permitted |= 1 << (cap % 32)
    if _libc.capset(ctypes.byref(hdr), data) < 0:
        raise _err("capset")
    try:
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:  # pragma: no cover - kernels before 4.3
        pass


def drop_bounding(keep: frozenset[int]) -> list[int]:
    """Drop every capability not in ``keep`` from the bounding set; returns those still in it."""
    left = []
    cap = 0
    while True:
        try:
            present = _prctl(_PR_CAPBSET_READ, cap)
        except OSError:
            break  # EINVAL: past the last capability
        if present and cap not in keep:
            try:
                _prctl(_PR_CAPBSET_DROP, cap)
            except OSError:
                left.append(cap)
        elif present:
            left.append(cap)
        cap += 1
    return left


def _status_fields(path: str = "/proc/self/status") -> dict[str, str]:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    except OSError:
        pass
    return out


def _cap_names(mask: int) -> str:
    names = [CAP_NAMES.get(c, f"cap {c}") for c in range(64) if mask >> c & 1]
    return ", ".join(names) if names else "none"


# --------------------------------------------------------------------------- namespaces


def _unshare(flags: int) -> None:
    if _libc.unshare(ctypes.c_int(flags)) < 0:
        raise _err("unshare")


def _write_proc(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _netns_id() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "?"


def _enter_empty_root() -> None:
    """chroot into a directory that is deleted first: empty, and nothing can be created in it."""
    import tempfile

    path = tempfile.mkdtemp(prefix="brainstem-empty-")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(path)
        os.fchdir(fd)
        os.chroot(".")
        os.chdir("/")
    finally:
        os.close(fd)


def preload_codecs() -> int:
    """Import every standard codec: a tool's ``.encode('utf-16-le')`` cannot import it later."""
    import encodings
    import pkgutil

    n = 0
    for module in pkgutil.iter_modules(encodings.__path__):
        try:
            __import__(f"encodings.{module.name}")
            n += 1
        except Exception:  # noqa: BLE001 - mbcs/oem are Windows-only
            pass
    return n


# --------------------------------------------------------------------------- the plan workers follow


class Plan:
    """What each worker applies during its lock-down (built in the fork server).

    ``nobody``: switch to uid/gid 65534 (a root runtime that can).
    ``drop_caps`` is needed only when the fork server could not drop its own
    capabilities: a root worker loses them all at setuid(65534), and
    otherwise a worker inherits the fork server's (none).
    """

    def __init__(self, nobody: bool, drop_caps: bool, landlock: Landlock | None, seccomp: Filter | None):
        self.nobody = nobody
        self.drop_caps = drop_caps
        self.landlock = landlock
        self.seccomp = seccomp


_plan: Plan | None = None


def _default_plan() -> Plan:
    """For a lock-down outside a fork server (tests): every worker-level layer the kernel has."""
    abi, _ = landlock_abi()
    arch, _ = seccomp_arch()
    nobody = os.geteuid() == 0 and not uid_switch_error()
    return Plan(nobody, True, Landlock(abi) if abi else None,
                Filter(build_filter(arch, worker_rules())) if arch else None)


def _current_plan() -> Plan:
    global _plan
    if _plan is None:
        _plan = _default_plan()
    return _plan


def worker_filters(arch: str) -> tuple[Filter, Filter]:
    """(the fork server's filter, each worker's addition): :func:`worker_rules` in two parts.

    Attaching a filter costs in proportion to its length, so the long part
    is attached once, by the fork server, and each worker adds a short one.
    """
    return (Filter(build_filter(arch, server_rules())),
            Filter(build_filter(arch, worker_extra_rules(), default=RET_ALLOW)))


def uid_switch_error() -> str:
    """Why this root process cannot turn a child into uid/gid 65534; "" when it can.

    Tried in a throwaway child: a root runtime in a user namespace that maps
    only uid 0 (``unshare -r``, rootless containers) cannot.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the throwaway child
        try:
            os.close(r)
            why = ""
            for fn, arg in ((os.setgroups, []), (os.setgid, NOBODY), (os.setuid, NOBODY)):
                try:
                    fn(arg)
                except OSError as e:
                    why = f"{fn.__name__}({arg}) refused: {reason(e)}"
                    break
            os.write(w, why.encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        data = b""
        while chunk := os.read(r, 4096):
            data += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    why = data.decode(errors="replace")
    if why:
        try:
            with open("/proc/self/uid_map") as f:
                uid_map = "; ".join(" ".join(line.split()) for line in f)
        except OSError:
            uid_map = "?"
        why += f"; uid_map: {uid_map}"
    return why


def become_nobody() -> None:
    """In a worker, first of the layers: uid/gid 65534 and no groups, when the plan says so."""
    if _current_plan().nobody:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def lock_worker() -> None:
    """The last step of a worker's lock-down: what the plan says of capabilities, Landlock, seccomp.

    Needs NO_NEW_PRIVS already set.  Raises if a layer the fork server
    verified cannot be applied: the worker then dies and the call fails.
    """
    plan = _current_plan()
    if plan.drop_caps:
        capset(frozenset())
    if plan.landlock is not None:
        plan.landlock.restrict()
    if plan.seccomp is not None:
        plan.seccomp.install()


# --------------------------------------------------------------------------- the probe


def _errno_name(e: int) -> str:
    return errno.errorcode.get(e, str(e))


def probe() -> dict[str, Any]:
    """Run inside a locked-down worker: what can it still do?  (Uses nothing that imports.)"""
    out: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
    out["no_new_privs"] = _prctl(_PR_GET_NO_NEW_PRIVS)
    out["seccomp_mode"] = _prctl(_PR_GET_SECCOMP)
    eff, prm = capget()
    out["caps"] = eff | prm
    fd = _libc.socket(ctypes.c_int(2), ctypes.c_int(1), ctypes.c_int(0))  # AF_INET, SOCK_STREAM
    if fd >= 0:
        os.close(fd)
        out["socket"] = "allowed"
    else:
        out["socket"] = _errno_name(ctypes.get_errno())
    if _MACHINE in ARCHES:  # a path that does not exist: nothing runs even if exec is allowed
        execve = SYSCALLS["execve"][ARCHES[_MACHINE][0]]
        r = _syscall(ctypes.c_long(execve), ctypes.c_char_p(b"/nonexistent/brainstem-probe"), None, None)
        out["execve"] = _errno_name(ctypes.get_errno()) if r < 0 else "allowed"
    else:
        out["execve"] = "not checked"
    r = _syscall(ctypes.c_long(UNKNOWN_SYSCALL), None)  # under the allowlist: EPERM, not ENOSYS
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


# --------------------------------------------------------------------------- fork server setup


def switch_from_env(environ=None) -> tuple[str, ...]:
    """The layers ``BRAINSTEM_SANDBOX_ISOLATION`` turns off (read by the runtime)."""
    value = (environ if environ is not None else os.environ).get(ENV_SWITCH, "").strip().lower()
    if value == "off":
        return LAYERS
    if value.startswith("off:"):
        return tuple(n for n in LAYERS if n in {p.strip() for p in value[4:].split(",")})
    return ()


def _on(detail: str) -> dict:
    return {"state": "on", "detail": detail}


def _off(detail: str) -> dict:
    return {"state": "off", "detail": detail}


def _not_needed(detail: str) -> dict:
    return {"state": "not needed", "detail": detail}


class ServerSetup:
    """What the fork server did to itself and plans for its workers, and why."""

    def __init__(self, disabled: tuple[str, ...]):
        self.disabled = frozenset(disabled)
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.root = os.geteuid() == 0
        # Whether workers can become nobody: why not, for a root runtime that cannot.
        self.switch_error = ""
        self.layers: dict[str, dict] = {}
        self.notes: dict[str, str] = {}
        self.probe: dict | None = None
        self.report_bytes = b"{}"

    def switched_off(self, layer: str) -> bool:
        return layer in self.disabled

    @property
    def nobody(self) -> bool:
        """A root runtime whose workers switch to uid 65534."""
        return self.root and not self.switch_error

    def off_reason(self) -> str:
        return f"switched off ({ENV_SWITCH}); this weakens the sandbox"


def setup_server(disabled: tuple[str, ...], lock_down: Callable[[int, int, int, int], None]) -> ServerSetup:
    """Isolate the fork server and prepare the workers' plan; never raises for a missing feature.

    Call after every import the workers need and before the first fork.
    """
    global _plan
    s = ServerSetup(disabled)
    outside_net = _netns_id()
    if s.root:
        s.switch_error = uid_switch_error()

    # -- namespaces (a root runtime that cannot make workers nobody takes the non-root path)
    userns = False
    netns_error = ""
    if s.nobody:
        s.layers["user_namespace"] = _not_needed("the runtime is root: workers switch to uid 65534")
    elif s.switched_off("userns"):
        s.layers["user_namespace"] = _off(s.off_reason())
    else:
        flags = CLONE_NEWUSER | (0 if s.switched_off("netns") else CLONE_NEWNET)
        try:
            _unshare(flags)
            userns = True
            _write_proc("/proc/self/setgroups", "deny")
            _write_proc("/proc/self/uid_map", f"{NOBODY} {s.uid} 1\n")
            _write_proc("/proc/self/gid_map", f"{NOBODY} {s.gid} 1\n")
            s.layers["user_namespace"] = _on(
                f"fork server and workers run as uid/gid {NOBODY} in a user namespace, which is the "
                f"runtime's uid {s.uid} outside it"
            )
        except OSError as e:
            if userns:
                s.layers["user_namespace"] = _off(f"entered but the id map was refused: {reason(e)}")
            else:
                s.layers["user_namespace"] = _off(f"unshare(CLONE_NEWUSER) refused: {reason(e)}")
                netns_error = f"no user namespace to own one ({reason(e)})"
    if s.switched_off("netns"):
        s.layers["network_namespace"] = _off(s.off_reason())
    else:
        if not userns:
            try:
                _unshare(CLONE_NEWNET)
            except OSError as e:
                netns_error = netns_error or f"unshare(CLONE_NEWNET) refused: {reason(e)}"
        inside_net = _netns_id()
        if inside_net != outside_net and inside_net != "?":
            s.layers["network_namespace"] = _on(
                f"fork server and workers share {inside_net}, which has no interface up "
                f"(the runtime's is {outside_net}); workers keep only their channel socket"
            )
        else:
            s.layers["network_namespace"] = _off(netns_error or "namespace unchanged")

    # -- filesystem (imports first: nothing can be read afterwards)
    landlock: Landlock | None = None
    fs_off_why = ""
    if s.switched_off("landlock"):
        fs_off_why = "Landlock " + s.off_reason()
    else:
        abi, why = landlock_abi()
        if abi:
            landlock = Landlock(abi)
        else:
            fs_off_why = why
    chroot_done = False
    if landlock is not None or not s.switched_off("chroot"):
        s.notes["codecs"] = f"{preload_codecs()} codecs imported before the lock-down"
    if landlock is None and not s.switched_off("chroot"):
        if s.root or userns:
            try:
                _enter_empty_root()
                chroot_done = True
            except OSError as e:
                fs_off_why += f"; chroot to an empty directory failed: {reason(e)}"
        else:
            fs_off_why += "; no chroot either (needs root or a user namespace)"
    elif landlock is None:
        fs_off_why += "; chroot " + s.off_reason()

    # -- capabilities
    keep = ROOT_SERVER_CAPS if s.nobody else frozenset()
    if s.switched_off("caps"):
        s.layers["capabilities"] = _off(s.off_reason())
    else:
        try:
            _, permitted = capget()
            keep = frozenset(c for c in keep if permitted >> c & 1)
            drop_bounding(keep)
            capset(keep)
        except OSError as e:
            s.notes["caps_error"] = reason(e)
    drop_in_workers = not s.switched_off("caps") and "caps_error" in s.notes
    status = _status_fields()
    s.notes["server_capeff"] = status.get("CapEff", "?")
    s.notes["server_capbnd"] = status.get("CapBnd", "?")

    try:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    except OSError:  # pragma: no cover - kernels before 3.5
        pass

    # -- seccomp
    worker_filter = server_filter = None
    seccomp_why = ""
    if s.switched_off("seccomp"):
        seccomp_why = s.off_reason()
    else:
        arch, seccomp_why = seccomp_arch()
        if arch:
            server_filter, worker_filter = worker_filters(arch)

    # -- check it all on a probe worker; if that fails, back off seccomp, then Landlock too
    attempts = [(landlock, server_filter, worker_filter)]
    if worker_filter is not None:
        attempts.append((landlock, None, None))
    if landlock is not None:
        attempts.append((None, None, None))
    failures: list[str] = []
    found = None
    for ll, sf, wf in attempts:
        _plan = Plan(s.nobody, drop_in_workers, None, wf)  # Landlock: the fork server's domain, inherited
        found, why = self_test(lock_down, _server_lock(ll, sf), timeout=5.0)
        if found is not None:
            break
        failures.append(why)
    if worker_filter is not None and wf is None:
        seccomp_why = f"the filter broke the probe worker ({failures[0]})"
    if landlock is not None and ll is None:
        fs_off_why = f"Landlock broke the probe worker ({failures[-1]})"
    landlock, server_filter, worker_filter = ll, sf, wf
    s.probe = found
    if found is None:
        s.notes["probe_error"] = failures[-1]

    # -- lock the fork server itself
    if landlock is not None:
        try:
            landlock.restrict()
        except OSError as e:
            s.notes["server_landlock_error"] = reason(e)
    if server_filter is not None:
        try:
            server_filter.install()
        except OSError as e:
            s.notes["server_seccomp_error"] = reason(e)
            server_filter = None
            worker_filter = _plan.seccomp = Filter(build_filter(_MACHINE, worker_rules()))

    _describe(s, landlock, chroot_done, fs_off_why, worker_filter, server_filter, seccomp_why, keep)
    s.report_bytes = json.dumps(build_report(s)).encode()
    return s


def _server_lock(landlock: Landlock | None, server_filter: Filter | None) -> Callable[[], None]:
    """What the fork server will do to itself (and its workers inherit), for the probe to do first."""
    def lock() -> None:
        if landlock is not None:
            landlock.restrict()
        if server_filter is not None:
            server_filter.install()
    return lock


def setup_failed(disabled: tuple[str, ...], error: BaseException) -> ServerSetup:
    """When setup_server itself failed: workers get no new layer, and the report says why."""
    global _plan
    s = ServerSetup(disabled)
    if s.root:
        try:
            s.switch_error = uid_switch_error()
        except Exception as e:  # noqa: BLE001 - then workers keep the uid rather than fail
            s.switch_error = f"could not try: {reason(e)}"
    _plan = Plan(s.nobody, False, None, None)
    why = f"fork server isolation setup failed: {reason(error)}"
    for name in ("user_namespace", "network_namespace", "seccomp", "filesystem", "capabilities"):
        s.layers[name] = _off(why)
    s.layers["uid_drop"] = (_on(f"workers run as uid/gid {NOBODY} (nobody)") if s.nobody
                            else _off(_uid_kept(s)))
    s.layers["no_new_privs"] = _on("set in every worker")
    s.layers["rlimits"] = _on("address space, CPU, NPROC 0, FSIZE 0, NOFILE, CORE 0")
    s.report_bytes = json.dumps(build_report(s)).encode()
    return s


def _describe(s: ServerSetup, landlock, chroot_done, fs_off_why, worker_filter, server_filter,
              seccomp_why, keep) -> None:
    p = s.probe or {}
    fs_hidden = (p.get("root_dir") in ("EACCES", "EPERM", "0 entries")
                 and p.get("etc_passwd") in ("EACCES", "EPERM", "ENOENT"))
    if landlock is not None and fs_hidden:
        s.layers["filesystem"] = _on(landlock.describe() + " (the fork server's domain, which every "
                                                           "worker inherits)")
    elif chroot_done and fs_hidden:
        s.layers["filesystem"] = _on(f"empty root: the fork server chrooted into a deleted directory "
                                     f"({fs_off_why.lstrip('; ')})")
    elif landlock is not None or chroot_done:
        s.layers["filesystem"] = _off(f"applied but the probe worker could still list / "
                                      f"({p.get('root_dir')}) or read /etc/passwd ({p.get('etc_passwd')})")
    else:
        extra = "; workers still cannot open files for writing (seccomp)" if worker_filter else ""
        s.layers["filesystem"] = _off(fs_off_why.lstrip("; ") + extra)

    if worker_filter is not None and p.get("seccomp_mode") == 2 and p.get("socket") == "EPERM" \
            and p.get("execve") == "EPERM" and p.get("unknown_syscall") == "EPERM":
        column = ARCHES[_MACHINE][0]
        n_allowed = sum(1 for name in worker_rules() if SYSCALLS[name][column] is not None)
        how = ("the fork server's filter, inherited, plus each worker's, which takes away fork, kill, "
               "setuid and the rest only the server needs")
        if server_filter is None:
            how = (f"each worker installs it whole: the fork server's own filter failed "
                   f"({s.notes.get('server_seccomp_error')})")
        s.layers["seccomp"] = _on(
            f"each worker: an allowlist of {n_allowed} syscalls (its own memory, clocks, signal handlers "
            f"and ids, I/O on the fds it holds, a read-only open; prctl and prlimit64 on itself only); "
            f"anything else fails with EPERM ({', '.join(g for g, _ in NEVER)}, new syscalls ...), "
            f"opening for writing with EACCES, clone3 with ENOSYS; a foreign architecture or x32 kills "
            f"the process ({how})"
        )
    elif worker_filter is not None:
        s.layers["seccomp"] = _off(f"installed but the probe worker saw mode {p.get('seccomp_mode')}, "
                                   f"socket {p.get('socket')}, execve {p.get('execve')}, "
                                   f"an unknown syscall {p.get('unknown_syscall')}")
    else:
        s.layers["seccomp"] = _off(seccomp_why or "unavailable")

    if "capabilities" not in s.layers:
        eff, bnd = _hex(s.notes["server_capeff"]), _hex(s.notes["server_capbnd"])
        if eff is not None and eff & ~_mask(keep) == 0 and p.get("caps") == 0:
            if s.nobody:
                detail = f"fork server keeps {_cap_names(eff)} (CapEff {eff:016x}"
                detail += f", bounding set {bnd:016x})" if bnd is not None else ")"
                if bnd is not None and bnd & ~_mask(keep):
                    detail += "; its bounding set could not be reduced (no CAP_SETPCAP)"
            elif s.layers["user_namespace"]["state"] == "on":
                detail = "fork server dropped every capability of its user namespace"
            elif s.root:
                detail = "fork server dropped every capability (workers cannot be made nobody here)"
            else:
                detail = "the runtime is not root: the fork server holds none"
            s.layers["capabilities"] = _on(detail + "; workers hold none")
        else:
            s.layers["capabilities"] = _off(
                f"fork server CapEff {s.notes['server_capeff']}, probe worker {p.get('caps')}"
                + (f": {s.notes['caps_error']}" if "caps_error" in s.notes else ""))

    uid = p.get("uid")
    if s.nobody:
        if uid == NOBODY:
            s.layers["uid_drop"] = _on(f"workers run as uid/gid {NOBODY} (nobody), no supplementary groups")
        else:
            s.layers["uid_drop"] = _off(f"the probe worker ran as uid {uid}")
    else:
        s.layers["uid_drop"] = _off(_uid_kept(s))

    if p.get("no_new_privs") == 1:
        s.layers["no_new_privs"] = _on("set in the fork server and every worker")
    else:
        s.layers["no_new_privs"] = _off(f"probe worker saw {p.get('no_new_privs')}")
    lim = p.get("rlimits") or {}
    if lim.get("NPROC") == 0 and lim.get("FSIZE") == 0 and lim.get("CORE") == 0:
        s.layers["rlimits"] = _on(
            f"address space (the call's memory_mb), CPU (timeout + 1 s), NPROC 0, FSIZE 0, "
            f"NOFILE {lim.get('NOFILE')}, CORE 0")
    else:
        s.layers["rlimits"] = _off(f"probe worker saw {lim}")


def _uid_kept(s: ServerSetup) -> str:
    """Why workers keep the runtime's uid, and what keeps them from its files and processes."""
    who = (f"the runtime is uid 0 but cannot make workers uid {NOBODY} ({s.switch_error})" if s.root
           else "the runtime is not root")
    if s.layers.get("user_namespace", {}).get("state") == "on":
        return (f"{who}: workers keep its uid {s.uid} (seen as {NOBODY} inside their user namespace); "
                f"Landlock and seccomp, not the uid, keep them from its files and processes")
    return f"{who}: workers share its uid {s.uid}"


def _hex(text: str) -> int | None:
    try:
        return int(text, 16)
    except (TypeError, ValueError):
        return None


def _mask(caps) -> int:
    m = 0
    for c in caps:
        m |= 1 << c
    return m


_ORDER = ("uid_drop", "user_namespace", "network_namespace", "seccomp", "filesystem",
          "capabilities", "no_new_privs", "rlimits")


def build_report(s: ServerSetup) -> dict:
    protections = {name: s.layers[name] for name in _ORDER if name in s.layers}
    return {
        "runtime": ("root" if s.nobody else f"uid 0 that cannot switch to uid {NOBODY}" if s.root
                    else f"non-root (uid {s.uid})"),
        "switch": ("on" if not s.disabled else f"{ENV_SWITCH} turns off: {', '.join(sorted(s.disabled))}"),
        "protections": protections,
        "off": [name for name, v in protections.items() if v["state"] == "off"],
        "probe": s.probe,
        "notes": s.notes,
    }


# --------------------------------------------------------------------------- runtime side

_cache: dict[int, dict] = {}


def report(refresh: bool = False) -> dict:
    """Which protections workers have here, and why any is off.

    Asks the fork server (starting it if needed) for what it found when it
    locked down a probe worker at start; cached per fork server.  Adds what
    the runtime sees of the fork server now in /proc.
    """
    import socket

    from brainstem.sandbox import runner

    try:
        server = runner._get_server()
        pid = server.proc.pid
        base = None if refresh else _cache.get(pid)
        if base is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with ours:
                try:
                    server.spawn({"op": "report"}, [theirs.fileno()])
                finally:
                    theirs.close()
                ours.settimeout(5.0)
                data = b""
                while chunk := ours.recv(65536):
                    data += chunk
            base = json.loads(data)
            _cache.clear()
            _cache[pid] = base
    except Exception as e:  # noqa: BLE001 - a report must never raise
        return {"available": False, "error": f"{type(e).__name__}: {e}", "protections": {}, "off": []}
    out = dict(base)
    out["available"] = True
    out["fork_server_pid"] = pid
    st = _status_fields(f"/proc/{pid}/status")
    out["fork_server"] = {k: st.get(k) for k in ("Uid", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp")}
    return out
