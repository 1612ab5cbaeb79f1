"""The isolation report, runtime side: which protections workers have here, and why any is off.

The fork server builds the report once, when it locks down a probe worker at
start (``kernel.report``); :func:`report` asks the live fork server for it
(starting the server if needed), caches it per fork server, and adds what the
runtime sees of the fork server now in /proc.  ``brainstem status`` shows it.
"""

from __future__ import annotations

import json
import socket

from brainstem.sandbox import fork_client
from brainstem.sandbox.kernel.procfs import status_fields
from brainstem.sandbox.protocol import REPORT

_cache: dict[int, dict] = {}


def report(refresh: bool = False) -> dict:
    """Which protections workers have here, and why any is off.

    Asks the fork server (starting it if needed) for what it found when it
    locked down a probe worker at start; cached per fork server.  Adds what
    the runtime sees of the fork server now in /proc.  Never raises.
    """
    try:
        server = fork_client.get_server()
        pid = server.proc.pid
        base = None if refresh else _cache.get(pid)
        if base is None:
            base = _ask(server)
            _cache.clear()
            _cache[pid] = base
    except Exception as e:  # noqa: BLE001 - a report must never raise
        return {"available": False, "error": f"{type(e).__name__}: {e}", "protections": {}, "off": []}
    out = dict(base)
    out["available"] = True
    out["fork_server_pid"] = pid
    st = status_fields(f"/proc/{pid}/status")
    out["fork_server"] = {k: st.get(k) for k in ("Uid", "CapEff", "CapBnd", "NoNewPrivs", "Seccomp")}
    return out


def _ask(server: fork_client.ForkServer) -> dict:
    """The fork server's report, read from a socket it writes it to and closes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        try:
            server.send(REPORT, fds=[theirs.fileno()])
        finally:
            theirs.close()
        ours.settimeout(5.0)
        data = b""
        while chunk := ours.recv(65536):
            data += chunk
    return json.loads(data)
