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

STATUS_LABELS = {"processing": "处理中", "ready": "就绪", "failed": "失败"}


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
    def find_by_md5(self, md5: str) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE content_md5 = ?", (md5,)).fetchone()
        return _doc_dict(row) if row else None

    def create(self, file_name: str, file_type: str, file_size: int, md5: str, stored_name: str) -> dict:
        with self.db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO kb_document(file_name, file_type, file_size, content_md5, status, created_at,"
                " stored_name) VALUES (?, ?, ?, ?, 'processing', ?, ?) RETURNING doc_id",
                (file_name, file_type, file_size, md5, _now(), stored_name),
            )
            doc_id = cur.fetchone()[0]
        return self.get(doc_id)

    def get(self, doc_id: int) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM kb_document WHERE doc_id = ?", (doc_id,)).fetchone()
        return _doc_dict(row) if row else None

    def list(self, page: int = 1, size: int = 20, keyword: str = "") -> tuple[list[dict], int]:
        page = max(1, int(page))
        size = max(1, min(int(size), 200))
        kw = (keyword or "").strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = f"%{kw}%"
        with self.db.connect() as conn:
            total = conn.execute(
                "SELECT COUNT(*) FROM kb_document WHERE file_name LIKE ? ESCAPE '\\'", (like,)
            ).fetchone()[0]
            rows = conn.execute(
                "SELECT * FROM kb_document WHERE file_name LIKE ? ESCAPE '\\' ORDER BY doc_id DESC"
                " LIMIT ? OFFSET ?",
                (like, size, (page - 1) * size),
            ).fetchall()
        return [_doc_dict(r) for r in rows], total

    def all_docs(self) -> list[dict]:
        with self.db.connect() as conn:
            return [_doc_dict(r) for r in conn.execute("SELECT * FROM kb_document ORDER BY doc_id")]

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

    def mark_ready(self, doc_id: int, chunk_count: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE kb_document SET status = 'ready', fail_reason = NULL, progress = NULL,"
                " chunk_count = ? WHERE doc_id = ?",
                (chunk_count, doc_id),
            )

    def delete(self, doc_id: int) -> bool:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
            cur = conn.execute("DELETE FROM kb_document WHERE doc_id = ?", (doc_id,))
            return cur.rowcount > 0

    def counts(self) -> dict:
        with self.db.connect() as conn:
            docs = conn.execute("SELECT COUNT(*) FROM kb_document").fetchone()[0]
            ready_docs = conn.execute("SELECT COUNT(*) FROM kb_document WHERE status='ready'").fetchone()[0]
            processing = conn.execute(
                "SELECT COUNT(*) FROM kb_document WHERE status='processing'").fetchone()[0]
        return {"docs": docs, "ready_docs": ready_docs, "processing": processing, "chunks": self.ready_chunk_count()}

    # --- chunks ------------------------------------------------------------------------------
    def replace_chunks(self, doc_id: int, chunks: list[ChunkRow],
                       guard: Callable[[Any], None] | None = None) -> list[int]:
        """Drop any old chunks of the document and insert these; returns the new global chunk_ids.

        `guard(conn)` runs first in the same transaction and may raise to refuse the write (the ingest lease)."""
        ids = []
        with self.db.transaction() as conn:
            if guard is not None:
                guard(conn)
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))
            for c in chunks:
                cur = conn.execute(
                    "INSERT INTO kb_chunk(doc_id, chunk_index, text, page, char_start, char_end, source, tokens)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING chunk_id",
                    (doc_id, c.chunk_index, c.text, c.page, c.char_start, c.char_end, c.source,
                     encode_tokens(c.tokens)),
                )
                ids.append(cur.fetchone()[0])
        return ids

    def chunk_count_of(self, doc_id: int) -> int:
        with self.db.connect() as conn:
            return conn.execute("SELECT COUNT(*) FROM kb_chunk WHERE doc_id = ?", (doc_id,)).fetchone()[0]

    def delete_chunks(self, doc_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM kb_chunk WHERE doc_id = ?", (doc_id,))

    def chunks_of(self, doc_id: int) -> list[dict]:
        with self.db.connect() as conn:
            rows = conn.execute(
                "SELECT chunk_id, chunk_index, text, page, char_start, char_end, source FROM kb_chunk"
                " WHERE doc_id = ? ORDER BY chunk_index", (doc_id,)).fetchall()
        return [dict(r) for r in rows]

    def get_chunks(self, chunk_ids: Iterable[int]) -> dict[int, dict]:
        ids = list({int(i) for i in chunk_ids})
        out: dict[int, dict] = {}
        with self.db.connect() as conn:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                q = ",".join("?" * len(part))
                for r in conn.execute(
                    f"SELECT c.chunk_id, c.doc_id, c.chunk_index, c.text, c.page, c.source, d.file_name,"
                    f" d.status, d.file_type FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                    f" WHERE c.chunk_id IN ({q})", part):
                    out[r["chunk_id"]] = dict(r)
        return out

    def iter_ready_tokens(self) -> Iterator[tuple[int, list[str]]]:
        """(chunk_id, tokens) of every chunk of a 就绪 document, in chunk_id order."""
        with self.db.connect() as conn:
            cur = conn.execute(
                "SELECT c.chunk_id, c.tokens FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                " WHERE d.status = 'ready' ORDER BY c.chunk_id")
            for chunk_id, tokens in cur:
                yield chunk_id, decode_tokens(tokens)

    def ready_chunk_count(self) -> int:
        with self.db.connect() as conn:
            return conn.execute(
                "SELECT COUNT(*) FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                " WHERE d.status = 'ready'").fetchone()[0]

    def pending_chunk_count(self) -> int:
        """Chunks written for documents not yet 就绪 (their vectors may already sit in Chroma)."""
        with self.db.connect() as conn:
            return conn.execute(
                "SELECT COUNT(*) FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                " WHERE d.status != 'ready'").fetchone()[0]

    def all_chunk_ids(self) -> set[int]:
        with self.db.connect() as conn:
            return {r[0] for r in conn.execute("SELECT chunk_id FROM kb_chunk")}

    def audit_rows(self) -> list[tuple[int, int, str, str]]:
        """(chunk_id, doc_id, text, stored tokens) of every chunk: what the consistency audit compares."""
        with self.db.connect() as conn:
            return [tuple(r) for r in conn.execute("SELECT chunk_id, doc_id, text, tokens FROM kb_chunk")]

    def set_tokens(self, tokens: dict[int, list[str]]) -> None:
        """Rewrite stored BM25 tokens (repair re-tokenizes from the chunk text, the source of truth)."""
        with self.db.transaction() as conn:
            conn.executemany("UPDATE kb_chunk SET tokens = ? WHERE chunk_id = ?",
                             [(encode_tokens(t), int(c)) for c, t in tokens.items()])

    def set_chunk_count(self, doc_id: int, n: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE kb_document SET chunk_count = ? WHERE doc_id = ?", (int(n), int(doc_id)))

    def ready_chunk_ids(self) -> set[int]:
        with self.db.connect() as conn:
            return {r[0] for r in conn.execute(
                "SELECT c.chunk_id FROM kb_chunk c JOIN kb_document d ON d.doc_id = c.doc_id"
                " WHERE d.status = 'ready'")}
