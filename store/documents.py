"""Document and chunk metadata (`kb_document`, `kb_chunk`) in the app database (SQLite or PostgreSQL).

Chunk rows carry the jieba tokens computed once at ingest (space-joined), so the BM25 index can be rebuilt from
storage without re-tokenizing the corpus.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .db import Database
from .migrations import DEFAULT_KB_ID

STATUS_LABELS = {"processing": "处理中", "ready": "就绪", "failed": "失败"}
# kb_document.active: 1 = the version retrieval uses; 0 = an old (or replaced) version; 2 = a new version that
# becomes active once it is 就绪 (and deactivates the others of its lineage).
INACTIVE, ACTIVE, ACTIVATE_WHEN_READY = 0, 1, 2
# What the list shows: the active version of each document, and versions still processing or failed (an old,
# inactive version is reached through its document's 版本 list).
VISIBLE = "(d.active = 1 OR d.status != 'ready')"
# What retrieval may return: ready and active.
RETRIEVABLE = "d.status = 'ready' AND d.active = 1"


def _activate(conn, doc_id: int, lineage_id: int) -> None:
    conn.execute("UPDATE kb_document SET active = ? WHERE lineage_id = ? AND doc_id != ? AND active = ?",
                 (INACTIVE, lineage_id, doc_id, ACTIVE))
    conn.execute("UPDATE kb_document SET active = ? WHERE doc_id = ?", (ACTIVE, doc_id))


def activate_waiting_version(conn, doc_id: int) -> bool:
    """Inside the transaction that marks `doc_id` 就绪: a new version waiting for that (active 2) becomes the
    active one and its lineage's others inactive — retrieval never sees two versions or none. Returns whether
    versions were swapped."""
    row = conn.execute("SELECT active, lineage_id FROM kb_document WHERE doc_id = ?", (doc_id,)).fetchone()
    if row is None or row["active"] != ACTIVATE_WHEN_READY:
        return False
    _activate(conn, doc_id, row["lineage_id"])
    return True


def _kb_clause(kb_id: int | None) -> tuple[str, tuple]:
    return ("", ()) if kb_id is None else (" AND d.kb_id = ?", (int(kb_id),))


@dataclass
class ChunkRow:
    doc_id: int
    chunk_index: int
    text: str
    page: int | None
    char_start: int
    char_end: int
    source: str
    tokens: list[str]
    context: str | None = None  # heading path / sheet name (store.migrations 0002)
    section: int = 0  # index of the parsed page/sheet the chunk comes from (kb_section)


@dataclass
class SectionRow:
    """One parsed page / sheet / whole text of a document, kept for the document viewer."""

    section: int
    page: int | None
    source: str
    context: str | None
    text: str


def encode_tokens(tokens: list[str]) -> str:
    """Space-joined; a space inside a token (GB/T 7714-2015) is kept as a no-break space."""
    return " ".join(t.replace(" ", "\u00a0") for t in tokens)


def decode_tokens(stored: str) -> list[str]:
    return [t.replace("\u00a0", " ") for t in stored.split(" ")] if stored else []


def _now() -> str:
    return datetime.now().isoformat(sep=" ", timespec="seconds")


def _doc_dict(row) -> dict:
    d = dict(row)
    d["status_label"] = STATUS_LABELS.get(d["status"], d["status"])
    return d


class DocumentStore:
    def __init__(self, db: Database):
        self.db = db

    # --- documents ---------------------------------------------------------------------------
    def find_by_md5(self, md5: str, kb_id: int = DEFAULT_KB_ID) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE content_md5 = ? AND kb_id = ?",
                               (md5, int(kb_id))).fetchone()
        return _doc_dict(row) if row else None

    def create(self, file_name: str, file_type: str, file_size: int, md5: str, stored_name: str,
               kb_id: int = DEFAULT_KB_ID, lineage_id: int | None = None, version: int = 1) -> dict:
        """A new document (version 1, active) or a new version of `lineage_id` (inactive until it is 就绪)."""
        with self.db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO kb_document(file_name, file_type, file_size, content_md5, status, created_at,"
                " stored_name, kb_id, version, lineage_id, active) VALUES (?, ?, ?, ?, 'processing', ?, ?, ?, ?, ?, ?)"
                " RETURNING doc_id",
                (file_name, file_type, file_size, md5, _now(), stored_name, int(kb_id), version, lineage_id,
                 ACTIVE if lineage_id is None else ACTIVATE_WHEN_READY),
            )
            doc_id = cur.fetchone()[0]
            if lineage_id is None:
                conn.execute("UPDATE kb_document SET lineage_id = ? WHERE doc_id = ?", (doc_id, doc_id))
        return self.get(doc_id)

    def get(self, doc_id: int) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE doc_id = ?", (doc_id,)).fetchone()
        return _doc_dict(row) if row else None

    def list(self, page: int = 1, size: int = 20, keyword: str = "",
             kb_id: int | None = DEFAULT_KB_ID) -> tuple[list[dict], int]:
        """Visible documents of one knowledge base (None: all), newest first."""
        page = max(1, int(page))
        size = max(1, min(int(size), 200))
        kw = (keyword or "").strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = f"%{kw}%"
        kb_sql, kb_args = _kb_clause(kb_id)
        where = f"FROM kb_document d WHERE d.file_name LIKE ? ESCAPE '\\' AND {VISIBLE}{kb_sql}"
        with self.db.connect() as conn:
            total = conn.execute(f"SELECT COUNT(*) {where}", (like, *kb_args)).fetchone()[0]
            rows = conn.execute(f"SELECT d.*, (SELECT COUNT(*) FROM kb_document v WHERE v.lineage_id = d.lineage_id)"
                                f" AS versions {where} ORDER BY d.doc_id DESC LIMIT ? OFFSET ?",
                                (like, *kb_args, size, (page - 1) * size)).fetchall()
        return [_doc_dict(r) for r in rows], total

    def all_docs(self, kb_id: int | None = None) -> list[dict]:
        """Every document (all versions) of one knowledge base (None: all) in id order — what a rebuild redoes."""
        kb_sql, kb_args = _kb_clause(kb_id)
        with self.db.connect() as conn:
            return [_doc_dict(r) for r in conn.execute(
                f"SELECT d.* FROM kb_document d WHERE 1 = 1{kb_sql} ORDER BY d.doc_id", kb_args)]

    def ids_with_status(self, status: str) -> list[int]:
        with self.db.connect() as conn:
            return [r[0] for r in conn.execute(
                "SELECT doc_id FROM kb_document WHERE status = ? ORDER BY doc_id", (status,))]

    def set_status(self, doc_id: int, status: str, reason: str | None = None, progress: str | None = None):
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE kb_document SET status = ?, fail_reason = ?, progress = ? WHERE doc_id = ?",
                (status, reason, progress, doc_id),
            )

    def set_progress(self, doc_id: int, progress: str | None) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE kb_document SET progress = ? WHERE doc_id = ?", (progress, doc_id))

    def mark_ready(self, doc_id: int, chunk_count: int) -> bool:
        """就绪 (and a new version waiting for it becomes the active one, see activate_waiting_version)."""
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE kb_document SET status = 'ready', fail_reason = NULL, progress = NULL,"
                " chunk_count = ? WHERE doc_id = ?",
                (chunk_count, doc_id),
            )
            return activate_waiting_version(conn, doc_id)

    # --- versions ----------------------------------------------------------------------------------
    def find_active_by_name(self, kb_id: int, file_name: str) -> dict | None:
        """The active version of the document called `file_name` in the knowledge base, if any."""
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE kb_id = ? AND file_name = ? AND active = ?"
                               " ORDER BY doc_id DESC LIMIT 1", (int(kb_id), file_name, ACTIVE)).fetchone()
        return _doc_dict(row) if row else None

    def find_active_in_lineage(self, lineage_id: int) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE lineage_id = ? AND active = ?",
                               (lineage_id, ACTIVE)).fetchone()
        return _doc_dict(row) if row else None

    def next_version(self, lineage_id: int) -> int:
        with self.db.connect() as conn:
            return int(conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM kb_document WHERE lineage_id = ?",
                                    (lineage_id,)).fetchone()[0])

    def versions_of(self, lineage_id: int) -> list[dict]:
        """Every version of a document, newest first."""
        with self.db.connect() as conn:
            return [_doc_dict(r) for r in conn.execute(
                "SELECT * FROM kb_document WHERE lineage_id = ? ORDER BY version DESC", (lineage_id,))]

    def restore(self, doc_id: int) -> None:
        """Make this (就绪, inactive) version the active one; the lineage's active version turns inactive."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT lineage_id FROM kb_document WHERE doc_id = ?", (doc_id,)).fetchone()
            if row is not None:
                _activate(conn, doc_id, row["lineage_id"])

    def active_states(self, doc_ids: Iterable[int]) -> dict[int, dict]:
        """doc_id → {active, version, status, current_version} for cited documents (replays mark 旧版本)."""
        ids = sorted({int(i) for i in doc_ids})
        if not ids:
            return {}
        q = ",".join("?" * len(ids))
        with self.db.connect() as conn:
            rows = conn.execute(
                f"SELECT d.doc_id, d.active, d.version, d.status, (SELECT a.version FROM kb_document a"
                f" WHERE a.lineage_id = d.lineage_id AND a.active = {ACTIVE}) AS current_version"
                f" FROM kb_document d WHERE d.doc_id IN ({q})", ids).fetchall()
        return {r["doc_id"]: dict(r) for r in rows}

    def delete(self, doc_id: int) -> bool:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
            conn.execute("DELETE FROM kb_section WHERE doc_id = ?", (doc_id,))
            cur = conn.execute("DELETE FROM kb_document WHERE doc_id = ?", (doc_id,))
            return cur.rowcount > 0

    def counts(self, kb_id: int | None = None) -> dict:
        """docs (visible), ready_docs (retrievable), processing, chunks (retrievable) — of one KB or all."""
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            docs = conn.execute(f"SELECT COUNT(*) FROM kb_document d WHERE {VISIBLE}{kb_sql}", a).fetchone()[0]
            ready_docs = conn.execute(f"SELECT COUNT(*) FROM kb_document d WHERE {RETRIEVABLE}{kb_sql}",
                                      a).fetchone()[0]
            processing = conn.execute(f"SELECT COUNT(*) FROM kb_document d WHERE d.status='processing'{kb_sql}",
                                      a).fetchone()[0]
        return {"docs": docs, "ready_docs": ready_docs, "processing": processing,
                "chunks": self.ready_chunk_count(kb_id)}

    # --- chunks ------------------------------------------------------------------------------
    def replace_chunks(self, doc_id: int, chunks: list[ChunkRow], sections: list[SectionRow] | None = None,
                       note: str | None = None, guard: Callable[[Any], None] | None = None) -> list[int]:
        """Drop any old chunks (and parsed sections) of the document and insert these; returns the new global
        chunk_ids. `note`: the parser's remarks (empty sheet skipped, …), shown with the document.

        `guard(conn)` runs first in the same transaction and may raise to refuse the write (the ingest lease)."""
        ids = []
        with self.db.transaction() as conn:
            if guard is not None:
                guard(conn)
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
            for c in chunks:
                cur = conn.execute(
                    "INSERT INTO kb_chunk(doc_id, chunk_index, text, page, char_start, char_end, source, tokens,"
                    " context, section) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING chunk_id",
                    (doc_id, c.chunk_index, c.text, c.page, c.char_start, c.char_end, c.source,
                     encode_tokens(c.tokens), c.context, c.section),
                )
                ids.append(cur.fetchone()[0])
            if sections is not None:
                conn.execute("DELETE FROM kb_section WHERE doc_id = ?", (doc_id,))
                conn.executemany(
                    "INSERT INTO kb_section(doc_id, section, page, source, context, text) VALUES (?, ?, ?, ?, ?, ?)",
                    [(doc_id, x.section, x.page, x.source, x.context, x.text) for x in sections])
                conn.execute("UPDATE kb_document SET note = ? WHERE doc_id = ?", (note, doc_id))
        return ids

    def sections_of(self, doc_id: int) -> list[dict]:
        with self.db.connect() as conn:
            return [dict(r) for r in conn.execute(
                "SELECT section, page, source, context, text FROM kb_section WHERE doc_id = ? ORDER BY section",
                (doc_id,))]

    def chunk_count_of(self, doc_id: int) -> int:
        with self.db.connect() as conn:
            return conn.execute("SELECT COUNT(*) FROM kb_chunk WHERE doc_id = ?", (doc_id,)).fetchone()[0]

    def delete_chunks(self, doc_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
            conn.execute("DELETE FROM kb_section WHERE doc_id = ?", (doc_id,))

    def chunks_of(self, doc_id: int) -> list[dict]:
        with self.db.connect() as conn:
            rows = conn.execute(
                "SELECT chunk_id, chunk_index, text, page, char_start, char_end, source, context, section"
                " FROM kb_chunk WHERE doc_id = ? ORDER BY chunk_index", (doc_id,)).fetchall()
        return [dict(r) for r in rows]

    def get_chunks(self, chunk_ids: Iterable[int]) -> dict[int, dict]:
        ids = list({int(i) for i in chunk_ids})
        out: dict[int, dict] = {}
        with self.db.connect() as conn:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                q = ",".join("?" * len(part))
                for r in conn.execute(
                    f"SELECT c.chunk_id, c.doc_id, c.chunk_index, c.text, c.page, c.source, c.context,"
                    f" d.file_name, d.status, d.file_type, d.active, d.version, d.kb_id, b.name AS kb_name"
                    f" FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                    f" LEFT JOIN kb_base b ON b.kb_id = d.kb_id WHERE c.chunk_id IN ({q})", part):
                    out[r["chunk_id"]] = dict(r)
        return out

    def iter_ready_tokens(self, kb_id: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """(chunk_id, tokens) of every chunk of a 就绪, active document (of one KB, or all), by chunk_id."""
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            cur = conn.execute(
                f"SELECT c.chunk_id, c.tokens FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                f" WHERE {RETRIEVABLE}{kb_sql} ORDER BY c.chunk_id", a)
            for chunk_id, tokens in cur:
                yield chunk_id, decode_tokens(tokens)

    def ready_chunk_count(self, kb_id: int | None = None) -> int:
        """Retrievable chunks (就绪, active version) of one knowledge base or all."""
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            return conn.execute(
                f"SELECT COUNT(*) FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                f" WHERE {RETRIEVABLE}{kb_sql}", a).fetchone()[0]

    def pending_chunk_count(self, kb_id: int | None = None) -> int:
        """Chunks whose vectors may sit in Chroma but must not be returned: documents not yet 就绪, and
        inactive (old) versions. The vector route over-fetches by this many."""
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            return conn.execute(
                f"SELECT COUNT(*) FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                f" WHERE NOT ({RETRIEVABLE}){kb_sql}", a).fetchone()[0]

    def audit_rows(self) -> list[tuple[int, int, str, str]]:
        """(chunk_id, doc_id, text, stored tokens) of every chunk: what the consistency audit compares."""
        with self.db.connect() as conn:
            return [tuple(r) for r in conn.execute("SELECT chunk_id, doc_id, text, tokens FROM kb_chunk")]

    def chunk_contexts(self) -> dict[int, str]:
        """chunk_id → context (heading path / sheet) of the chunks that have one: their stored tokens and their
        vectors were made from context + text (pipeline.ingestion.structured_chunking.indexed_text)."""
        with self.db.connect() as conn:
            return {r[0]: r[1] for r in conn.execute("SELECT chunk_id, context FROM kb_chunk WHERE context IS NOT NULL")}

    def set_tokens(self, tokens: dict[int, list[str]]) -> None:
        """Rewrite stored BM25 tokens (repair re-tokenizes from the chunk text, the source of truth)."""
        with self.db.transaction() as conn:
            conn.executemany("UPDATE kb_chunk SET tokens = ? WHERE chunk_id = ?",
                             [(encode_tokens(t), int(c)) for c, t in tokens.items()])

    def set_chunk_count(self, doc_id: int, n: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE kb_document SET chunk_count = ? WHERE doc_id = ?", (int(n), int(doc_id)))

    def all_chunk_ids(self, kb_id: int | None = None) -> set[int]:
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            return {r[0] for r in conn.execute(
                f"SELECT c.chunk_id FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id WHERE 1 = 1{kb_sql}",
                a)}

    def ready_chunk_ids(self, kb_id: int | None = None) -> set[int]:
        """The chunks the BM25 index of the KB must hold (retrievable ones)."""
        kb_sql, a = _kb_clause(kb_id)
        with self.db.connect() as conn:
            return {r[0] for r in conn.execute(
                f"SELECT c.chunk_id FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                f" WHERE {RETRIEVABLE}{kb_sql}", a)}
