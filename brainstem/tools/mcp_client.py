"""The operator's MCP servers, as one session talks to them: on the official ``mcp`` SDK.

:class:`MCPServers` holds the connections of one session (or one scheduled run, or one ``brainstem tool
run``). A server is started (stdio) or connected (streamable HTTP) the first time its tools are listed or
called, kept for the rest of the session, and ended with it (:meth:`MCPServers.close`). The SDK is async;
the session is not: the connections live on one event loop in a thread of their own, and each call from
the session waits for its answer no longer than it is given.

A stdio server is code the operator installed, but the agent chooses its arguments, so it runs:

* in a session and process group of its own (the SDK starts it so), under a keeper that is its child
  subreaper (:mod:`brainstem.tools.mcp_launch`): when the session ends, or the runtime dies, every process
  the server started ends too, one that left its group, its environment and its parent included (Linux);
* with a clean environment: ``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM`` and ``USER`` from the
  runtime's, and the ``env`` of the operator's file; none of the runtime's own settings or keys;
* its stderr kept apart (a temporary file), read only for the last line of a server that failed.

Everything a server sends back (results, errors, tool descriptions and schemas) has every secret of the
operator's file redacted before anything else sees it, and results are capped (:data:`MAX_RESULT_CHARS`).
A call that gets no answer in time ends with an error, and its server is stopped.

This is the one module that imports the SDK, and only once a server is used: the sleep path never loads it.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brainstem.core.mcp_config import MCPConfig, StdioServer

MAX_RESULT_CHARS = 50_000  # what one result may hold; a larger one is cut, and says so
MAX_TOOLS = 200  # tools one server may offer; pages past it are not asked for
CLOSE_SECONDS = 8.0  # what ending every server may take at the session's end (the SDK's own shutdown is bounded)
CONNECTION_CLOSED = -32000  # the JSON-RPC error code the SDK gives a call whose connection ended
KEEPER = str(Path(__file__).with_name("mcp_launch.py"))  # what a stdio server runs under
TAG = "BRAINSTEM_MCP_SERVER"  # set in each stdio server's environment, so what it left behind can be found


@dataclass
class Listing:
    """One server's tools as it lists them (redacted), or why it could not be asked."""
    server: str
    tools: list[dict] = field(default_factory=list)  # {"name", "description", "input"}
    error: str | None = None


@dataclass
class CallResult:
    ok: bool
    value: Any = None
    error: str | None = None


class MCPError(Exception):
    """A server could not be started, reached or asked (the message says why, in one line)."""


class MCPServers:
    """The MCP servers of one session: started on first use, ended by :meth:`close`."""

    def __init__(self, config: MCPConfig, redact: Callable[[Any], Any] = lambda v: v):
        self.config = config
        self.redact = redact
        self._conns: dict[str, _Conn] = {}
        self._listings: dict[str, Listing] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tags: set[str] = set()
        self.closed = False

    @property
    def names(self) -> list[str]:
        return sorted(self.config.enabled)

    def timeout_of(self, server: str) -> float:
        """The longest one call to ``server`` may take (its ``timeout`` in the operator's file)."""
        found = self.config.enabled.get(server)
        return found.timeout if found is not None else 0.0

    # --- the session's side ---

    def list_tools(self, server: str, timeout: float) -> Listing:
        """``server``'s tools (asked once a session, for no longer than ``timeout`` or the server's own
        ``timeout``; a failure is kept too, so it is not asked again)."""
        with self._lock:
            if server in self._listings:
                return self._listings[server]
        if server not in self.config.enabled:
            listing = Listing(server, error=f"no MCP server {server!r} in BRAINSTEM_MCP_CONFIG")
        else:
            timeout = min(timeout, self.timeout_of(server))
            try:
                tools = self._run(self._list(server, timeout), timeout)
                listing = Listing(server, tools=self.redact(tools))
            except MCPError as exc:
                listing = Listing(server, error=str(self.redact(str(exc))))
        with self._lock:
            return self._listings.setdefault(server, listing)

    def list_all(self, timeout: float) -> dict[str, Listing]:
        """Every enabled server's tools, the servers not asked yet asked side by side (each for no longer
        than ``timeout`` or its own ``timeout``, whichever is shorter)."""
        with self._lock:
            ask = [s for s in self.names if s not in self._listings]
        if ask:
            try:
                found = self._run(self._list_many(ask, timeout), timeout)
            except MCPError as exc:
                found = {s: Listing(s, error=str(exc)) for s in ask}
            with self._lock:
                for server, listing in found.items():
                    self._listings.setdefault(server, listing)
        return {s: self.list_tools(s, timeout) for s in self.names}

    async def _list_many(self, servers: list[str], timeout: float) -> dict[str, Listing]:
        async def one(server: str) -> Listing:
            try:  # each within its own ``timeout`` too
                return Listing(server, tools=self.redact(await self._list(server, min(timeout,
                                                                                     self.timeout_of(server)))))
            except MCPError as exc:
                return Listing(server, error=str(self.redact(str(exc))))
        found = await asyncio.gather(*(one(s) for s in servers))
        return {listing.server: listing for listing in found}

    def call_tool(self, server: str, tool: str, args: dict, timeout: float) -> CallResult:
        """Call ``tool`` of ``server`` with ``args``, waiting at most ``timeout`` seconds (connecting
        included); a call with no answer in time stops the server."""
        if server not in self.config.enabled:
            return CallResult(False, error=f"no MCP server {server!r} in BRAINSTEM_MCP_CONFIG")
        try:
            ok, value = self._run(self._call(server, tool, args, timeout), timeout)
        except MCPError as exc:
            return CallResult(False, error=str(self.redact(str(exc))))
        value = self.redact(value)
        return CallResult(True, value=value) if ok else CallResult(False, error=str(value))

    def close(self) -> None:
        """End every server: the SDK's shutdown (stdin closed, then the process group signalled), then
        whatever of a stdio server is still alive is killed."""
        with self._lock:
            self.closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(CLOSE_SECONDS)
            except (FutureTimeout, RuntimeError):
                pass
            loop.call_soon_threadsafe(loop.stop)
            thread.join(2.0)
        _kill_leftovers(self._tags)

    # --- the loop ---

    def _run(self, coro: Any, timeout: float) -> Any:
        with self._lock:
            if self.closed:
                coro.close()
                raise MCPError("the session's MCP servers are closed")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-servers", daemon=True)
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout + CLOSE_SECONDS)  # the coroutine bounds itself; this is a backstop
        except FutureTimeout:
            future.cancel()
            raise MCPError(f"no answer within {timeout:.1f} s") from None

    async def _conn(self, server: str, deadline: float) -> _Conn:
        conn = self._conns.get(server)
        if conn is None or conn.finished or conn.stopping:
            conn = _Conn(server, self.config.enabled[server])
            if conn.tag:
                self._tags.add(conn.tag)
            self._conns[server] = conn
            conn.task = asyncio.ensure_future(conn.run())
        left = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(asyncio.shield(conn.ready.wait()), max(0.0, left))
        except TimeoutError:
            conn.stop()
            raise MCPError(f"MCP server {server!r} did not finish starting within {_secs(left)}; it was "
                           "stopped") from None
        if conn.client is None:
            raise MCPError(f"MCP server {server!r} could not be started: {conn.error or 'it closed at once'}")
        return conn

    async def _list(self, server: str, timeout: float) -> list[dict]:
        import anyio  # noqa: PLC0415 -- the SDK's: loaded only once a server is used

        deadline = asyncio.get_running_loop().time() + timeout
        conn = await self._conn(server, deadline)
        tools: list[dict] = []
        cursor = None
        with anyio.move_on_after(max(0.0, deadline - asyncio.get_running_loop().time())) as scope:
            try:
                while len(tools) < MAX_TOOLS:
                    page = await conn.client.list_tools(cursor=cursor)
                    tools.extend({"name": t.name, "description": t.description or "", "input": t.input_schema}
                                 for t in page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
            except Exception as exc:  # noqa: BLE001 - whatever the server did, it is one line for the caller
                raise MCPError(f"MCP server {server!r} could not list its tools: {_why(exc, conn)}") from None
        if scope.cancelled_caught:
            conn.stop()
            raise MCPError(f"MCP server {server!r} did not list its tools within {_secs(timeout)}; it was stopped")
        return tools[:MAX_TOOLS]

    async def _call(self, server: str, tool: str, args: dict, timeout: float) -> tuple[bool, Any]:
        import anyio  # noqa: PLC0415 -- as above

        deadline = asyncio.get_running_loop().time() + timeout
        conn = await self._conn(server, deadline)
        with anyio.move_on_after(max(0.0, deadline - asyncio.get_running_loop().time())) as scope:
            try:
                result = await conn.client.call_tool(tool, args)
            except Exception as exc:  # noqa: BLE001 - a protocol error, a server gone: the call failed
                gone = getattr(exc, "code", CONNECTION_CLOSED) == CONNECTION_CLOSED
                if gone:  # the next call starts it again
                    conn.stop()
                return False, f"MCP server {server!r}: {_why(exc, conn if gone else None)}"
        if scope.cancelled_caught:
            conn.stop()
            return False, (f"no answer from MCP server {server!r} within {_secs(timeout)} (the time this call "
                           "had); the server was stopped")
        return _result(result)

    async def _close_all(self) -> None:
        conns = list(self._conns.values())
        for conn in conns:
            conn.stop()
        tasks = [c.task for c in conns if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_SECONDS - 0.5)


class _Conn:
    """One server's connection, held open by its own task until it is stopped."""

    def __init__(self, name: str, server: Any):
        self.name, self.server = name, server
        self.ready = asyncio.Event()
        self.client: Any = None
        self.error: str | None = None
        self.task: asyncio.Future | None = None
        self.finished = False
        self._scope: Any = None
        self.stopping = False
        self.tag = uuid.uuid4().hex if isinstance(server, StdioServer) else None
        self.errlog: Any = None

    def stop(self) -> None:
        self.stopping = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        import anyio  # noqa: PLC0415 -- the SDK's
        from mcp import Client  # noqa: PLC0415 -- the SDK: loaded only once a server is used

        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self.stopping:
                    scope.cancel()
                async with Client(_transport(self)) as client:
                    self.client = client
                    self.ready.set()
                    await anyio.sleep_forever()
        except Exception as exc:  # noqa: BLE001 - a server that cannot start: said in one line to its caller
            self.error = _why(exc, self)
        finally:
            self.client = None
            self.finished = True
            self.ready.set()
            if self.errlog is not None:
                self.errlog.close()


def _transport(conn: _Conn) -> Any:
    """The SDK's transport for ``conn``'s server: stdio (a clean environment, stderr to a file) or HTTP."""
    from contextlib import asynccontextmanager  # noqa: PLC0415 -- with the SDK below

    from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: PLC0415 -- the SDK
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415 -- the SDK
    from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: PLC0415 -- the SDK

    server = conn.server
    if isinstance(server, StdioServer):
        conn.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        # The SDK starts it with start_new_session and an environment of only its few basics and these, under
        # the keeper that ends whatever it starts (mcp_launch.py, run as a plain script).
        env = {**server.env, TAG: conn.tag or ""}
        command = _executable(server.command, env.get("PATH"), server.cwd)  # None: the runtime's PATH, as the SDK gives
        params = StdioServerParameters(command=sys.executable,
                                       args=["-I", "-S", KEEPER, str(os.getpid()), "--", command, *server.args],
                                       env=env, cwd=server.cwd)
        return stdio_client(params, errlog=conn.errlog)

    @asynccontextmanager
    async def http():
        async with create_mcp_http_client(headers=dict(server.headers)) as client, \
                streamable_http_client(server.url, http_client=client) as streams:
            yield streams

    return http()


def _executable(command: str, path: str | None, cwd: str | None) -> str:
    """``command`` as the keeper will run it, checked first: one that is missing says so here, not as a
    keeper that exited."""
    if "/" in command:
        found = command if os.access(Path(cwd or ".") / command, os.X_OK) else None
    else:
        found = shutil.which(command, path=path)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", command)
    return found


def _result(result: Any) -> tuple[bool, Any]:
    """(ok, value) of a ``CallToolResult``: its structured content when it has one, else its text (what is
    not text is described, not passed on); an error result is its text. Cut at :data:`MAX_RESULT_CHARS`."""
    parts = []
    for c in result.content or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(c.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(c, 'mime_type', '')}, {len(c.data or '') * 3 // 4} bytes, not shown]")
        elif kind == "resource":
            res = c.resource
            text = getattr(res, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {res.uri}, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {c.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    text = "\n".join(parts)
    if result.is_error:
        return False, _cut(text or "the tool reported an error")
    structured = result.structured_content
    if structured is not None:
        encoded = json.dumps(structured, ensure_ascii=False, default=str)
        if len(encoded) <= MAX_RESULT_CHARS:
            return True, structured
    return True, _cut(text)


def _cut(text: str) -> str:
    if len(text) <= MAX_RESULT_CHARS:
        return text
    return text[:MAX_RESULT_CHARS] + f"... [cut: {len(text) - MAX_RESULT_CHARS} more characters]"


def _why(exc: BaseException, conn: _Conn | None = None) -> str:
    """One line for an exception from the SDK (the first of a group), with the last line a stdio server
    wrote to its stderr when it has failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and not str(exc):
        text = type(exc).__name__
    tail = _stderr_tail(conn)
    line = f"{type(exc).__name__}: {text}" if type(exc).__name__ not in text else text
    return (line + (f" (its stderr: {tail})" if tail else ""))[:500]


def _stderr_tail(conn: _Conn | None) -> str:
    log = conn.errlog if conn is not None else None
    if log is None or log.closed:
        return ""
    try:
        log.flush()
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - 2000))
        lines = [ln.strip() for ln in log.read().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    return " ".join(lines[-1].split())[:200] if lines else ""


def _secs(s: float) -> str:
    return f"{max(0.0, s):.1f} s"


def _kill_leftovers(tags: set[str]) -> None:
    """Kill the process group of every process still carrying one of ``tags`` (a stdio server, or what it
    started, that outlived the SDK's shutdown). Linux: read from /proc; elsewhere the SDK's shutdown is all."""
    if not tags or not Path("/proc").is_dir():
        return
    ours = os.getpgid(0)
    marks = {f"{TAG}={t}".encode() for t in tags}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if not any(m in environ.split(b"\0") for m in marks):
            continue
        pid = int(entry.name)
        try:
            group = os.getpgid(pid)
            if group != ours:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
