"""The embedded backend: one SQLite file (:mod:`.store`), its tables (:mod:`.schema`), the file on disk
(:mod:`.file`) and SQLite's failures told apart (:mod:`.errors`)."""

from brainstem.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
