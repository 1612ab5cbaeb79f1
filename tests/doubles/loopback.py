"""What every loopback test double shares: a threaded HTTP server on 127.0.0.1, started and
stopped with the double, usable as a context manager (also from a subprocess under test)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """Write one whole answer (JSON unless ``headers`` says otherwise; a header given replaces ours whatever
    its case), then close: a client that gave up meanwhile is not an error."""
    hdrs = {"Content-Type": "application/json"}
    for k, v in (headers or {}).items():
        for existing in [h for h in hdrs if h.lower() == str(k).lower()]:
            del hdrs[existing]
        hdrs[str(k)] = str(v)
    try:
        handler.send_response(status)
        for k, v in hdrs.items():
            handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(body)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
    except OSError:
        pass  # the client gave up (a timeout test) or the double is stopping


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    double: Any  # the LoopbackDouble the handler answers for

    def handle_error(self, request, client_address):  # clients time out on purpose in some tests
        pass


class LoopbackDouble:
    """Subclasses set ``handler`` (a BaseHTTPRequestHandler reading ``self.server.double``)."""

    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # lets delayed replies end promptly on stop()

    def start(self):
        if self._server is not None:
            return self
        self._stopping.clear()
        server = QuietServer(("127.0.0.1", 0), self.handler)
        server.double = self
        self._server = server
        # stop() waits for the serving loop to notice, up to one poll interval: hundreds of tests stop a double.
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._server.server_address[1]
