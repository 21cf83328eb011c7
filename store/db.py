"""The metadata database: SQLite in the data dir (default) or PostgreSQL (`--database-url postgresql://…`).

One `Database` per app process, one SQLAlchemy Core `Engine` inside it. Stores build their statements from the
tables in store/schema.py (SQLAlchemy renders them for the dialect: placeholders, quoting of `user`, ILIKE,
upserts through `Database.insert`, RETURNING for generated ids) and use only `connect()` / `transaction()`. The
schema comes from the ordered migrations in store/migrations.py, recorded in `schema_version` on both dialects.

SQLite: a pooled connection per block (sqlite3 objects are opened with check_same_thread off and never shared by
two threads at once); WAL lets the ingest worker write while the UI reads; writers are serialized by BEGIN
IMMEDIATE under a process lock. One process only.
PostgreSQL: the engine's pool (`pool_size` connections, psycopg 3); many app processes share the database.
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path

from sqlalchemy import Double, cast, create_engine, event, extract, func, literal
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from .migrations import migrate as run_migrations

SQLITE = "sqlite"
POSTGRESQL = "postgresql"

def is_postgres_url(target) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def engine_url(url: str) -> str:
    """`postgresql://…` / `postgres://…` → `postgresql+psycopg://…`: SQLAlchemy's plain scheme means psycopg2,
    the app ships psycopg 3."""
    return "postgresql+psycopg://" + url.split("://", 1)[1]


def as_dict(row) -> dict | None:
    """One result row as a plain dict (None stays None)."""
    return None if row is None else dict(zip(row._fields, row))


def dicts(result) -> list[dict]:
    """Every row of a result as a plain dict; the column names are read once (a row's own mapping view costs
    about 3× more per row, which shows on the 50 chunk rows behind every answer)."""
    keys = tuple(result.keys())
    return [dict(zip(keys, row)) for row in result.all()]


def now_text() -> str:
    """The local time as the stores write it into their created_at / updated_at columns (to the second)."""
    return datetime.now().isoformat(sep=" ", timespec="seconds")


def with_json(d: dict, *fields: str, default: str = "[]") -> dict:
    """The dict with the named JSON columns decoded."""
    for f in fields:
        d[f] = json.loads(d.get(f) or default)
    return d


class DatabaseClock:
    """Seconds since the epoch by the database's clock, as a SQL expression: one clock for every app process
    (leases and job claims compare against it). `advance` adds an offset for this `Database` only, so a test
    lets a lease run out without sleeping; it is 0 unless a test moves it."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.offset = 0.0

    def advance(self, seconds: float) -> None:
        self.offset += float(seconds)

    def now(self):
        if self.dialect == POSTGRESQL:
            # clock_timestamp(), not now(): now() stands still for the whole transaction
            base = cast(extract("epoch", func.clock_timestamp()), Double)
        else:
            base = (func.julianday("now") - 2440587.5) * 86400.0
        return base + literal(self.offset, Double) if self.offset else base


class Database:
    """`Database(path)` → SQLite file; `Database("postgresql://…")` → PostgreSQL. Same API either way.

    `connect()` yields a connection in autocommit mode (reads, single statements); `transaction()` yields one
    inside a transaction that commits on success and rolls back on error. A thread's nested blocks reuse its
    open connection (a read inside a transaction sees its writes; a transaction inside a transaction is a
    savepoint); a transaction opened inside a `connect()` block takes a connection of its own.
    """

    def __init__(self, target: Path | str, *, pool_size: int = 20, migrate: bool = True):
        if is_postgres_url(target):
            self.dialect, self.path, self.url = POSTGRESQL, None, str(target)
            self.engine = _postgres_engine(self.url, pool_size)
            # reads run in autocommit (no transaction left open between statements); the same pool underneath
            self._read_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        else:
            self.dialect, self.path, self.url = SQLITE, Path(target), None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():  # the metadata (and sealed secrets) readable by the owner only
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            self.engine = self._read_engine = _sqlite_engine(self.path, pool_size)
        self.clock = DatabaseClock(self.dialect)
        self.write_lock = threading.RLock()  # SQLite: serialize writers; readers go freely under WAL
        self._local = threading.local()
        if migrate:
            self.applied_migrations = run_migrations(self)

    @property
    def single_process(self) -> bool:
        """SQLite: exactly one app process owns the data dir (leases of a previous run are dead)."""
        return self.dialect == SQLITE

    def insert(self, table):
        """INSERT for this dialect, with `.on_conflict_do_nothing()` / `.on_conflict_do_update()` (SQLite and
        PostgreSQL spell the upsert alike, but SQLAlchemy has one construct per dialect)."""
        return (postgresql if self.dialect == POSTGRESQL else sqlite).insert(table)

    # --- connections ---------------------------------------------------------------------------
    @contextmanager
    def connect(self):
        held = getattr(self._local, "write", None) or getattr(self._local, "read", None)
        if held is not None:
            yield held
            return
        with self._read_engine.connect() as conn:
            self._local.read = conn
            try:
                yield conn
            finally:
                if getattr(self._local, "read", None) is conn:  # a generator may be closed by another thread
                    self._local.read = None

    @contextmanager
    def transaction(self, *, sqlite_foreign_keys: bool = True):
        """`sqlite_foreign_keys=False`: the whole transaction runs with SQLite's foreign keys off (a migration
        that rebuilds a table; the pragma has no effect inside a transaction, so it is set before BEGIN)."""
        held = getattr(self._local, "write", None)
        if held is not None:
            with held.begin_nested():
                yield held
            return
        sqlite_db = self.dialect == SQLITE
        with self.write_lock if sqlite_db else nullcontext(), self.engine.connect() as conn:
            conn.begin()  # SQLAlchemy's transaction; on SQLite nothing is sent yet (sqlite3 never BEGINs itself)
            if sqlite_db:
                if not sqlite_foreign_keys:
                    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                # the write lock at BEGIN: no deadlock between two deferred readers turning writers
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            self._local.write = conn
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            else:
                conn.commit()
            finally:
                if getattr(self._local, "write", None) is conn:
                    self._local.write = None
                if sqlite_db and not sqlite_foreign_keys:
                    conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                    conn.commit()

    def close(self) -> None:
        self.engine.dispose()


class Store:
    """What every store is built on: its statements run on the one Database, `self.db`."""

    def __init__(self, db: Database):
        self.db = db


def _sqlite_engine(path: Path, pool_size: int):
    # max_overflow -1: no thread ever waits for a connection (each thread had its own before the engine)
    engine = create_engine(f"sqlite:///{path}", pool_size=pool_size, max_overflow=-1,
                           connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # sqlite3 must not BEGIN on its own (it would before DML only, and deferred): transaction() sends BEGIN
        # IMMEDIATE, and a connect() block begins nothing, so each of its statements commits on its own
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def _postgres_engine(url: str, pool_size: int):
    # pre_ping: a pooled connection broken by a database restart is replaced before use, not handed out.
    # prepare_threshold None: no server-side prepared statements, whose plans another process's migration
    # would invalidate.
    engine = create_engine(engine_url(url), pool_size=pool_size, max_overflow=0, pool_pre_ping=True,
                           connect_args={"prepare_threshold": None, "connect_timeout": 15})
    try:
        with engine.connect():
            pass
    except Exception as exc:
        engine.dispose()
        raise ConnectionError(f"无法连接 PostgreSQL（{_safe(url)}）：{exc}") from exc
    return engine


def _safe(url: str) -> str:
    """The URL without its password (for messages)."""
    try:
        u = make_url(engine_url(url))
    except Exception:
        return "?"
    return f"{u.host or ''}:{u.port or 5432}/{u.database or ''}"
