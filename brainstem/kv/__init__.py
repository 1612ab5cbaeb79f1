"""The store: a small protocol, a Redis and an SQLite backend, and the agent's guarded view.

``open_store(url)`` picks the backend from the URL and imports only that one,
so the sleep path never pays for a backend it does not use.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError
from .base import KeyInfo, ListResult, Store

__all__ = ["KeyInfo", "ListResult", "Store", "open_store", "default_store_url"]


def default_store_url() -> str:
    """``BRAINSTEM_KV`` or the embedded store in the user's data directory."""
    url = os.environ.get("BRAINSTEM_KV", "").strip()
    if url:
        return url
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite://{Path(base).resolve() / 'brainstem' / 'brainstem.db'}"


def open_store(url: str | None = None, prefix: str | None = None, check: bool = True) -> Store:
    """Open the store named by ``url`` (default: :func:`default_store_url`).

    ``check`` pings Redis so an unreachable server fails here, with one line.
    """
    url = url or default_store_url()
    if prefix is None:
        prefix = os.environ.get("BRAINSTEM_KV_PREFIX")
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis_store import RedisStore

        store = RedisStore(url, prefix=prefix)
        if check:
            store.ping()
        return store
    if url.startswith("sqlite://"):
        from urllib.parse import parse_qs, urlsplit

        from .sqlite_store import SQLiteStore

        parts = urlsplit(url)
        path = url[len("sqlite://"):].split("?", 1)[0]
        # sqlite:///abs and sqlite:////abs -> /abs ; sqlite://rel -> rel ; sqlite:///~/x -> ~/x
        if path.startswith("/"):
            path = "/" + path.lstrip("/")
        if path.startswith("/~"):
            path = path[1:]
        if not path or path == "/":
            raise ConfigError(f"BRAINSTEM_KV {url!r} names no file: use sqlite:///path/to/brainstem.db")
        if prefix is None:
            prefix = parse_qs(parts.query).get("prefix", [""])[0]
        return SQLiteStore(path, prefix=prefix)
    raise ConfigError(f"BRAINSTEM_KV {url!r} is not a store URL: use redis://host:port/db or sqlite:///path")
