"""HTTP with one deadline for the whole exchange, not a fresh timeout for every read.

httpx's timeouts apply to each socket operation, so a server that drips one
byte a second keeps a request alive for ever. Here the network backend under
httpx ends every connect, TLS handshake, read and write at one absolute
deadline: used by tool fetches and by the hard-coded LLM client alike.
"""

from __future__ import annotations

import functools
import ssl
import time
from typing import Any

import httpcore
import httpx


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process, shared by tool fetches and the LLM client: building
    one loads the CA bundle (~25 ms), too slow per call."""
    return httpx.create_ssl_context()


class DeadlineClock:
    """The deadline a transport's waits end at (``time.monotonic()``); moved on between attempts."""

    def __init__(self, deadline: float):
        self.deadline = deadline


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every wait ends at the exchange's deadline, not a fresh timeout per read:
    a server dripping one byte a second cannot hold a fetch past its deadline."""

    def __init__(self, inner: httpcore.NetworkStream, clock: DeadlineClock):
        self._inner = inner
        self._clock = clock

    def _left(self, timeout: float | None, exc: type[Exception]) -> float:
        left = self._clock.deadline - time.monotonic()
        if left <= 0:
            raise exc("deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, self._left(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner, self._clock)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self, clock: DeadlineClock):
        self._inner = httpcore.SyncBackend()
        self._clock = clock

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        left = self._clock.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("deadline passed")
        timeout = left if timeout is None else min(timeout, left)
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _DeadlineStream(stream, self._clock)

    def connect_unix_socket(self, *args, **kwargs):  # pragma: no cover - never used for fetch
        raise httpcore.ConnectError("unix sockets are not reachable by fetch")

    def sleep(self, seconds: float) -> None:  # pragma: no cover
        time.sleep(seconds)


def deadline_transport(deadline: float | DeadlineClock, ssl_context: ssl.SSLContext) -> httpx.HTTPTransport:
    """An httpx transport whose every connect, read and write ends by ``deadline`` (a
    ``time.monotonic()`` value, or a :class:`DeadlineClock` to move it between requests)."""
    clock = deadline if isinstance(deadline, DeadlineClock) else DeadlineClock(deadline)
    transport = httpx.HTTPTransport(verify=ssl_context, trust_env=False)
    # httpx builds its connection pool with the default network backend; ours bounds every wait.
    transport._pool = httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=_DeadlineBackend(clock))
    return transport
