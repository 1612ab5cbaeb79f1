"""The SQLite store's tables, and the changes that bring a file from an older version up to them.

Logs are rows keyed by (log, sequence), so an append costs one B-tree insert whatever the log's size;
``log_keys`` holds each log's length, the number of its oldest kept entry (``base``) and its size in
bytes. ``due`` is the due index (:mod:`brainstem.store.due`): an agent's name ('' the default), a key of
its own, and a time; found by time across agents. ``due_wake`` is the wake index, the same way.
Every change here is additive and idempotent: two processes opening one file at once may both
run it.
"""

from __future__ import annotations

import sqlite3

DUE_TABLES = {"": "due", "wake": "due_wake"}  # each due index's table (brainstem.store.due.INDEXES)

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, metadata TEXT, expires_at REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS logs (
    key TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL, PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_keys (key TEXT PRIMARY KEY, length INTEGER NOT NULL, base INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS agents (name TEXT PRIMARY KEY, registered_at REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS due (agent TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (agent, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS due_by_agent ON due (agent, at);
CREATE INDEX IF NOT EXISTS due_by_time ON due (at);
CREATE TABLE IF NOT EXISTS due_wake (agent TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (agent, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS due_wake_by_agent ON due_wake (agent, at);
CREATE INDEX IF NOT EXISTS due_wake_by_time ON due_wake (at);
CREATE TABLE IF NOT EXISTS spend_holds (key TEXT NOT NULL, token TEXT NOT NULL, usd REAL NOT NULL,
    expires_at REAL NOT NULL, PRIMARY KEY (key, token)) WITHOUT ROWID;
"""


def set_up(db: sqlite3.Connection) -> None:
    """A writable file's tables, made or brought up to date; WAL, and every commit synced."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    if not has_column(db, "base"):  # a file from before trimmed logs kept their own numbering
        add_column(db, "base")
    if not has_column(db, "bytes"):  # a file from before logs counted their size: counted once, here
        if add_column(db, "bytes"):
            db.execute("UPDATE log_keys SET bytes = (SELECT coalesce(sum(length(entry)), 0) FROM logs "
                       "WHERE logs.key = log_keys.key)")


def add_column(db: sqlite3.Connection, column: str) -> bool:
    """False when another process opening the same file added it first."""
    try:
        db.execute(f"ALTER TABLE log_keys ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        return True
    except sqlite3.OperationalError as exc:
        if "duplicate column" in str(exc):
            return False
        raise


def has_column(db: sqlite3.Connection, column: str) -> bool:
    return any(row[1] == column for row in db.execute("PRAGMA table_info(log_keys)"))
