"""Capabilities and the uid switch: what a root fork server keeps, and whether workers can be nobody.

As root the fork server keeps only CAP_SETUID, CAP_SETGID (to turn workers
into uid/gid 65534) and CAP_KILL (to kill them on timeout), in its effective,
permitted and bounding sets; otherwise it keeps none.  Workers hold none.
Whether a root runtime can make a child nobody at all (``unshare -r`` and
rootless containers map uid 0 only) is tried once, in a throwaway child.
"""

from __future__ import annotations

import ctypes
import os

from brainstem.sandbox.kernel.libc import (
    LIBC,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_CAPBSET_READ,
    err,
    prctl,
    reason,
)
from brainstem.sandbox.kernel.procfs import uid_map

NOBODY = 65534

CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_NAMES = {CAP_KILL: "CAP_KILL", CAP_SETGID: "CAP_SETGID", CAP_SETUID: "CAP_SETUID"}
ROOT_SERVER_CAPS = frozenset(CAP_NAMES)

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
    if LIBC.capget(ctypes.byref(hdr), data) < 0:
        raise err("capget")
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
    if LIBC.capset(ctypes.byref(hdr), data) < 0:
        raise err("capset")
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError:  # pragma: no cover - kernels before 4.3
        pass


def drop_bounding(keep: frozenset[int]) -> list[int]:
    """Drop every capability not in ``keep`` from the bounding set; returns those still in it."""
    left = []
    cap = 0
    while True:
        try:
            present = prctl(PR_CAPBSET_READ, cap)
        except OSError:
            break  # EINVAL: past the last capability
        if present and cap not in keep:
            try:
                prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                left.append(cap)
        elif present:
            left.append(cap)
        cap += 1
    return left


def cap_names(mask: int) -> str:
    names = [CAP_NAMES.get(c, f"cap {c}") for c in range(64) if mask >> c & 1]
    return ", ".join(names) if names else "none"


def cap_mask(caps) -> int:
    m = 0
    for c in caps:
        m |= 1 << c
    return m


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
        why += f"; uid_map: {uid_map()}"
    return why
