"""SQLite connection (SRS §8 schema, brought up to date by store/migrations.py on open).

One `Database` per data dir. Connections are per thread (sqlite3 objects must not cross threads); WAL mode lets
the ingest worker write while the UI reads.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

from .migrations import migrate


class Database:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.write_lock = threading.RLock()  # serialize writers; readers go freely under WAL
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            self.migrated = migrate(conn)  # the names of the schema steps applied by this open

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    @contextmanager
    def connect(self):
        """A connection outside a transaction (autocommit) for reads and single statements."""
        yield self._conn()

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE … COMMIT under the write lock; rolls back on error."""
        with self.write_lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
