"""The SQLite store's file on disk: created owner-only, and opened read-only when this process cannot write it.

The file holds every agent's secrets, so the file, its WAL and shared-memory files and any
directory created for it are owner-only (0600 / 0700): a process running as another user (an
escaped sandbox worker) cannot read it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote


def not_writable(path: Path) -> bool:
    """True when an existing store cannot be written by this process: the file is not writable, or
    its directory is not and the write-ahead log SQLite would need there is missing."""
    if not path.exists():
        return False
    if not os.access(path, os.W_OK):
        return True
    wal = path.with_name(path.name + "-wal")
    return not os.access(path.parent, os.W_OK) and not (wal.exists() and os.access(wal, os.W_OK))


def open_read_only(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A read-only connection: nothing created, no journal mode changed. When SQLite cannot even set
    up its shared-memory file for reading (a WAL store in a directory this user cannot write), the
    file is read as immutable: nobody can be writing it through a directory that refuses new files."""
    base = "file:" + quote(str(path.resolve()))
    last: sqlite3.Error | None = None
    for query in ("?mode=ro", "?mode=ro&immutable=1"):
        db = sqlite3.connect(base + query, uri=True, isolation_level=None, check_same_thread=False,
                             timeout=busy_timeout_ms / 1000)
        try:
            db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            db.execute("SELECT 1 FROM kv LIMIT 1").fetchall()
            return db
        except sqlite3.Error as exc:
            last = exc
            db.close()
    assert last is not None
    raise last


def make_private(path: Path) -> None:
    """Create the store's missing directories (0700) and the file itself (0600) before SQLite does,
    so neither is ever readable by another user, whatever the umask."""
    missing = []
    parent = path.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    tighten(path)


def tighten(path: Path) -> None:
    """The file and its WAL and shared-memory files owner-only, when we own them (SQLite gives new
    -wal and -shm files the database file's mode; this also closes up files an older version left open)."""
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            info = os.stat(p)
            if info.st_uid == os.geteuid() and info.st_mode & 0o077:
                os.chmod(p, info.st_mode & 0o700)
        except FileNotFoundError:
            pass
