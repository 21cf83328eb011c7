"""Chunk curation in the app database: a KB admin's edits, enable / disable and hand-made chunks (`kb_chunk`,
migration 18). What is searchable follows in pipeline/services/chunks.py; this module only writes rows.

An edited chunk keeps its parsed text in `original_text` (set by the first edit, kept by later ones, cleared by a
restore), so the parse can always be restored. A manual chunk has no original: `manual` = 1.
"""
from __future__ import annotations

from sqlalchemy import and_, case, func, insert, or_, select, update

from .db import Store, as_dict, dicts, now_text
from .documents import encode_tokens
from .schema import kb_chunk, kb_document

C, D = kb_chunk, kb_document
# Rows a document carries beyond its parse: it must not be re-parsed away by a rebuild.
CURATED = or_(C.c.original_text.is_not(None), C.c.enabled == 0, C.c.manual == 1)
_ROW = (select(C.c.chunk_id, C.c.doc_id, C.c.chunk_index, C.c.text, C.c.page, C.c.context, C.c.source,
               C.c.enabled, C.c.original_text, C.c.edited_by, C.c.edited_at, C.c.manual, D.c.kb_id,
               D.c.file_name, D.c.file_type, D.c.status, D.c.active)
        .select_from(C.join(D, D.c.doc_id == C.c.doc_id)))


class ChunkStore(Store):
    def get(self, chunk_id: int) -> dict | None:
        """The chunk with its document's kb_id, file_name, status and active flag."""
        with self.db.connect() as conn:
            return as_dict(conn.execute(_ROW.where(C.c.chunk_id == int(chunk_id))).first())

    def of_doc(self, doc_id: int) -> list[dict]:
        with self.db.connect() as conn:
            return dicts(conn.execute(_ROW.where(C.c.doc_id == int(doc_id)).order_by(C.c.chunk_index)))

    def set_text(self, chunk_id: int, text: str, tokens: list[str], by: str | None) -> None:
        """New text and tokens; the parsed original is kept on the first edit (SET reads the old row)."""
        with self.db.transaction() as conn:
            conn.execute(update(C).where(C.c.chunk_id == int(chunk_id)).values(
                original_text=case((C.c.manual == 1, None), else_=func.coalesce(C.c.original_text, C.c.text)),
                text=text, tokens=encode_tokens(tokens), edited_by=by, edited_at=now_text()))

    def restore(self, chunk_id: int, tokens: list[str]) -> bool:
        """The parsed original back (tokens of it given); False when the chunk was not edited."""
        with self.db.transaction() as conn:
            return conn.execute(update(C).where(C.c.chunk_id == int(chunk_id), C.c.original_text.is_not(None))
                                .values(text=C.c.original_text, original_text=None, tokens=encode_tokens(tokens),
                                        edited_by=None, edited_at=None)).rowcount > 0

    def set_enabled(self, chunk_id: int, enabled: bool) -> bool:
        """Whether the flag changed."""
        with self.db.transaction() as conn:
            return conn.execute(update(C).where(C.c.chunk_id == int(chunk_id), C.c.enabled != int(enabled))
                                .values(enabled=int(enabled))).rowcount > 0

    def add_manual(self, doc_id: int, text: str, context: str | None, tokens: list[str], by: str | None) -> int:
        """A hand-made chunk after the document's last one (the document's chunk count follows); its id."""
        with self.db.transaction() as conn:
            last = conn.execute(select(func.max(C.c.chunk_index)).where(C.c.doc_id == int(doc_id))).scalar()
            chunk_id = conn.execute(insert(C).returning(C.c.chunk_id), {
                "doc_id": int(doc_id), "chunk_index": 0 if last is None else int(last) + 1, "text": text,
                "page": None, "char_start": 0, "char_end": 0, "source": "text", "tokens": encode_tokens(tokens),
                "context": context, "section": 0, "enabled": 1, "manual": 1, "edited_by": by,
                "edited_at": now_text()}).scalar_one()
            conn.execute(update(D).where(D.c.doc_id == int(doc_id)).values(chunk_count=D.c.chunk_count + 1))
        return int(chunk_id)

    def is_curated(self, doc_id: int) -> bool:
        """The document has an edited, disabled or manual chunk."""
        with self.db.connect() as conn:
            return conn.execute(select(C.c.chunk_id).where(C.c.doc_id == int(doc_id), CURATED).limit(1)).first() \
                is not None

    def set_tokens(self, doc_id: int, tokens: dict[int, list[str]]) -> None:
        """Re-derived tokens of a document's chunks (a rebuild of a curated document)."""
        with self.db.transaction() as conn:
            for chunk_id, toks in tokens.items():
                conn.execute(update(C).where(and_(C.c.chunk_id == int(chunk_id), C.c.doc_id == int(doc_id)))
                             .values(tokens=encode_tokens(toks)))
