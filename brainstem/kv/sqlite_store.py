"""The embedded store: one SQLite file, WAL, every write durable when it returns.

Two processes may use one file at once (SQLite's own locking, a busy timeout,
and ``BEGIN IMMEDIATE`` for read-modify-write). Logs are rows keyed by
(log, sequence), so an append costs one B-tree insert whatever the log's size.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import MalformedValue, StoreUnavailable
from .base import KeyInfo, ListResult, Store, encode

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, metadata TEXT, expires_at REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS logs (
    key TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL, PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS log_keys (key TEXT PRIMARY KEY, length INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID;
"""


class SQLiteStore(Store):
    def __init__(self, path: str | Path, prefix: str = "", busy_timeout_ms: int = 10_000):
        self.path = Path(path).expanduser()
        self.prefix = prefix
        self.display_url = f"sqlite://{self.path}" + (f"?prefix={prefix}" if prefix else "")
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                       timeout=busy_timeout_ms / 1000)
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {_reason(exc)}") from None

    # --- helpers ---
    def _k(self, key: str) -> str:
        return self.prefix + key

    def _run(self, fn):
        with self._lock:
            try:
                return fn(self._db)
            except sqlite3.DatabaseError as exc:
                raise StoreUnavailable(f"SQLite store {self.path}: {_reason(exc)}") from None

    def _tx(self, fn):
        """Run ``fn(db)`` inside BEGIN IMMEDIATE ... COMMIT (rolled back on error)."""
        def body(db):
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out
        return self._run(body)

    # --- values ---
    def get_text(self, key: str) -> str | None:
        return self.get_with_metadata(key)[0]

    def get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        row = self._run(lambda db: db.execute(
            "SELECT value, metadata, expires_at FROM kv WHERE key = ?", (self._k(key),)).fetchone())
        if row is None or (row[2] is not None and row[2] <= time.time()):
            return None, None
        return row[0], (json.loads(row[1]) if row[1] else None)

    def put(self, key: str, value: Any, metadata: dict | None = None, ttl: float | None = None) -> None:
        text = encode(value)
        meta = json.dumps(metadata) if metadata is not None else None
        expires = time.time() + ttl if ttl else None
        self._run(lambda db: db.execute(
            "INSERT INTO kv (key, value, metadata, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, metadata = excluded.metadata, "
            "expires_at = excluded.expires_at", (self._k(key), text, meta, expires)))

    def delete(self, key: str) -> bool:
        cur = self._run(lambda db: db.execute("DELETE FROM kv WHERE key = ?", (self._k(key),)))
        return cur.rowcount > 0

    def incr(self, key: str, amount: int = 1) -> int:
        def body(db):
            row = db.execute("SELECT value, expires_at FROM kv WHERE key = ?", (self._k(key),)).fetchone()
            current = 0
            if row is not None and not (row[1] is not None and row[1] <= time.time()):
                try:
                    current = int(row[0])
                except ValueError:
                    raise MalformedValue(f"value of {key!r} is not an integer: {row[0][:40]!r}") from None
            new = current + amount
            db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                       "value = excluded.value, expires_at = NULL", (self._k(key), str(new)))
            return new
        return self._tx(body)

    def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> ListResult:
        full = self._k(prefix)
        after = self._k(cursor) if cursor is not None else None
        upper = _prefix_upper_bound(full)
        now = time.time()

        def body(db):
            # Values and logs share one namespace; merge the two ordered scans.
            q = ("SELECT key, metadata, expires_at, 0 FROM kv WHERE key >= ? AND (? IS NULL OR key < ?) "
                 "AND (? IS NULL OR key > ?) AND (expires_at IS NULL OR expires_at > ?) "
                 "UNION ALL SELECT key, NULL, NULL, 1 FROM log_keys WHERE key >= ? AND (? IS NULL OR key < ?) "
                 "AND (? IS NULL OR key > ?) ORDER BY 1 LIMIT ?")
            return db.execute(q, (full, upper, upper, after, after, now,
                                  full, upper, upper, after, after, limit + 1)).fetchall()
        rows = self._run(body)
        more = len(rows) > limit
        rows = rows[:limit]
        n = len(self.prefix)
        keys = [KeyInfo(name=r[0][n:], metadata=json.loads(r[1]) if r[1] else None,
                        expiration=r[2], is_log=bool(r[3])) for r in rows]
        return ListResult(keys=keys, cursor=keys[-1].name if more and keys else None)

    # --- logs ---
    def append(self, log_key: str, entry: Any) -> int:
        text = encode(entry)
        k = self._k(log_key)

        def body(db):
            (length,) = db.execute(
                "INSERT INTO log_keys (key, length) VALUES (?, 1) ON CONFLICT(key) DO UPDATE "
                "SET length = length + 1 RETURNING length", (k,)).fetchone()
            db.execute("INSERT INTO logs (key, seq, entry) VALUES (?, ?, ?)", (k, length - 1, text))
            return length
        return self._tx(body)

    def read_log(self, log_key: str, start: int = 0, stop: int | None = None) -> list[str]:
        """Entries ``start`` .. ``stop`` (exclusive, Python slice semantics incl. negatives)."""
        k = self._k(log_key)
        if start < 0 or (stop is not None and stop < 0):
            n = self.log_length(log_key)
            start, stop, _ = slice(start, stop).indices(n)
        hi = stop if stop is not None else 2**62
        rows = self._run(lambda db: db.execute(
            "SELECT entry FROM logs WHERE key = ? AND seq >= ? AND seq < ? ORDER BY seq", (k, start, hi)).fetchall())
        return [r[0] for r in rows]

    def log_length(self, log_key: str) -> int:
        row = self._run(lambda db: db.execute("SELECT length FROM log_keys WHERE key = ?",
                                              (self._k(log_key),)).fetchone())
        return row[0] if row else 0

    def delete_log(self, log_key: str) -> bool:
        k = self._k(log_key)

        def body(db):
            db.execute("DELETE FROM logs WHERE key = ?", (k,))
            return db.execute("DELETE FROM log_keys WHERE key = ?", (k,)).rowcount > 0
        return self._tx(body)

    def trim_log(self, log_key: str, keep: int) -> None:
        # Sequence numbers keep counting from the log's length, so trimming never reuses one.
        k = self._k(log_key)
        self._run(lambda db: db.execute(
            "DELETE FROM logs WHERE key = ? AND seq < (SELECT length FROM log_keys WHERE key = ?) - ?",
            (k, k, max(0, keep))))

    # --- locks ---
    def acquire_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        def body(db):
            now = time.time()
            row = db.execute("SELECT owner, expires_at FROM locks WHERE name = ?", (self._k(name),)).fetchone()
            if row is not None and row[1] > now:
                return False
            db.execute("INSERT INTO locks (name, owner, expires_at) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE "
                       "SET owner = excluded.owner, expires_at = excluded.expires_at",
                       (self._k(name), owner, now + ttl_ms / 1000))
            return True
        return self._tx(body)

    def release_lock(self, name: str, owner: str) -> bool:
        cur = self._run(lambda db: db.execute("DELETE FROM locks WHERE name = ? AND owner = ?",
                                              (self._k(name), owner)))
        return cur.rowcount > 0

    def refresh_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        cur = self._run(lambda db: db.execute(
            "UPDATE locks SET expires_at = ? WHERE name = ? AND owner = ? AND expires_at > ?",
            (time.time() + ttl_ms / 1000, self._k(name), owner, time.time())))
        return cur.rowcount > 0

    def lock_owner(self, name: str) -> str | None:
        row = self._run(lambda db: db.execute("SELECT owner, expires_at FROM locks WHERE name = ?",
                                              (self._k(name),)).fetchone())
        return row[0] if row and row[1] > time.time() else None

    # --- housekeeping ---
    def usage(self) -> dict:
        def body(db):
            p = self.prefix
            hi = _prefix_upper_bound(p)
            keys, vbytes = db.execute(
                "SELECT count(*), coalesce(sum(length(key) + length(value) + coalesce(length(metadata), 0)), 0) "
                "FROM kv WHERE key >= ? AND (? IS NULL OR key < ?)", (p, hi, hi)).fetchone()
            logs, entries = db.execute(
                "SELECT count(*), coalesce(sum(length), 0) FROM log_keys WHERE key >= ? AND (? IS NULL OR key < ?)",
                (p, hi, hi)).fetchone()
            lbytes = db.execute("SELECT coalesce(sum(length(entry)), 0) FROM logs WHERE key >= ? AND (? IS NULL OR key < ?)",
                                (p, hi, hi)).fetchone()[0]
            page = db.execute("PRAGMA page_size").fetchone()[0] * db.execute("PRAGMA page_count").fetchone()[0]
            return {"backend": "sqlite", "keys": keys + logs, "logs": logs, "log_entries": entries,
                    "bytes": vbytes + lbytes, "file_bytes": page}
        return self._run(body)

    def purge_expired(self) -> int:
        return self._run(lambda db: db.execute("DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= ?",
                                               (time.time(),)).rowcount)

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass


def _prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: no bound)."""
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _reason(exc: BaseException) -> str:
    msg = str(exc) or type(exc).__name__
    if "not a database" in msg or "malformed" in msg:
        return f"{msg} (the file is corrupt or not a Brainstem store; move it aside or point BRAINSTEM_KV elsewhere)"
    return msg
