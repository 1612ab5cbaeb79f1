"""The embedded store: one SQLite file, WAL, every write durable when it returns.

Two processes may use one file at once (SQLite's own locking, a busy timeout,
and ``BEGIN IMMEDIATE`` for read-modify-write); a file another process keeps
locked beyond the busy timeout is waited out for a while. The tables are in
:mod:`brainstem.store.sqlite.schema`; the file is owner-only
(:mod:`brainstem.store.sqlite.file`). Agents sharing the file are confined as
described in :mod:`brainstem.core.names`; the registry of their names is the
``agents`` table. Today's spend held by calls in flight is the ``spend_holds``
table, keyed like the spend itself; the due index is the ``due`` table, the wake index ``due_wake``.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
import time
from pathlib import Path

from brainstem.core.backoff import call_with_backoff
from brainstem.core.errors import ConfigError, MalformedValue, StoreFull, StoreUnavailable
from brainstem.core.keys import DAILY_COST
from brainstem.core.names import adopt_hint
from brainstem.store.base import (
    Fence,
    KeyInfo,
    ListResult,
    Store,
    decode_log_entry,
    decode_metadata,
    decode_text,
    lease_lost,
    listed_metadata,
    shown_url,
    spend_record,
    spent_on,
)
from brainstem.store.sqlite.errors import abandon, is_busy, is_full, reason, store_error
from brainstem.store.sqlite.file import make_private, not_writable, open_read_only, tighten
from brainstem.store.sqlite.schema import DUE_TABLES, has_column, set_up

RETRY_SECONDS = 5.0  # how long a statement keeps retrying a database locked beyond the busy timeout


class SQLiteStore(Store):
    """``read_only``: the file (or, with no write-ahead log beside it, its directory) is not writable
    by this process, so it is opened read-only: every read works, every write is a one-line
    :class:`StoreReadOnly`. Nothing is created or converted in a read-only store."""

    _stuck = False  # the last statement gave up on a lock: do not wait again until one succeeds

    def __init__(self, path: str | Path, prefix: str = "", busy_timeout_ms: int = 10_000,
                 retry_seconds: float | None = None):
        self.path = Path(path).expanduser()
        self._set_prefix(prefix, "agent prefix")
        self.display_url = shown_url("sqlite:///" + str(self.path), self.prefix)
        self.retry_seconds = RETRY_SECONDS if retry_seconds is None else max(0.0, retry_seconds)
        self._lock = threading.RLock()
        self.read_only = not_writable(self.path)
        try:
            if self.read_only:
                self._db = open_read_only(self.path, busy_timeout_ms)
                self._base = "base" if has_column(self._db, "base") else "0"
                self._counted = has_column(self._db, "bytes")
                return
            make_private(self.path)
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                       timeout=busy_timeout_ms / 1000)
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
            # locked" at once, without its busy handler, when another process opening the same new
            # file holds a shared one: the setup is retried like any statement.
            self._run(set_up)
            tighten(self.path)
        except StoreUnavailable:
            raise  # already one line naming the file (full, read-only, locked)
        except (sqlite3.Error, OSError) as exc:
            if isinstance(exc, sqlite3.Error) and is_full(exc):
                raise StoreFull(f"the store's disk is full: cannot open SQLite store {self.path}: "
                                f"{reason(exc)}") from None
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {reason(exc)}") from None

    # A log's entries are numbered from 0 as appended (``length`` is the next number); ``base`` is the
    # number of the oldest one kept, raised by trim_log, so indexes count from the oldest kept entry, as
    # Redis's LTRIM leaves them. A read-only file from before ``base`` existed has none: "0" then.
    _base = "base"
    _counted = True  # log_keys.bytes holds each log's size, so usage() need not read every entry

    # --- helpers ---
    def _k(self, key: str) -> str:
        return self.prefix + key

    def _run(self, fn):
        """``fn(db)``, retried for a while when another process keeps the database locked beyond the
        busy timeout; every SQLite failure becomes one line naming the file."""
        def attempt():
            with self._lock:  # not held during the pauses between tries
                try:
                    return fn(self._db)
                except sqlite3.DatabaseError:
                    abandon(self._db)
                    raise

        # After a statement has used up its retries, the next ones fail at once until one succeeds:
        # a store that stays locked costs one wait, not one per statement.
        try:
            out = call_with_backoff(attempt, deadline_seconds=0.0 if self._stuck else self.retry_seconds,
                                    first_delay=0.05, max_delay=1.0, retry_on=_locked)
        except sqlite3.DatabaseError as exc:
            self._stuck = self._stuck or is_busy(exc)
            raise store_error(exc, self.path, self.retry_seconds) from None
        self._stuck = False
        return out

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

    # --- the registry of agent names ---
    def _registry_has(self, name: str) -> bool:
        return self._run(lambda db: db.execute("SELECT 1 FROM agents WHERE name = ?", (name,)).fetchone()) is not None

    def _registry_names(self) -> set[str]:
        return {r[0] for r in self._run(lambda db: db.execute("SELECT name FROM agents").fetchall())}

    def _registry_add(self, name: str, adopt: bool) -> None:
        lo, hi = name + ":", _prefix_upper_bound(name + ":")

        def body(db):
            # One transaction: the check and the registration cannot interleave with another registration.
            if db.execute("SELECT 1 FROM agents WHERE name = ?", (name,)).fetchone():
                return None
            own_log = db.execute("SELECT 1 FROM log_keys WHERE key >= ? AND key < ? LIMIT 1", (lo, hi)).fetchone()
            if not adopt and not own_log:
                # Keys already under NAME: are the default agent's, unless a log is among them: only
                # NAME's own runtime appends logs there (an agent from before names were registered).
                now = time.time()
                row = db.execute(
                    "SELECT key FROM kv WHERE key >= ? AND key < ? AND (expires_at IS NULL OR expires_at > ?) "
                    "UNION ALL SELECT name FROM locks WHERE name >= ? AND name < ? AND expires_at > ? "
                    "ORDER BY 1 LIMIT 1", (lo, hi, now, lo, hi, now)).fetchone()
                if row is not None:
                    return row[0]
            db.execute("INSERT INTO agents (name, registered_at) VALUES (?, ?)", (name, time.time()))
            return None
        clash = self._tx(body)
        if clash is not None:
            raise ConfigError(f"cannot register agent {name!r} in {self.path}: the default agent already "
                              f"holds keys under {name + ':'!r} (e.g. {clash!r}); delete or rename them, or choose "
                              f"another name; if they are {name}'s own from before agents were registered: "
                              f"{adopt_hint(name)}")

    def _registry_remove(self, name: str) -> int:
        lo, hi = name + ":", _prefix_upper_bound(name + ":")

        def body(db):
            # One transaction: nothing can be written under NAME: between the count and the removal.
            held = sum(db.execute(f"SELECT count(*) FROM {table} WHERE {col} >= ? AND {col} < ?",
                                  (lo, hi)).fetchone()[0]
                       for table, col in (("kv", "key"), ("log_keys", "key"), ("locks", "name"),
                                          ("spend_holds", "key")))
            if held == 0:
                db.execute("DELETE FROM agents WHERE name = ?", (name,))
                for table in DUE_TABLES.values():  # hints, not something the agent holds
                    db.execute(f"DELETE FROM {table} WHERE agent = ?", (name,))
            return held
        return self._tx(body)

    # --- values ---
    def _get_text(self, key: str) -> str | None:
        row = self._run(lambda db: db.execute(
            "SELECT CAST(value AS BLOB), expires_at FROM kv WHERE key = ?", (self._k(key),)).fetchone())
        if row is None or (row[1] is not None and row[1] <= time.time()):
            return None
        return decode_text(key, row[0])

    def _get_with_metadata(self, key: str) -> tuple[str | None, dict | None]:
        # As bytes, decoded here: text that is not UTF-8 (or a BLOB) is a NotText naming the key.
        row = self._run(lambda db: db.execute(
            "SELECT CAST(value AS BLOB), CAST(metadata AS BLOB), expires_at FROM kv WHERE key = ?",
            (self._k(key),)).fetchone())
        if row is None or (row[2] is not None and row[2] <= time.time()):
            return None, None
        return decode_text(key, row[0]), decode_metadata(key, row[1])

    def _put(self, key: str, text: str, metadata: dict | None, ttl: float | None, fence: Fence | None) -> None:
        meta = json.dumps(metadata) if metadata is not None else None
        expires = time.time() + ttl if ttl else None
        upsert = ("INSERT INTO kv (key, value, metadata, expires_at) VALUES (?, ?, ?, ?) "
                  "ON CONFLICT(key) DO UPDATE SET value = excluded.value, metadata = excluded.metadata, "
                  "expires_at = excluded.expires_at")
        if not ttl and fence is None:
            self._run(lambda db: db.execute(upsert, (self._k(key), text, meta, expires)))
            return

        def body(db):
            self._check_fence(db, fence, key)
            if ttl:  # keys with a TTL are rare; writing one is when the expired ones are swept, in the same write
                _purge(db)
            db.execute(upsert, (self._k(key), text, meta, expires))
        self._tx(body)

    def _delete(self, key: str, fence: Fence | None) -> bool:
        if fence is not None:
            def body(db):
                self._check_fence(db, fence, key)
                return db.execute("DELETE FROM kv WHERE key = ?", (self._k(key),)).rowcount > 0
            return self._tx(body)
        cur = self._run(lambda db: db.execute("DELETE FROM kv WHERE key = ?", (self._k(key),)))
        return cur.rowcount > 0

    def _check_fence(self, db, fence: Fence | None, key: str) -> None:
        """Inside the write's transaction: LeaseLost unless the lease is still its owner's."""
        if fence is None:
            return
        row = db.execute("SELECT owner, expires_at FROM locks WHERE name = ?", (self._k(fence[0]),)).fetchone()
        if row is None or row[0] != fence[1] or row[1] <= time.time():
            raise lease_lost(key)

    def _incr(self, key: str, amount: int, fence: Fence | None) -> int:
        def body(db):
            self._check_fence(db, fence, key)
            row = db.execute("SELECT CAST(value AS BLOB), expires_at FROM kv WHERE key = ?",
                             (self._k(key),)).fetchone()
            current = 0
            if row is not None and not (row[1] is not None and row[1] <= time.time()):
                try:
                    current = int(row[0])
                except ValueError:
                    raise MalformedValue(f"value of {key!r} is not an integer: {bytes(row[0][:40])!r}") from None
            new = current + amount
            db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                       "value = excluded.value, expires_at = NULL", (self._k(key), str(new)))
            return new
        return self._tx(body)

    def _list(self, prefix: str, limit: int, cursor: str | None) -> ListResult:
        full = self._k(prefix)
        after = self._k(cursor) if cursor is not None else None
        upper = _prefix_upper_bound(full)
        now = time.time()

        def body(db):
            # Values and logs share one namespace; merge the two ordered scans.
            q = ("SELECT key, CAST(metadata AS BLOB), expires_at, 0 FROM kv WHERE key >= ? AND (? IS NULL OR key < ?) "
                 "AND (? IS NULL OR key > ?) AND (expires_at IS NULL OR expires_at > ?) "
                 "UNION ALL SELECT key, NULL, NULL, 1 FROM log_keys WHERE key >= ? AND (? IS NULL OR key < ?) "
                 "AND (? IS NULL OR key > ?) ORDER BY 1 LIMIT ?")
            return db.execute(q, (full, upper, upper, after, after, now,
                                  full, upper, upper, after, after, limit + 1)).fetchall()
        rows = self._run(body)
        more = len(rows) > limit
        rows = rows[:limit]
        n = len(self.prefix)
        keys = [KeyInfo(name=r[0][n:], metadata=listed_metadata(r[0][n:], r[1]),
                        expiration=r[2], is_log=bool(r[3])) for r in rows]
        return ListResult(keys=keys, cursor=keys[-1].name if more and keys else None)

    # --- logs ---
    def _append(self, log_key: str, text: str, fence: Fence | None) -> int:
        key = self._k(log_key)

        def body(db):
            self._check_fence(db, fence, log_key)
            length, base = db.execute(
                "INSERT INTO log_keys (key, length, bytes) VALUES (?, 1, length(?)) ON CONFLICT(key) DO UPDATE "
                f"SET length = length + 1, bytes = bytes + length(?) RETURNING length, {self._base}",
                (key, text, text)).fetchone()
            db.execute("INSERT INTO logs (key, seq, entry) VALUES (?, ?, ?)", (key, length - 1, text))
            return length - base
        return self._tx(body)

    def _read_log(self, log_key: str, start: int, stop: int | None) -> builtins.list[str]:
        key = self._k(log_key)
        if start < 0 or (stop is not None and stop < 0):
            n = self._log_length(log_key)
            start, stop, _ = slice(start, stop).indices(n)
        hi = stop if stop is not None else 2**62
        base = f"(SELECT {self._base} FROM log_keys WHERE key = ?)"
        rows = self._run(lambda db: db.execute(
            f"SELECT CAST(entry AS BLOB) FROM logs WHERE key = ? AND seq >= {base} + ? AND seq < {base} + ? "
            "ORDER BY seq", (key, key, start, key, hi)).fetchall())
        return [decode_log_entry(r[0]) for r in rows]

    def _log_length(self, log_key: str) -> int:
        row = self._run(lambda db: db.execute(f"SELECT length - {self._base} FROM log_keys WHERE key = ?",
                                              (self._k(log_key),)).fetchone())
        return row[0] if row else 0

    def _delete_log(self, log_key: str, fence: Fence | None) -> bool:
        key = self._k(log_key)

        def body(db):
            self._check_fence(db, fence, log_key)
            db.execute("DELETE FROM logs WHERE key = ?", (key,))
            return db.execute("DELETE FROM log_keys WHERE key = ?", (key,)).rowcount > 0
        return self._tx(body)

    def _trim_log(self, log_key: str, keep: int, fence: Fence | None) -> None:
        # Sequence numbers keep counting from the log's length, so trimming never reuses one.
        key = self._k(log_key)

        def body(db):
            self._check_fence(db, fence, log_key)
            db.execute("UPDATE log_keys SET base = max(base, length - ?) WHERE key = ?", (max(0, keep), key))
            db.execute("UPDATE log_keys SET bytes = max(0, bytes - (SELECT coalesce(sum(length(entry)), 0) FROM logs "
                       "WHERE key = ? AND seq < log_keys.base)) WHERE key = ?", (key, key))
            db.execute("DELETE FROM logs WHERE key = ? AND seq < (SELECT base FROM log_keys WHERE key = ?)",
                       (key, key))
        self._tx(body)

    # --- leases (the table is called locks) ---
    def _acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
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

    def _release_lease(self, name: str, owner: str) -> bool:
        cur = self._run(lambda db: db.execute("DELETE FROM locks WHERE name = ? AND owner = ?",
                                              (self._k(name), owner)))
        return cur.rowcount > 0

    def _renew_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        cur = self._run(lambda db: db.execute(
            "UPDATE locks SET expires_at = ? WHERE name = ? AND owner = ? AND expires_at > ?",
            (time.time() + ttl_ms / 1000, self._k(name), owner, time.time())))
        return cur.rowcount > 0

    def _lease_owner(self, name: str) -> str | None:
        row = self._run(lambda db: db.execute("SELECT owner, expires_at FROM locks WHERE name = ?",
                                              (self._k(name),)).fetchone())
        return row[0] if row and row[1] > time.time() else None

    # --- the due index ---
    def _due_read(self, sql: str, args: tuple) -> builtins.list:
        def body(db):
            try:
                return db.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:  # a read-only file from before the index: no entries
                if "no such table" not in str(exc):
                    raise
                return []
        return self._run(body)

    def _due_at(self, key: str, index: str) -> float | None:
        rows = self._due_read(f"SELECT at FROM {DUE_TABLES[index]} WHERE agent = ? AND key = ?",
                              (self.prefix[:-1], key))
        return rows[0][0] if rows else None

    def _set_due(self, key: str, at: float | None, index: str) -> None:
        agent, table = self.prefix[:-1], DUE_TABLES[index]
        if at is None:
            self._run(lambda db: db.execute(f"DELETE FROM {table} WHERE agent = ? AND key = ?", (agent, key)))
            return
        self._run(lambda db: db.execute(f"INSERT INTO {table} (agent, key, at) VALUES (?, ?, ?) ON CONFLICT "
                                        "(agent, key) DO UPDATE SET at = excluded.at", (agent, key, float(at))))

    def _due_range(self, until: float, limit: int, index: str) -> builtins.list[tuple[str, float]]:
        return [(k, t) for k, t in self._due_read(f"SELECT key, at FROM {DUE_TABLES[index]} WHERE agent = ? AND "
                                                  "at <= ? ORDER BY at LIMIT ?", (self.prefix[:-1], until, limit))]

    def _due_agents(self, until: float, index: str) -> builtins.list[tuple[str, float]]:
        return [(a, t) for a, t in self._due_read(f"SELECT agent, min(at) FROM {DUE_TABLES[index]} WHERE at <= ? "
                                                  "GROUP BY agent ORDER BY 2", (until,))]

    # --- today's spend: one BEGIN IMMEDIATE transaction each, so every process of every host sharing
    # the file sees the others' holds ---
    def _spent(self, db, day: str) -> float:
        row = db.execute("SELECT CAST(value AS BLOB), expires_at FROM kv WHERE key = ?",
                         (self._k(DAILY_COST),)).fetchone()
        if row is None or (row[1] is not None and row[1] <= time.time()):
            return 0.0
        return spent_on(day, bytes(row[0]).decode("utf-8", errors="replace"))

    def _reserve_spend(self, day: str, amount: float, ceiling: float, token: str, ttl_s: float,
                       fence: Fence | None) -> bool:
        key = self._k(DAILY_COST)

        def body(db):
            self._check_fence(db, fence, DAILY_COST)  # a session that lost its lease spends nothing more
            now = time.time()
            db.execute("DELETE FROM spend_holds WHERE key = ? AND expires_at <= ?", (key, now))
            held = db.execute("SELECT coalesce(sum(usd), 0) FROM spend_holds WHERE key = ?", (key,)).fetchone()[0]
            if self._spent(db, day) + held + amount > ceiling + 1e-12:
                return False
            db.execute("INSERT INTO spend_holds (key, token, usd, expires_at) VALUES (?, ?, ?, ?) ON CONFLICT"
                       "(key, token) DO UPDATE SET usd = excluded.usd, expires_at = excluded.expires_at",
                       (key, token, float(amount), now + ttl_s))
            return True
        return self._tx(body)

    def _settle_spend(self, day: str, token: str | None, actual: float) -> float:
        key = self._k(DAILY_COST)

        def body(db):
            if token is not None:
                db.execute("DELETE FROM spend_holds WHERE key = ? AND token = ?", (key, token))
            total = max(0.0, self._spent(db, day) + actual)
            db.execute("INSERT INTO kv (key, value, metadata, expires_at) VALUES (?, ?, NULL, NULL) ON CONFLICT(key) "
                       "DO UPDATE SET value = excluded.value, metadata = NULL, expires_at = NULL",
                       (key, spend_record(day, total)))
            return round(total, 10)
        return self._tx(body)

    def _daily_spend(self, day: str) -> tuple[float, float]:
        key = self._k(DAILY_COST)

        def body(db):
            try:
                held = db.execute("SELECT coalesce(sum(usd), 0) FROM spend_holds WHERE key = ? AND expires_at > ?",
                                  (key, time.time())).fetchone()[0]
            except sqlite3.OperationalError as exc:  # a read-only file from before holds: none held
                if "no such table" not in str(exc):
                    raise
                held = 0.0
            return self._spent(db, day), float(held)
        return self._run(body)

    # --- housekeeping ---
    def _usage(self) -> dict:
        def body(db):
            keys, vbytes, logs, entries, lbytes = self._usage_of(db, self.prefix)
            if not self.prefix:  # the default agent: not the registered agents' keys, nor the internals
                others = [name + ":" for (name,) in db.execute("SELECT name FROM agents")] + ["__"]
                for theirs in map(lambda p: self._usage_of(db, p), others):
                    keys, vbytes, logs, entries, lbytes = (a - b for a, b in zip(
                        (keys, vbytes, logs, entries, lbytes), theirs, strict=True))
            page = db.execute("PRAGMA page_size").fetchone()[0] * db.execute("PRAGMA page_count").fetchone()[0]
            return {"backend": "sqlite", "keys": keys + logs, "logs": logs, "log_entries": entries,
                    "bytes": vbytes + lbytes, "file_bytes": page}
        return self._run(body)

    def _usage_of(self, db, p: str) -> tuple[int, int, int, int, int]:
        """(values, their bytes, logs, their entries, their bytes) under the stored prefix ``p``."""
        hi = _prefix_upper_bound(p)
        keys, vbytes = db.execute(
            "SELECT count(*), coalesce(sum(length(key) + length(value) + coalesce(length(metadata), 0)), 0) "
            "FROM kv WHERE key >= ? AND (? IS NULL OR key < ?)", (p, hi, hi)).fetchone()
        logs, entries = db.execute(
            f"SELECT count(*), coalesce(sum(length - {self._base}), 0) FROM log_keys "
            "WHERE key >= ? AND (? IS NULL OR key < ?)",
            (p, hi, hi)).fetchone()
        if self._counted:  # one row per log, not one per entry: the sleep path's ground truth stays cheap
            lbytes = db.execute("SELECT coalesce(sum(bytes), 0) FROM log_keys WHERE key >= ? AND "
                                "(? IS NULL OR key < ?)", (p, hi, hi)).fetchone()[0]
        else:
            lbytes = db.execute("SELECT coalesce(sum(length(entry)), 0) FROM logs WHERE key >= ? AND "
                                "(? IS NULL OR key < ?)", (p, hi, hi)).fetchone()[0]
        return keys, vbytes, logs, entries, lbytes

    def purge_expired(self) -> int:
        """Delete the rows of expired keys (reads already treat them as absent). Also done by every put
        with a TTL."""
        return self._run(_purge)

    def close(self) -> None:
        with self._lock:
            try:
                self._db.close()
            except sqlite3.Error:
                pass


def _purge(db: sqlite3.Connection) -> int:
    return db.execute("DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= ?", (time.time(),)).rowcount


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and is_busy(exc)


def _prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: no bound)."""
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


