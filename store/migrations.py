"""Schema migrations: one ordered list, applied once each, recorded in `schema_version`.

Every data dir, whichever release made it, is brought to the current schema when `Database` opens it. The
baseline is the schema of the first release (SRS §8) written with IF NOT EXISTS, so a data dir made before this
table existed starts at the baseline and gets every later step. To change the schema, append a Migration at
the END of MIGRATIONS with a new unique name (other branches append theirs; names, not positions, say what has
been applied). A step runs inside one transaction with foreign keys off (SQLite's table-rebuild recipe needs
that: DROP TABLE would otherwise cascade into the chunks) and must leave `PRAGMA foreign_key_check` clean.
"""
from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

log = logging.getLogger(__name__)

BASELINE = """
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
CREATE INDEX IF NOT EXISTS idx_chunk_doc ON kb_chunk(doc_id, chunk_index);
CREATE INDEX IF NOT EXISTS idx_doc_status ON kb_document(status);
"""


def _script(sql: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        for stmt in sql.split(";"):
            if stmt.strip():
                conn.execute(stmt)
    return run


# issue 16: tables stay tables (chunk context = heading path / sheet), the parsed text kept for the viewer,
# parser notes (empty sheet skipped, …) on the document.
CHUNK_STRUCTURE = """
ALTER TABLE kb_chunk ADD COLUMN context TEXT;
ALTER TABLE kb_chunk ADD COLUMN section INTEGER NOT NULL DEFAULT 0;
ALTER TABLE kb_document ADD COLUMN note TEXT;
CREATE TABLE kb_section (
    doc_id   INTEGER NOT NULL REFERENCES kb_document(doc_id) ON DELETE CASCADE,
    section  INTEGER NOT NULL,
    page     INTEGER,
    source   TEXT NOT NULL DEFAULT 'text',
    context  TEXT,
    text     TEXT NOT NULL,
    PRIMARY KEY (doc_id, section)
)
"""


# issue 16: knowledge bases (each document in one; the first release's documents go to the default KB 1) and
# document versions (lineage_id = doc_id of version 1; one active version per lineage). SQLite cannot drop the
# old UNIQUE(content_md5) (the same file may now sit in two KBs), so kb_document is rebuilt by the recipe of
# https://sqlite.org/lang_altertable.html#otheralter: new table, copy, drop, rename.
DEFAULT_KB_ID = 1
DEFAULT_KB_NAME = "默认知识库"


def _knowledge_bases(conn: sqlite3.Connection) -> None:
    now = datetime.now().isoformat(sep=" ", timespec="seconds")
    conn.execute("""CREATE TABLE kb_base (
        kb_id       INTEGER PRIMARY KEY AUTOINCREMENT,
        name        TEXT NOT NULL UNIQUE,
        description TEXT NOT NULL DEFAULT '',
        created_at  TEXT NOT NULL
    )""")
    conn.execute("INSERT INTO kb_base(kb_id, name, description, created_at) VALUES (?, ?, ?, ?)",
                 (DEFAULT_KB_ID, DEFAULT_KB_NAME, "", now))
    conn.execute("""CREATE TABLE kb_document_new (
        doc_id       INTEGER PRIMARY KEY AUTOINCREMENT,
        kb_id        INTEGER NOT NULL DEFAULT 1 REFERENCES kb_base(kb_id),
        file_name    TEXT NOT NULL,
        file_type    TEXT NOT NULL,
        file_size    INTEGER NOT NULL,
        content_md5  TEXT NOT NULL,
        chunk_count  INTEGER NOT NULL DEFAULT 0,
        status       TEXT NOT NULL CHECK (status IN ('processing', 'ready', 'failed')),
        fail_reason  TEXT,
        created_at   TEXT NOT NULL,
        stored_name  TEXT,
        progress     TEXT,
        note         TEXT,
        version      INTEGER NOT NULL DEFAULT 1,
        lineage_id   INTEGER,
        active       INTEGER NOT NULL DEFAULT 1,
        UNIQUE (kb_id, content_md5)
    )""")
    cols = ("doc_id, file_name, file_type, file_size, content_md5, chunk_count, status, fail_reason, created_at,"
            " stored_name, progress, note")
    conn.execute(f"INSERT INTO kb_document_new({cols}, kb_id, version, lineage_id, active)"
                 f" SELECT {cols}, 1, 1, doc_id, 1 FROM kb_document")
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'kb_document'").fetchone()
    conn.execute("DROP TABLE kb_document")
    conn.execute("ALTER TABLE kb_document_new RENAME TO kb_document")
    if seq:  # ids of documents deleted before the upgrade are never handed out again
        conn.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'kb_document'", (seq[0],))
    conn.execute("CREATE INDEX idx_doc_status ON kb_document(status)")
    conn.execute("CREATE INDEX idx_doc_kb ON kb_document(kb_id, active)")
    conn.execute("CREATE INDEX idx_doc_lineage ON kb_document(lineage_id)")


@dataclass(frozen=True)
class Migration:
    name: str
    apply: Callable[[sqlite3.Connection], None]


MIGRATIONS: list[Migration] = [
    Migration("0001_baseline", _script(BASELINE)),
    Migration("0002_chunk_structure", _script(CHUNK_STRUCTURE)),
    Migration("0003_knowledge_bases_versions", _knowledge_bases),
]


def applied(conn: sqlite3.Connection) -> list[str]:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    return [r[0] for r in conn.execute("SELECT name FROM schema_version ORDER BY rowid")]


def migrate(conn: sqlite3.Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Apply the steps not yet recorded, in list order. Returns the names applied now. `conn` is in autocommit
    mode (isolation_level=None) and used by nobody else meanwhile (Database's constructor)."""
    migrations = MIGRATIONS if migrations is None else migrations
    done = set(applied(conn))
    ran = []
    for m in migrations:
        if m.name in done:
            continue
        conn.execute("PRAGMA foreign_keys=OFF")  # no effect inside a transaction: set before BEGIN
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("SELECT 1 FROM schema_version WHERE name = ?", (m.name,)).fetchone():
                    conn.execute("COMMIT")  # another process opening the same dir applied it meanwhile
                    continue
                m.apply(conn)
                bad = conn.execute("PRAGMA foreign_key_check").fetchall()
                if bad:
                    raise RuntimeError(f"migration {m.name} broke {len(bad)} foreign keys")
                conn.execute("INSERT INTO schema_version(name, applied_at) VALUES (?, ?)",
                             (m.name, datetime.now().isoformat(sep=" ", timespec="seconds")))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.execute("PRAGMA foreign_keys=ON")
        log.info("schema migration %s applied", m.name)
        ran.append(m.name)
    return ran
