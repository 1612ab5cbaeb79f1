"""Landlock: a ruleset handling every access right the kernel knows, and granting none.

Nothing is readable, writable or executable; TCP bind/connect (ABI >= 4),
signals and abstract unix sockets (ABI >= 6) are scoped the same way.  The
fork server applies it to itself before its first fork, so every worker
inherits the domain.
"""

from __future__ import annotations

import ctypes
import errno
import os

from brainstem.sandbox.kernel.libc import LIBC, err, syscall, syscall_fd_flags, syscall_ptr_size_flags
from brainstem.sandbox.kernel.syscalls import SYSCALLS

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
    if LIBC is None:  # pragma: no cover
        return 0, "no libc"
    r = syscall(ctypes.c_long(_LL_CREATE), None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_VERSION))
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
        fd = syscall_ptr_size_flags(_LL_CREATE, self._attr_ptr, self.size, 0)
        if fd < 0:  # again, for the errno
            fd = syscall(ctypes.c_long(_LL_CREATE), ctypes.c_void_p(self._attr_ptr),
                          ctypes.c_size_t(self.size), ctypes.c_uint32(0))
            if fd < 0:
                raise err("landlock_create_ruleset")
        try:
            if syscall_fd_flags(_LL_RESTRICT, fd, 0) < 0:
                if syscall(ctypes.c_long(_LL_RESTRICT), ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
                    raise err("landlock_restrict_self")
        finally:
            os.close(fd)
