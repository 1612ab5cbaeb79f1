"""The seccomp policy (brainstem/sandbox/kernel/seccomp.py) on paper: the BPF program, evaluated here
for x86_64 and aarch64; the allowlist's lists; and the syscall table (kernel/syscalls.py), checked
against the kernel headers and libseccomp (required in CI).  The filter on a real process is checked
in test_isolation.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import signal
import struct
from pathlib import Path

import pytest

from brainstem.sandbox.kernel import libc, seccomp, syscalls

ARCH, _ = seccomp.seccomp_arch()


# --------------------------------------------------------------------------- the BPF program


def _run_bpf(program: bytes, arch: int, nr: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """A classic-BPF interpreter for what build_filter emits, over a struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & 0xFFFFFFFFFFFFFFFF for a in args])
    ins = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:  # ld [k]
            (acc,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif code in (0x15, 0x25, 0x35, 0x45):
            cond = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if cond else jf)
        elif code == 0x06:
            return k
        else:  # pragma: no cover
            raise AssertionError(f"unexpected opcode {code:#x}")


def _combine(*actions: int) -> int:
    """What the kernel returns when several filters are stacked: the highest-precedence action."""
    def signed(a):
        return struct.unpack("<i", struct.pack("<I", a & 0xFFFF0000))[0]
    return min(actions, key=signed)


ALLOW, KILL = seccomp.RET_ALLOW, seccomp.RET_KILL_PROCESS


def _eperm(e=errno.EPERM):
    return seccomp.RET_ERRNO | e


@pytest.mark.parametrize("arch", sorted(syscalls.ARCHES))
def test_filter_program(arch):
    column, audit = syscalls.ARCHES[arch]
    full = seccomp.build_filter(arch, seccomp.worker_rules())
    server, extra = (f.program for f in seccomp.worker_filters(arch))
    assert len(full) // 8 < 4096
    assert len(extra) // 8 < 64  # what each worker attaches stays short: attaching costs by length

    def nr_of(name):
        return syscalls.SYSCALLS[name][column]

    def verdicts(nr, args=(0,) * 6):
        a = _run_bpf(full, audit, nr, args)
        b = _combine(_run_bpf(server, audit, nr, args), _run_bpf(extra, audit, nr, args))
        assert a == b, (arch, nr, args)  # the two-part install is the same policy
        return a

    # Every number up to well past the table: allowed exactly when on the allowlist, else EPERM.
    allowed = {nr_of(n) for n in seccomp.WORKER_ALLOW} - {None}
    checked = {nr_of(n) for n in ("open", "openat", "prlimit64", "prctl", "clone3")} - {None}
    for nr in range(1024):
        if nr not in checked:
            assert verdicts(nr) == (ALLOW if nr in allowed else _eperm()), (arch, nr)
    for name in {n for _, names in seccomp.NEVER for n in names} - {"clone3"}:
        if nr_of(name) is not None:
            assert verdicts(nr_of(name)) == _eperm(), name
    # What a worker needs, numbers from the kernel headers (independent of the table).
    needed = {"x86_64": {"read": 0, "write": 1, "close": 3, "mmap": 9, "munmap": 11, "brk": 12,
                         "rt_sigreturn": 15, "getpid": 39, "sendmsg": 46, "recvmsg": 47, "exit_group": 231,
                         "futex": 202, "getrandom": 318, "clock_nanosleep": 230},
              "aarch64": {"read": 63, "write": 64, "close": 57, "mmap": 222, "munmap": 215, "brk": 214,
                          "rt_sigreturn": 139, "getpid": 172, "sendmsg": 211, "recvmsg": 212,
                          "exit_group": 94, "futex": 98, "getrandom": 278, "clock_nanosleep": 115}}[arch]
    for name, nr in needed.items():
        assert nr_of(name) == nr and verdicts(nr) == ALLOW, name
    # A worker cannot fork at all; the fork server can, but not into new namespaces.
    clone = nr_of("clone")
    for flags in (signal.SIGCHLD | 0x01200000, 0x003D0F00):  # fork(), pthread_create()
        assert verdicts(clone, (flags, 0, 0, 0, 0, 0)) == _eperm()
        assert _run_bpf(server, audit, clone, (flags, 0, 0, 0, 0, 0)) == ALLOW
    for flag in (libc.CLONE_NEWUSER, libc.CLONE_NEWNET, libc.CLONE_NEWNS, libc.CLONE_NEWPID):
        assert _run_bpf(server, audit, clone, (flag | signal.SIGCHLD, 0, 0, 0, 0, 0)) == _eperm()
    assert verdicts(nr_of("clone3")) == _eperm(errno.ENOSYS)
    openat = nr_of("openat")
    assert verdicts(openat, (-100, 0, os.O_RDONLY | os.O_CLOEXEC, 0, 0, 0)) == ALLOW
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        assert verdicts(openat, (-100, 0, flags, 0o600, 0, 0)) == _eperm(errno.EACCES)
    # The high half of a 64-bit argument cannot hide a flag in the low half.
    assert verdicts(openat, (-100, 0, (1 << 32) | os.O_WRONLY, 0, 0, 0)) == _eperm(errno.EACCES)
    # Its own limits, never another process's.
    prlimit = nr_of("prlimit64")
    assert verdicts(prlimit, (0, 7, 0, 1, 0, 0)) == ALLOW
    for pid in (1, 4242, -1, 1 << 31):
        assert verdicts(prlimit, (pid, 7, 0, 1, 0, 0)) == _eperm(), pid
    prctl = nr_of("prctl")
    for option in (15, 21, 39):  # PR_SET_NAME, PR_GET_SECCOMP, PR_GET_NO_NEW_PRIVS
        assert verdicts(prctl, (option, 0, 0, 0, 0, 0)) == ALLOW
    for option in (0x59616D61, 62, 35, 4):  # PR_SET_PTRACER, PR_SCHED_CORE, PR_SET_MM, PR_SET_DUMPABLE
        assert verdicts(prctl, (option, 0, 0, 0, 0, 0)) == _eperm(), option
    # fcntl and ioctl: the fork server's, and only for itself (no F_SETOWN, no TIOCSTI); none for a worker.
    fcntl_, ioctl = nr_of("fcntl"), nr_of("ioctl")
    assert _run_bpf(server, audit, fcntl_, (3, 3, 0, 0, 0, 0)) == ALLOW  # F_GETFL
    assert _run_bpf(server, audit, fcntl_, (3, 8, 1, 0, 0, 0)) == _eperm()  # F_SETOWN
    assert _run_bpf(server, audit, ioctl, (3, 0x5421, 0, 0, 0, 0)) == ALLOW  # FIONBIO
    assert _run_bpf(server, audit, ioctl, (0, 0x5412, 0, 0, 0, 0)) == _eperm()  # TIOCSTI
    assert verdicts(fcntl_, (3, 3, 0, 0, 0, 0)) == _eperm() and verdicts(ioctl, (3, 0x5421, 0, 0, 0, 0)) == _eperm()
    for other in (0x40000003, 0xC000003E, 0xC00000B7, 0x40000028):  # i386, the other arch, arm
        if other != audit:
            assert _run_bpf(full, other, 0) == KILL and _run_bpf(server, other, 0) == KILL
            assert _run_bpf(extra, other, 0) == KILL
    if arch == "x86_64":
        assert verdicts(0x40000000 | 39) == KILL  # x32


def test_policy_lists():
    """Nothing that acts on another process, the system or privilege is on a worker's list; the fork
    server's extra needs are taken away again in every worker."""
    never = {n for _, names in seccomp.NEVER for n in names}
    worker = {n for n, r in seccomp.worker_rules().items() if r == ALLOW or not isinstance(r, int)}
    server = {n for n, r in seccomp.server_rules().items() if r == ALLOW or not isinstance(r, int)}
    assert not worker & never, worker & never
    assert server & never == {"kill", "setuid", "setgid", "setgroups", "capset"}
    assert server - worker == set(seccomp.SERVER_ONLY)
    assert not set(seccomp.SERVER_ONLY) & set(seccomp.WORKER_ALLOW)
    for name in ("prlimit64", "prctl", "clone", "fcntl", "ioctl", "open", "openat"):
        assert name not in seccomp.WORKER_ALLOW and name not in seccomp.SERVER_ALLOW  # argument-checked
    for name in ("prlimit64", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam",
                 "sched_setattr", "ioprio_set", "kill", "tkill", "tgkill", "pidfd_open", "pidfd_getfd",
                 "pidfd_send_signal", "process_vm_readv", "process_vm_writev", "ptrace", "migrate_pages",
                 "move_pages"):
        assert name not in seccomp.WORKER_ALLOW, name
        assert name not in seccomp.SERVER_ALLOW or name in seccomp.SERVER_ONLY, name
    for name in syscalls.SYSCALLS:
        assert name in never or name in server or name in ("clone3", "landlock_create_ruleset",
                                                           "landlock_restrict_self"), name


# --------------------------------------------------------------------------- the syscall table


def _table_check_unavailable(why: str) -> None:
    """CI must check the table: a failure there (BRAINSTEM_REQUIRE_REDIS=1 or CI=true), a skip elsewhere."""
    if os.environ.get("BRAINSTEM_REQUIRE_REDIS") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"CI but {why} (.ci/run installs linux-libc-dev and libseccomp2)")
    pytest.skip(why)


def _header_numbers(path: str) -> dict[str, int]:
    out = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text):
        out.setdefault(m.group(1), int(m.group(2)))
    return out


HEADERS = {
    "x86_64": ["/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"],
    "aarch64": ["/usr/include/asm-generic/unistd.h"],
}


@pytest.mark.parametrize("arch", sorted(syscalls.ARCHES))
def test_syscall_table_matches_kernel_headers(arch):
    column = syscalls.ARCHES[arch][0]
    numbers: dict[str, int] = {}
    for path in HEADERS[arch]:
        numbers.update(_header_numbers(path))
    if not numbers and (arch == "aarch64" or ARCH == "x86_64"):  # asm-generic is installed everywhere
        _table_check_unavailable("kernel headers not installed")
    if not numbers:
        pytest.skip(f"no {arch} kernel headers on this machine")
    checked = 0
    for name, nrs in syscalls.SYSCALLS.items():
        if name not in numbers and name == "newfstatat":
            name = "fstatat"  # what asm-generic calls it
        if name in numbers:
            assert nrs[column] == numbers[name], (arch, name, nrs[column], numbers[name])
            checked += 1
        elif nrs[column] is not None and nrs[column] < 450:
            # Older than the headers' newest call yet missing from them: only legacy calls aarch64 lacks.
            assert arch != "x86_64", (arch, name)
    assert checked > 120


@pytest.mark.parametrize("arch", sorted(syscalls.ARCHES))
def test_syscall_table_matches_libseccomp(arch):
    path = ctypes.util.find_library("seccomp")
    if not path:
        _table_check_unavailable("libseccomp not installed")
    lib = ctypes.CDLL(path)
    resolve = lib.seccomp_syscall_resolve_name_arch
    resolve.restype = ctypes.c_int
    resolve.argtypes = [ctypes.c_uint32, ctypes.c_char_p]
    column, audit = syscalls.ARCHES[arch]
    checked = 0
    for name, nrs in syscalls.SYSCALLS.items():
        nr = resolve(audit, name.encode())
        if nr == -1:  # __NR_SCMP_ERROR: newer than this libseccomp
            continue
        if nr < 0:  # a pseudo-number: the architecture has no such call
            assert nrs[column] is None, (arch, name)
        else:
            assert nrs[column] == nr, (arch, name, nrs[column], nr)
        checked += 1
    assert checked > 120
