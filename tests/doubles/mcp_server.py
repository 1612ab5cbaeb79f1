"""Small MCP servers that misbehave on purpose, on the SDK's own server (``MCPServer``), for tests.

Run as ``python tests/doubles/mcp_server.py MODE [PORT]``:

``probe``       ``whoami``: its pid, process group, session and environment's names; ``leak``: the value of
                its ``PROBE_SECRET`` (a server that echoes its credential); ``spawn``: starts ``sleep`` in
                its own process group and answers its pid (what must not outlive the session); ``touch``:
                writes a line to a file (what shows a call was made)
``fail``        ``broken``: raises (an error result); ``crash``: the server dies mid-call
``hang``        ``wait``: never answers
``huge``        ``big``: answers ``n`` megabytes of text
``no-start``    never answers the handshake (reads its stdin and does nothing)
``exit``        writes a line to stderr and exits 3 before any message
``http``        streamable HTTP on 127.0.0.1:PORT/mcp: ``header``, the Authorization header it was sent
"""

# No `from __future__ import annotations`: the SDK reads the tools' annotations, Context among them.

import os
import subprocess
import sys
import time


def main() -> None:
    mode = sys.argv[1]
    if mode == "exit":
        print("probe: refusing to start: bad configuration", file=sys.stderr)
        sys.exit(3)
    if mode == "no-start":
        for _ in sys.stdin:
            pass
        time.sleep(3600)
        return
    from mcp.server.mcpserver import Context, MCPServer

    app = MCPServer(f"double-{mode}")
    if mode == "probe":
        @app.tool(description="Who the server is: pid, process group, session, the names in its environment.")
        def whoami() -> dict:
            return {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "env": sorted(os.environ)}

        @app.tool(description="The server's own credential, echoed back.")
        def leak() -> str:
            return f"my token is {os.environ.get('PROBE_SECRET')}"

        @app.tool(description="Write a file (what shows whether a call was made).")
        def touch(path: str) -> str:
            with open(path, "a") as f:
                f.write("called\n")
            return "written"

        @app.tool(description="Start a child process in the server's process group; its pid.")
        def spawn() -> int:
            return subprocess.Popen(["sleep", "600"]).pid
    elif mode == "fail":
        @app.tool(description="Always fails.")
        def broken(what: str = "") -> str:
            raise RuntimeError(f"the backend is down ({what})")

        @app.tool(description="Dies in the middle of the call.")
        def crash() -> str:
            os._exit(1)
    elif mode == "hang":
        @app.tool(description="Never answers.")
        def wait() -> str:
            time.sleep(3600)
            return "late"
    elif mode == "huge":
        @app.tool(description="A very large answer.")
        def big(n: int = 5) -> str:
            return "x" * (n * 1024 * 1024)
    elif mode == "http":
        @app.tool(description="The Authorization header this request carried.")
        def header(ctx: Context) -> str:
            headers = ctx.headers or {}
            return f"you sent {headers.get('authorization')}"

        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
        return
    app.run()


if __name__ == "__main__":
    main()
