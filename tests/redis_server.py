"""Start a real redis-server on loopback: for the test session, for tests that need their own
(a password, an outage), and for the benchmarks. One launcher, so they all start it the same way."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers import free_port, stop


class RedisServerError(RuntimeError):
    """No redis-server binary, or it did not answer in time."""


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


def _cluster_port() -> int:
    """A free port whose cluster bus port (the port + 10000) is free and valid too."""
    import random

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RedisServerError("no free pair of ports for a cluster node")


def start_redis_cluster(workdir: str | Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                        timeout: float = 30.0) -> tuple[list[subprocess.Popen], list[int]]:
    """(processes, ports) of a real Redis Cluster on loopback: ``masters * (1 + replicas)`` nodes started
    with ``--cluster-enabled yes``, joined by ``redis-cli --cluster create``, and answering
    ``cluster_state:ok`` on every node."""
    import redis

    cli = shutil.which("redis-cli")
    if cli is None:
        raise RedisServerError("no redis-cli binary on PATH (needed to create a cluster)")
    procs, ports = [], []
    try:
        for i in range(masters * (1 + replicas)):
            node_dir = Path(workdir) / f"node{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            proc, port = start_redis_server(node_dir, _cluster_port(), "--cluster-enabled", "yes",
                                            "--cluster-config-file", "nodes.conf",
                                            "--cluster-node-timeout", str(node_timeout_ms),
                                            "--repl-diskless-sync-delay", "0")
            procs.append(proc)
            ports.append(port)
        create = subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                                capture_output=True, text=True, timeout=timeout)
        if create.returncode != 0:
            raise RedisServerError(f"redis-cli --cluster create failed: {create.stdout[-500:]} {create.stderr[-500:]}")
        deadline = time.monotonic() + timeout
        for port in ports:
            client = redis.Redis(port=port, decode_responses=True)
            while "cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RedisServerError(f"the cluster did not reach cluster_state:ok on port {port}")
                time.sleep(0.1)
            # A replica that never synced cannot be promoted: wait for its link to its primary.
            while client.info("replication").get("role") == "slave" and \
                    client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RedisServerError(f"the replica on port {port} did not sync with its primary")
                time.sleep(0.1)
            client.close()
        return procs, ports
    except BaseException:
        for p in procs:
            stop(p)
        raise
