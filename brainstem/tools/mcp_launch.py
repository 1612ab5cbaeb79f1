"""What a stdio MCP server runs under: a small keeper that ends the server's whole tree with it (Linux).

The SDK starts a server in a session and process group of its own and, at the end, signals that group. A
process the server starts can leave the group (``setsid``), its environment (so no tag finds it) and its
parent (a double fork). So the server is started under this keeper, run as a plain script (``python -I -S
mcp_launch.py PARENT -- COMMAND ARGS...``: nothing of Brainstem or of site-packages is loaded):

* the keeper is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a descendant whose parent exits is
  handed to the keeper, not to init, whatever session or group it moved to;
* it gets ``SIGTERM`` when the runtime's thread that started it ends (``PR_SET_PDEATHSIG``), a runtime
  killed outright included;
* when the server exits, or the keeper is signalled (the SDK's ``SIGTERM`` at the session's end), it kills
  every process below it, again until none is left, then exits with the server's status.

The server's stdin, stdout and stderr are the keeper's; the keeper itself lets go of stdin and stdout, so
the server's end is the end of its stream. Elsewhere than Linux the keeper only runs the server.
"""

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
ROUNDS = 200  # kill rounds at most: a tree that forks as fast as it is killed still ends


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, read from /proc."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and fields[0] != b"Z":
            parent_of[int(entry)] = int(fields[1])
    below, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier and pid not in below}
        below.extend(frontier)
    return below


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end(code: int) -> None:
    """Kill everything below the keeper, round after round (each kill hands the killed one's children to
    the keeper), and exit with ``code``."""
    me = os.getpid()
    for _ in range(ROUNDS):
        below = descendants(me) if os.path.isdir("/proc") else []
        if not below:
            break
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
        reap()
    reap()
    os._exit(code)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        print("mcp_launch: usage: mcp_launch.py PARENT_PID -- COMMAND [ARGS...]", file=sys.stderr)
        os._exit(2)
    parent, command = int(argv[0]), argv[2:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the runtime was gone before the signal was asked for
            os._exit(1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: end(128 + signum))
    server = os.fork()
    if server == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"mcp_launch: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        os._exit(127)
    quiet = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == server:
            code = os.waitstatus_to_exitcode(status)
            break
    end(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
