"""The metadata database: SQLite in the data dir (default) or PostgreSQL (`--database-url postgresql://…`).

One `Database` per app process. Stores write one portable SQL (SQLite style, `?` placeholders) and use only
`connect()` / `transaction()`; the dialect layer (store/sql_dialect.py, store/pg.py) runs it on PostgreSQL. The
schema comes from the ordered migrations in store/migrations.py, recorded in `schema_version` on both dialects.

SQLite: connections are per thread (sqlite3 objects must not cross threads); WAL mode lets the ingest worker
write while the UI reads; writers are serialized by BEGIN IMMEDIATE under a process lock. One process only.
PostgreSQL: a psycopg 3 connection pool; many app processes share it.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path

SQLITE = "sqlite"
POSTGRESQL = "postgresql"


def is_postgres_url(target) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def row_with_json(row, *fields: str, default: str = "[]") -> dict:
    """A row as a dict with the named JSON columns decoded."""
    d = dict(row)
    for f in fields:
        d[f] = json.loads(d.get(f) or default)
    return d


class _SQLiteBackend:
    dialect = SQLITE

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.write_lock = threading.RLock()  # serialize writers; readers go freely under WAL
        self._conn().execute("PRAGMA journal_mode=WAL")

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
        yield self._conn()

    @contextmanager
    def transaction(self):
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


class Database:
    """`Database(path)` → SQLite file; `Database("postgresql://…")` → PostgreSQL. Same API either way.

    `connect()` yields a connection in autocommit mode (reads, single statements); `transaction()` yields one
    inside a transaction that commits on success and rolls back on error. Both are re-entrant per thread.
    """

    def __init__(self, target: Path | str, *, pool_size: int = 20, migrate: bool = True):
        if is_postgres_url(target):
            from store.pg import PostgresBackend

            self._backend = PostgresBackend(str(target), pool_size=pool_size)
            self.path = None
            self.url = str(target)
        else:
            self._backend = _SQLiteBackend(Path(target))
            self.path = self._backend.path
            self.url = None
        self.dialect: str = self._backend.dialect
        self.write_lock = getattr(self._backend, "write_lock", None) or threading.RLock()
        if migrate:
            from store.migrations import migrate as run_migrations

            self.applied_migrations = run_migrations(self)

    # --- dialect facts the portable SQL needs ---------------------------------------------------
    @property
    def single_process(self) -> bool:
        """SQLite: exactly one app process owns the data dir (leases of a previous run are dead)."""
        return self.dialect == SQLITE

    @property
    def now_sql(self) -> str:
        """Seconds since the epoch by the database's clock (one clock for every app process)."""
        if self.dialect == POSTGRESQL:
            return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    @property
    def skip_locked(self) -> str:
        """Row locks for a claim query: PostgreSQL skips rows another process holds; SQLite's BEGIN IMMEDIATE
        already makes the claim exclusive."""
        return "FOR UPDATE SKIP LOCKED" if self.dialect == POSTGRESQL else ""

    # --- connections ---------------------------------------------------------------------------
    def connect(self):
        return self._backend.connect()

    def transaction(self):
        return self._backend.transaction()

    def ensure(self, schema: str) -> None:
        """Run a store's own `CREATE … IF NOT EXISTS` script on either dialect (statements split on `;`).

        Prefer a migration (store/migrations.py): it is versioned and runs once. This stays for store code that
        owns an idempotent schema script."""
        from store.migrations import pg_ddl

        statements = [st.strip() for st in schema.split(";") if st.strip()]
        with self.transaction() as conn:
            for st in statements:
                conn.execute(pg_ddl(st) if self.dialect == POSTGRESQL else st)

    def close(self) -> None:
        self._backend.close()
