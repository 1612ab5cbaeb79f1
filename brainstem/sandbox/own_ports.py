"""The ports the runtime itself listens on (the dashboard, the metrics endpoint): ``ctx.fetch`` never
reaches them, even where the operator allows loopback or the host's own addresses.

A server registers its port in this process, and in a host-local directory
(``$XDG_STATE_HOME/brainstem/listening``, else ``~/.local/state/brainstem/listening``)
so that a dashboard started by another command is known to the runtime that
runs tools. An entry whose process has exited is ignored.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import socket
from functools import lru_cache
from pathlib import Path

from brainstem.core import environment

_ours: set[int] = set()


def _directory() -> Path:
    return environment.state_home() / "brainstem" / "listening"


def register(port: int) -> None:
    """Note that this process listens on ``port``; forgotten when the process exits."""
    _ours.add(int(port))
    path = _directory() / str(int(port))
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(str(os.getpid()))
        atexit.register(_forget, path)


def _forget(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(os.getpid()):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, under another user
    return True


def ports() -> set[int]:
    """Every port a live runtime process on this host listens on."""
    out = set(_ours)
    with contextlib.suppress(OSError):
        for entry in _directory().iterdir():
            try:
                if entry.name.isdigit() and _alive(int(entry.read_text().strip() or 0)):
                    out.add(int(entry.name))
            except (OSError, ValueError):
                continue
    return out


@lru_cache(maxsize=1)
def _host_addresses() -> frozenset[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError, UnicodeError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.add(str(info[4][0]).split("%", 1)[0])
    return frozenset(found)


def is_own(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> bool:
    """Whether ``ip:port`` is one of the runtime's own listening sockets on this host."""
    if port not in ports():
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    ip = mapped or ip
    return ip.is_loopback or ip.is_unspecified or str(ip) in _host_addresses()
