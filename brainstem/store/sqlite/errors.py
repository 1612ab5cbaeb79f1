"""SQLite's failures, told apart: a file locked by another process (waited out), a full disk, a
read-only file, a corrupt one; and a connection made usable again after a failed statement.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from brainstem.core.errors import StoreFull, StoreReadOnly, StoreUnavailable


def store_error(exc: sqlite3.DatabaseError, path: Path, retry_seconds: float) -> StoreUnavailable:
    """The one-line store error for a statement's failure on the file ``path``."""
    if is_full(exc) or (is_io_error(exc) and no_room(path)):
        return StoreFull(f"the store's disk is full: SQLite store {path}: {reason(exc)} (free space "
                         "on its filesystem, or move the store with BRAINSTEM_KV)")
    if is_read_only(exc):
        return StoreReadOnly(f"SQLite store {path} is read-only and refused a write ({reason(exc)}): "
                             "this user needs write permission on the file and its directory")
    if is_busy(exc):
        return StoreUnavailable(f"SQLite store {path} stayed locked by another process for more than "
                                f"{retry_seconds:g}s beyond its busy timeout: {reason(exc)}")
    return StoreUnavailable(f"SQLite store {path}: {reason(exc)}")


def abandon(db: sqlite3.Connection) -> None:
    """Roll back whatever a failed statement left open, so the connection is usable (and retryable)."""
    try:
        if db.in_transaction:
            db.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def is_full(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == sqlite3.SQLITE_FULL) or "disk is full" in str(exc)


def is_io_error(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == sqlite3.SQLITE_IOERR) or "disk I/O error" in str(exc)


def no_room(path: Path) -> bool:
    """Whether the store's filesystem is out of space: SQLite says only "disk I/O error" when the journal
    it opens (``-wal``, ``-shm``) cannot grow, which on a full disk is the full disk."""
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def is_read_only(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (code is not None and code & 0xFF == sqlite3.SQLITE_READONLY) or "readonly database" in str(exc)


def reason(exc: BaseException) -> str:
    msg = str(exc) or type(exc).__name__
    if "not a database" in msg or "malformed" in msg:
        return f"{msg} (the file is corrupt or not a Brainstem store; move it aside or point BRAINSTEM_KV elsewhere)"
    return msg
