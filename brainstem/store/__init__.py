"""The store: a small protocol, a Redis and an SQLite backend, karma and the wake lease.

``open_store(url)`` picks the backend from the URL and imports only that one,
so the sleep path never pays for a backend it does not use. Several agents may
share one store, each confined to its own keys (:mod:`brainstem.core.names`).
"""

from __future__ import annotations

from pathlib import Path

from brainstem.core import environment
from brainstem.core.environment import default_store_path, default_store_url
from brainstem.core.errors import ConfigError
from brainstem.core.names import agent_prefix, selected
from brainstem.store.base import KeyInfo, ListResult, Store

__all__ = ["KeyInfo", "ListResult", "Store", "open_store", "default_store_url", "sqlite_url"]


def sqlite_url(path: str | Path) -> str:
    """The URL of an SQLite file, as SQLAlchemy writes it: ``sqlite:///relative.db`` (three slashes,
    from the working directory) or ``sqlite:////absolute/path.db`` (four)."""
    return "sqlite:///" + str(path)


def sqlite_path(url: str) -> Path:
    """The file an ``sqlite:///`` URL names (see :func:`sqlite_url`; ``~`` is the home directory).

    A missing directory is a :class:`ConfigError` naming it: a typo in the path must not quietly
    become a new, empty agent. Only the default location is created when missing."""
    if not url.startswith("sqlite:///"):
        raise ConfigError(f"BRAINSTEM_KV {url!r}: write sqlite:///relative/path.db (from the working directory) "
                          f"or sqlite:////absolute/path.db (four slashes)")
    raw = url[len("sqlite:///"):].split("?", 1)[0]
    if not raw.strip("/"):
        raise ConfigError(f"BRAINSTEM_KV {url!r} names no file: use sqlite:////path/to/brainstem.db")
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if path.parent.is_dir() or path == default_store_path():
        return path
    hint = ""
    if not raw.startswith(("/", "~")) and Path("/" + raw).parent.is_dir():
        hint = f" (for the absolute path /{raw}, write four slashes: sqlite:////{raw})"
    raise ConfigError(f"BRAINSTEM_KV {url!r}: the directory {path.parent} does not exist{hint}; create it "
                      f"or fix the URL (three slashes: relative to the working directory, four: absolute)")


def open_store(url: str | None = None, prefix: str | None = None, check: bool = True,
               retry_seconds: float | None = None, register: bool = True) -> Store:
    """Open the store named by ``url`` (default: :func:`default_store_url`).

    ``prefix`` selects the agent (default: ``BRAINSTEM_KV_PREFIX``, else the
    URL's ``?prefix=``, see :func:`~brainstem.core.names.selected`): ``NAME:`` or ``NAME``, or empty
    for the default agent.
    An invalid name is a one-line :class:`ConfigError`.
    ``check`` pings Redis so an unreachable server fails here, with one line (at once: the ping is
    not retried). ``retry_seconds`` is how long a later command retries a lost connection or a
    locked file before failing (default 5 s; 0: fail at once).
    ``register=False`` (every command but ``seed``, and the daemon): a named agent must be registered
    already; any operation through the view is :class:`~brainstem.core.errors.UnknownAgent` otherwise, so
    a mistyped name never becomes an agent. With ``register`` the name is registered on first use.
    """
    url = url or default_store_url()
    prefix = selected(url, environment.agent_name()) if prefix is None else agent_prefix(prefix)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")):
        from brainstem.store.redis import RedisStore  # noqa: PLC0415 -- only the backend the URL names

        store = RedisStore(url, prefix=prefix, retry_seconds=retry_seconds)
        store.registers = register
        if check:
            store.ping()
        return store
    if url.startswith("sqlite:"):
        from brainstem.store.sqlite import SQLiteStore  # noqa: PLC0415 -- only the backend the URL names

        sqlite_view = SQLiteStore(sqlite_path(url), prefix=prefix, retry_seconds=retry_seconds)
        sqlite_view.registers = register
        return sqlite_view
    raise ConfigError(f"BRAINSTEM_KV {url!r} is not a store URL: use redis://host:port/db, "
                      f"redis+cluster://host:port,host:port/, sqlite:///relative.db or sqlite:////absolute/path.db")
