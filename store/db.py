"""SQLite connection and schema (SRS §8): settings, documents, chunks (+ the gate's background statistics).

One `Database` per data dir. Connections are per thread (sqlite3 objects must not cross threads); WAL mode lets
the ingest worker write while the UI reads.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS sys_config (
    key        TEXT PRIMARY KEY,
    value      TEXT,
    updated_at TEXT
);
CREATE TABLE IF NOT EXISTS kb_document (
    doc_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    file_name    TEXT NOT NULL,
    file_type    TEXT NOT NULL,
    file_size    INTEGER NOT NULL,
    content_md5  TEXT NOT NULL UNIQUE,
    chunk_count  INTEGER NOT NULL DEFAULT 0,
    status       TEXT NOT NULL CHECK (status IN ('processing', 'ready', 'failed')),
    fail_reason  TEXT,
    created_at   TEXT NOT NULL,
    stored_name  TEXT,
    progress     TEXT
);
CREATE TABLE IF NOT EXISTS kb_chunk (
    chunk_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id       INTEGER NOT NULL REFERENCES kb_document(doc_id) ON DELETE CASCADE,
    chunk_index  INTEGER NOT NULL,
    text         TEXT NOT NULL,
    page         INTEGER,
    char_start   INTEGER,
    char_end     INTEGER,
    source       TEXT NOT NULL DEFAULT 'text',
    tokens       TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS kb_gate_background (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    fingerprint  TEXT NOT NULL,
    stats        TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_chunk_doc ON kb_chunk(doc_id, chunk_index);
CREATE INDEX IF NOT EXISTS idx_doc_status ON kb_document(status);
"""


class Database:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.write_lock = threading.RLock()  # serialize writers; readers go freely under WAL
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(SCHEMA)

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
