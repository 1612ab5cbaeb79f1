"""The store: a small protocol, a Redis and an SQLite backend, and the agent's guarded view.

``open_store(url)`` picks the backend from the URL and imports only that one,
so the sleep path never pays for a backend it does not use. Several agents may
share one store, each confined to its own keys (:mod:`brainstem.kv.names`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from .base import KeyInfo, ListResult, Store
from .names import agent_prefix

__all__ = ["KeyInfo", "ListResult", "Store", "open_store", "default_store_url"]


def default_store_url() -> str:
    """``BRAINSTEM_KV`` or the embedded store in the user's data directory."""
    url = os.environ.get("BRAINSTEM_KV", "").strip()
    if url:
        return url
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite://{Path(base).resolve() / 'brainstem' / 'brainstem.db'}"


def open_store(url: str | None = None, prefix: str | None = None, check: bool = True,
               retry_seconds: float | None = None) -> Store:
    """Open the store named by ``url`` (default: :func:`default_store_url`).

    ``prefix`` selects the agent (default: ``BRAINSTEM_KV_PREFIX``, else the
    URL's ``?prefix=``): ``NAME:`` or ``NAME``, or empty for the default agent.
    An invalid name is a one-line :class:`ConfigError`.
    ``check`` pings Redis so an unreachable server fails here, with one line (at once: the ping is
    not retried). ``retry_seconds`` is how long a later command retries a lost connection or a
    locked file before failing (default 5 s; 0: fail at once).
    """
    url = url or default_store_url()
    env_prefix = os.environ.get("BRAINSTEM_KV_PREFIX")
    if prefix is None:
        prefix = env_prefix
    if prefix is None:
        from urllib.parse import parse_qs, urlsplit

        query = parse_qs(urlsplit(url).query).get("prefix")
        prefix = agent_prefix(query[0], "BRAINSTEM_KV ?prefix=") if query else ""
    else:
        prefix = agent_prefix(prefix, "BRAINSTEM_KV_PREFIX" if prefix == env_prefix else "agent prefix")
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis_store import RedisStore

        store = RedisStore(url, prefix=prefix, retry_seconds=retry_seconds)
        if check:
            store.ping()
        return store
    if url.startswith("sqlite://"):
        from .sqlite_store import SQLiteStore

        path = url[len("sqlite://"):].split("?", 1)[0]
        # sqlite:///abs and sqlite:////abs -> /abs ; sqlite://rel -> rel ; sqlite:///~/x -> ~/x
        if path.startswith("/"):
            path = "/" + path.lstrip("/")
        if path.startswith("/~"):
            path = path[1:]
        if not path or path == "/":
            raise ConfigError(f"BRAINSTEM_KV {url!r} names no file: use sqlite:///path/to/brainstem.db")
        return SQLiteStore(path, prefix=prefix, retry_seconds=retry_seconds)
    raise ConfigError(f"BRAINSTEM_KV {url!r} is not a store URL: use redis://host:port/db or sqlite:///path")
