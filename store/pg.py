"""PostgreSQL backend of store.db.Database: a psycopg 3 pool behind an sqlite3-shaped connection API.

Stores call `conn.execute(sql, params)` with SQLite-style SQL and read rows by index or by name, `dict(row)`,
`cursor.rowcount` and `cursor.lastrowid` — exactly what they do on sqlite3. The wrapper translates the SQL
(store/sql_dialect.py) and gives rows the same shape as sqlite3.Row.

A thread borrows one pooled connection for its outermost `connect()`/`transaction()` and reuses it for nested
ones (as the per-thread SQLite connection is reused), so nesting never waits on the pool.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool

from store.db import POSTGRESQL  # store.db imports this module lazily, once it is fully loaded
from store.sql_dialect import to_postgres


class Row(tuple):
    """A result row usable like sqlite3.Row: `row[0]`, `row["name"]`, `dict(row)`, tuple unpacking."""

    _names: dict[str, int]

    def __new__(cls, values, names: dict[str, int]):
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor):
    desc = cursor.description
    if desc is None:
        return tuple
    names = {d.name: i for i, d in enumerate(desc)}
    return lambda values: Row(values, names)


class Cursor:
    def __init__(self, conn: psycopg.Connection, cur: psycopg.Cursor, is_insert: bool):
        self._conn = conn
        self._cur = cur
        self._is_insert = is_insert

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    @property
    def lastrowid(self) -> int | None:
        """The id the last INSERT drew from an identity/serial column (SQLite's lastrowid)."""
        if not self._is_insert:
            return None
        return self._conn.execute("SELECT lastval()").fetchone()[0]

    def fetchone(self):
        return self._cur.fetchone() if self._cur.description is not None else None

    def fetchall(self) -> list:
        return self._cur.fetchall() if self._cur.description is not None else []

    def __iter__(self):
        return iter(self._cur) if self._cur.description is not None else iter(())


class Connection:
    """sqlite3.Connection-shaped wrapper around a psycopg connection."""

    def __init__(self, raw: psycopg.Connection):
        self.raw = raw

    def execute(self, sql: str, params=()) -> Cursor:
        params = tuple(params) if params is not None else ()
        text = to_postgres(sql, bool(params))
        cur = self.raw.execute(text, params or None, prepare=False)
        return Cursor(self.raw, cur, text.lstrip()[:6].upper() == "INSERT")

    def executemany(self, sql: str, seq) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(to_postgres(sql, True), [tuple(p) for p in seq])

    def executescript(self, script: str) -> None:
        self.raw.execute(script)


class PostgresBackend:
    dialect = POSTGRESQL

    def __init__(self, url: str, pool_size: int = 20):
        self.url = url
        # check: a pooled connection broken by a database restart is replaced before use, not handed out.
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, open=False, name="kbqa",
                                    kwargs={"autocommit": True, "row_factory": _row_factory},
                                    check=ConnectionPool.check_connection)
        try:
            self._pool.open(wait=True, timeout=15)
        except Exception as exc:
            self._pool.close()
            raise ConnectionError(f"无法连接 PostgreSQL（{_safe(url)}）：{exc}") from exc
        self._local = threading.local()

    @contextmanager
    def _borrow(self):
        held = getattr(self._local, "held", None)
        if held is not None:  # nested: the thread's outermost block owns the connection
            yield held
            return
        raw = self._pool.getconn()
        self._local.held = Connection(raw)
        try:
            yield self._local.held
        finally:
            self._local.held = None
            self._pool.putconn(raw)

    @contextmanager
    def connect(self):
        with self._borrow() as conn:
            yield conn

    @contextmanager
    def transaction(self):
        with self._borrow() as conn, conn.raw.transaction():
            yield conn

    def close(self) -> None:
        self._pool.close()


def _safe(url: str) -> str:
    """The URL without its password (for messages)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "?"
    return f"{info.get('host', '')}:{info.get('port', '5432')}/{info.get('dbname', '')}"
