"""Seccomp: the workers' syscall allowlist, and the BPF program that enforces it.

An allowlist, as BPF built here from the explicit table in ``syscalls``: a
worker may touch its own memory, clocks, signal handlers, ids and limits, and
do I/O on the fds it holds; every other syscall fails with EPERM (opening for
writing with EACCES, clone3 with ENOSYS), and a foreign architecture or the
x32 ABI kills the process.  Installed in two parts because attaching a filter
costs in proportion to its length: the fork server attaches the bulk once
(:func:`server_rules`, which its workers inherit) and each worker adds a short
filter taking ``SERVER_ONLY`` away again (:func:`worker_extra_rules`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

from brainstem.sandbox.kernel.libc import (
    NAMESPACE_FLAGS,
    PR_CAP_AMBIENT,
    PR_GET_NO_NEW_PRIVS,
    PR_GET_SECCOMP,
    PR_SET_NAME,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    PR_SET_SECCOMP,
    SECCOMP_MODE_FILTER,
    prctl,
    prctl_ptr,
)
from brainstem.sandbox.kernel.syscalls import ARCHES, MACHINE, SYSCALLS, X32_SYSCALL_BIT

# open(2)/openat(2) flags that write or create (same values on x86_64 and aarch64).
OPEN_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC

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
PRCTL_OPTIONS = (PR_SET_PDEATHSIG, PR_SET_NAME, PR_GET_SECCOMP, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS,
                 PR_GET_NO_NEW_PRIVS, PR_CAP_AMBIENT)
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
        prog += [(_BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), (_BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
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
        if prctl_ptr(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._fprog_ptr, 0, 0) < 0:
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self._fprog_ptr)  # again, for the errno


def seccomp_arch() -> tuple[str | None, str]:
    """(arch, "") when this process can use the table, else (None, why not)."""
    machine = MACHINE
    if machine not in ARCHES:
        return None, f"no syscall table for {machine or 'this machine'}"
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        return None, f"not a 64-bit little-endian {machine} process"
    return machine, ""


def worker_filters(arch: str) -> tuple[Filter, Filter]:
    """(the fork server's filter, each worker's addition): :func:`worker_rules` in two parts.

    Attaching a filter costs in proportion to its length, so the long part
    is attached once, by the fork server, and each worker adds a short one.
    """
    return (Filter(build_filter(arch, server_rules())),
            Filter(build_filter(arch, worker_extra_rules(), default=RET_ALLOW)))
