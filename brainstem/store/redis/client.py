"""Reaching a Redis server or a Redis Cluster: its URL read (and redacted for printing), its client made.

``redis://`` / ``rediss://`` / ``unix://`` is one server; ``redis+cluster://host:port,host:port/``
(``rediss+cluster://`` with TLS) is a cluster, reached through any of the nodes named.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from brainstem.core.errors import ConfigError, StoreUnavailable

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def is_cluster(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_SCHEMES


def redact_url(url: str) -> str:
    """The URL with its password (and user) replaced, safe to print."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:  # host:port,host:port is no netloc urlsplit can read
        netloc, slash, tail = rest.partition("/")
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        return f"{scheme}{sep}{netloc}{slash}{tail}"
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def parse_cluster_url(url: str) -> dict:
    """``redis+cluster://[user:password@]host:port[,host:port...][/0][?prefix=NAME]`` -> the client's
    arguments; a malformed URL is a one-line ConfigError showing the form."""
    form = "redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...][/0] (rediss+cluster:// for TLS)"
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0]
    userinfo, _, hosts = netloc.rpartition("@")
    shown = redact_url(url)
    if path not in ("", "0"):
        raise ConfigError(f"BRAINSTEM_KV {shown}: a Redis Cluster has only database 0 (got /{path}); use {form}")
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"BRAINSTEM_KV {shown}: {item.strip() or 'an empty node'!r} is not HOST:PORT; use {form}")
        nodes.append((host, int(port)))
    user, _, password = userinfo.partition(":")
    return {"nodes": nodes, "username": unquote(user) or None, "password": unquote(password) or None,
            "ssl": scheme == "rediss+cluster"}


def new_client(url: str, socket_timeout: float):
    """A client of the server or cluster ``url`` names (answers decoded as text); a bad URL or a cluster
    none of whose nodes answers is a one-line :class:`StoreUnavailable`."""
    try:
        if is_cluster(url):
            args = parse_cluster_url(url.partition("?")[0])
            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in args["nodes"]],
                                username=args["username"], password=args["password"], ssl=args["ssl"],
                                decode_responses=True, socket_timeout=socket_timeout,
                                socket_connect_timeout=socket_timeout)
        clean = urlunsplit(urlsplit(url)._replace(query=""))
        return redis.Redis.from_url(clean, decode_responses=True, socket_timeout=socket_timeout,
                                    socket_connect_timeout=socket_timeout)
    except ValueError as exc:
        raise StoreUnavailable(f"bad Redis URL {redact_url(url)}: {exc}") from None
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise StoreUnavailable(f"cannot reach the Redis Cluster at {redact_url(url)}: {reason(exc)}") from None


def reason(exc: BaseException) -> str:
    """The first line of a client's error, for a one-line message."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
