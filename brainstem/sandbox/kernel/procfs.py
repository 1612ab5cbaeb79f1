"""What /proc says of a process, and what is written there to map a new user namespace's ids.

No ctypes: the runtime reads the fork server's status through this for the
report, as the fork server reads its own.
"""

from __future__ import annotations

import os


def status_fields(path: str = "/proc/self/status") -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict of its fields ({} when it cannot be read)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = value.strip()
    except OSError:
        pass
    return out


def netns_id() -> str:
    """This process's network namespace, as its /proc link names it ("?" when unreadable)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "?"


def uid_map() -> str:
    """This process's user namespace uid map, one "inside outside count" per mapping."""
    try:
        with open("/proc/self/uid_map") as f:
            return "; ".join(" ".join(line.split()) for line in f)
    except OSError:
        return "?"


def write_proc(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
