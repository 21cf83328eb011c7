"""SQLite connection (SRS §8 schema, brought up to date by store/migrations.py on open).

One `Database` per data dir. Connections are per thread (sqlite3 objects must not cross threads); WAL mode lets
the ingest worker write while the UI reads.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

from .migrations import migrate


def row_with_json(row, *fields: str, default: str = "[]") -> dict:
    """A row as a dict with the named JSON columns decoded."""
    d = dict(row)
    for f in fields:
        d[f] = json.loads(d.get(f) or default)
    return d


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

    def ensure(self, schema: str) -> None:
        """Create a store's own tables (CREATE … IF NOT EXISTS): each store module owns its schema."""
        with self.connect() as conn:
            conn.executescript(schema)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
