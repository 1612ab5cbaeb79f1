"""Reading processes from /proc, for the tests that watch sandbox workers from outside."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")


def stat(pid: int) -> tuple[str, str, int, int, int, int] | None:
    """(comm, state, ppid, pgrp, session, starttime) from /proc/<pid>/stat, or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    rest = text[text.rindex(")") + 2 :].split()
    return comm, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])


def comm(pid: int) -> str:
    st = stat(pid)
    return st[0] if st else ""


def children(ppid: int) -> list[int]:
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st and st[2] == ppid:
                out.append(int(entry.name))
    return out


def named(name: str) -> list[int]:
    """The live children of the fork server called ``name`` (``brainstem-idle``: the waiting workers)."""
    from brainstem.sandbox import server_pid

    srv = server_pid()
    if not srv:
        return []
    alive = ((p, stat(p)) for p in children(srv))
    return [p for p, st in alive if st and st[0] == name and st[1] != "Z"]


def descendants(root: int) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        kids = [k for pid in frontier for k in children(pid)]
        found += kids
        frontier = kids
    return found


def wait_for(pred, timeout: float, step: float = 0.02):
    """``pred()``'s first truthy value within ``timeout`` seconds (its last value otherwise)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return pred()


def read_memory(pid: int) -> bytes:
    """What a process holds in its readable mappings (of up to 256 MiB each)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in addr.split("-"))
            if end - start > 256 << 20:
                continue
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def read_all(fd: int) -> bytes:
    """Everything until EOF, then the fd closed."""
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    return data
