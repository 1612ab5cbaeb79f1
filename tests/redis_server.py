"""Start a real redis-server on loopback: for the test session, for tests that need their own
(a password, an outage), and for the benchmarks. One launcher, so they all start it the same way."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


class RedisServerError(RuntimeError):
    """No redis-server binary, or it did not answer in time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis_server(workdir: str | Path, port: int | None = None, *extra: str,
                       password: str | None = None, timeout: float = 10.0) -> tuple[subprocess.Popen, int]:
    """(process, port) of a redis-server that answers PING. ``extra`` are more server options."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError("no redis-server binary on PATH")
    port = port or free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)]
    if "--appendonly" not in extra:
        args += ["--appendonly", "no"]
    if password is not None:
        args += ["--requirepass", password]
    proc = subprocess.Popen(args + list(extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=password)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return proc, port
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RedisServerError(f"redis-server did not start on port {port}") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
