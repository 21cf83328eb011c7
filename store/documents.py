"""Document and chunk metadata (`kb_document`, `kb_chunk`) in the app database (SQLite or PostgreSQL).

Chunk rows carry the jieba tokens computed once at ingest (space-joined), so the BM25 index can be rebuilt from
storage without re-tokenizing the corpus.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, update

from .db import Store, as_dict, dicts, now_text
from .migrations import DEFAULT_KB_ID
from .schema import kb_base, kb_chunk, kb_doc_meta, kb_doc_tag, kb_document, kb_section

MAX_OFFSET = 2**62  # page × size never overflows the 64-bit OFFSET of SQLite / PostgreSQL
STATUS_LABELS = {"processing": "处理中", "ready": "就绪", "failed": "失败"}
# kb_document.active: 1 = the version retrieval uses; 0 = an old (or replaced) version; 2 = a new version that
# becomes active once it is 就绪 (and deactivates the others of its lineage).
INACTIVE, ACTIVE, ACTIVATE_WHEN_READY = 0, 1, 2

D, C = kb_document, kb_chunk
# What the list shows: the active version of each document, and versions still processing or failed (an old,
# inactive version is reached through its document's 版本 list).
VISIBLE = or_(D.c.active == ACTIVE, D.c.status != "ready")
# What retrieval may return: ready and active.
RETRIEVABLE = and_(D.c.status == "ready", D.c.active == ACTIVE)
# A chunk a KB admin switched off (pipeline/services/chunks.py) is out of both routes whatever its document.
ENABLED = C.c.enabled == 1
_CHUNKS_OF_DOCS = C.join(D, D.c.doc_id == C.c.doc_id)
# Built once (statements on every question's path): the document by id, and chunk rows with their document.
_DOC_BY_ID = select(D).where(D.c.doc_id == bindparam("doc_id"))
_CHUNK_ROWS = (select(C.c.chunk_id, C.c.doc_id, C.c.chunk_index, C.c.text, C.c.page, C.c.source, C.c.context,
                      C.c.enabled, D.c.file_name, D.c.status, D.c.file_type, D.c.active, D.c.version, D.c.kb_id,
                      kb_base.c.name.label("kb_name"))
               .select_from(_CHUNKS_OF_DOCS.outerjoin(kb_base, kb_base.c.kb_id == D.c.kb_id))
               .where(C.c.chunk_id.in_(bindparam("ids", expanding=True))))


def _activate(conn, doc_id: int, lineage_id: int) -> None:
    conn.execute(update(D).where(D.c.lineage_id == lineage_id, D.c.doc_id != doc_id, D.c.active == ACTIVE)
                 .values(active=INACTIVE))
    conn.execute(update(D).where(D.c.doc_id == doc_id).values(active=ACTIVE))


def activate_waiting_version(conn, doc_id: int) -> bool:
    """Inside the transaction that marks `doc_id` 就绪: a new version waiting for that (active 2) becomes the
    active one and its lineage's others inactive — retrieval never sees two versions or none. Returns whether
    versions were swapped."""
    row = conn.execute(select(D.c.active, D.c.lineage_id).where(D.c.doc_id == doc_id)).first()
    if row is None or row.active != ACTIVATE_WHEN_READY:
        return False
    _activate(conn, doc_id, row.lineage_id)
    return True


def _in_kb(kb_id: int | None) -> list:
    """The WHERE terms limiting kb_document rows to one knowledge base (none: all of them)."""
    return [] if kb_id is None else [D.c.kb_id == int(kb_id)]


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


def _literal(text: str) -> str:
    """`text` for a LIKE pattern with escape character \\: its own % and _ match only themselves."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def encode_tokens(tokens: list[str]) -> str:
    """Space-joined; a space inside a token (GB/T 7714-2015) is kept as a no-break space."""
    return " ".join(t.replace(" ", "\u00a0") for t in tokens)


def decode_tokens(stored: str) -> list[str]:
    return [t.replace("\u00a0", " ") for t in stored.split(" ")] if stored else []


def _labelled(d: dict | None) -> dict | None:
    if d is not None:
        d["status_label"] = STATUS_LABELS.get(d["status"], d["status"])
    return d


class DocumentStore(Store):
    def _one_doc(self, *where) -> dict | None:
        with self.db.connect() as conn:
            return _labelled(as_dict(conn.execute(select(D).where(*where).order_by(D.c.doc_id.desc()).limit(1))
                                     .first()))

    # --- documents ---------------------------------------------------------------------------
    def find_by_md5(self, md5: str, kb_id: int = DEFAULT_KB_ID) -> dict | None:
        return self._one_doc(D.c.content_md5 == md5, D.c.kb_id == int(kb_id))

    def create(self, file_name: str, file_type: str, file_size: int, md5: str, stored_name: str,
               kb_id: int = DEFAULT_KB_ID, lineage_id: int | None = None, version: int = 1) -> dict:
        """A new document (version 1, active) or a new version of `lineage_id` (inactive until it is 就绪)."""
        with self.db.transaction() as conn:
            doc_id = conn.execute(insert(D).returning(D.c.doc_id), {
                "file_name": file_name, "file_type": file_type, "file_size": file_size, "content_md5": md5,
                "status": "processing", "created_at": now_text(), "stored_name": stored_name, "kb_id": int(kb_id),
                "version": version, "lineage_id": lineage_id,
                "active": ACTIVE if lineage_id is None else ACTIVATE_WHEN_READY}).scalar_one()
            if lineage_id is None:
                conn.execute(update(D).where(D.c.doc_id == doc_id).values(lineage_id=doc_id))
        return self.get(doc_id)

    def get(self, doc_id: int) -> dict | None:
        with self.db.connect() as conn:
            return _labelled(as_dict(conn.execute(_DOC_BY_ID, {"doc_id": doc_id}).first()))

    def list(self, page: int = 1, size: int = 20, keyword: str = "",
             kb_id: int | None = DEFAULT_KB_ID) -> tuple[list[dict], int]:
        """Visible documents of one knowledge base (None: all), newest first."""
        size = max(1, min(int(size), 200))
        page = max(1, min(int(page), MAX_OFFSET // size))  # a page past the end is empty; the offset stays 64-bit
        kw = _literal((keyword or "").strip())
        # ILIKE on PostgreSQL, lower() LIKE lower() on SQLite: the keyword ignores ASCII case on both
        where = [D.c.file_name.ilike(f"%{kw}%", escape="\\"), VISIBLE, *_in_kb(kb_id)]
        v = D.alias("v")
        versions = select(func.count()).where(v.c.lineage_id == D.c.lineage_id).scalar_subquery()
        with self.db.connect() as conn:
            total = conn.execute(select(func.count()).select_from(D).where(*where)).scalar_one()
            rows = dicts(conn.execute(select(D, versions.label("versions")).where(*where).order_by(D.c.doc_id.desc())
                                      .limit(size).offset((page - 1) * size)))
        return [_labelled(d) for d in rows], total

    def all_docs(self, kb_id: int | None = None) -> list[dict]:
        """Every document (all versions) of one knowledge base (None: all) in id order — what a rebuild redoes."""
        with self.db.connect() as conn:
            return [_labelled(d) for d in dicts(conn.execute(select(D).where(*_in_kb(kb_id)).order_by(D.c.doc_id)))]

    def any_retrievable_named(self, fragment: str, kb_ids: Iterable[int]) -> bool:
        """Is a document whose file name contains `fragment` searchable in one of these knowledge bases?"""
        kw = _literal(fragment)
        ids = [int(k) for k in kb_ids]
        if not kw or not ids:
            return False
        with self.db.connect() as conn:
            return conn.execute(select(D.c.doc_id).where(D.c.file_name.like(f"%{kw}%", escape="\\"), RETRIEVABLE,
                                                         D.c.kb_id.in_(ids)).limit(1)).first() is not None

    def ids_with_status(self, status: str) -> list[int]:
        with self.db.connect() as conn:
            return list(conn.execute(select(D.c.doc_id).where(D.c.status == status).order_by(D.c.doc_id)).scalars())

    def set_status(self, doc_id: int, status: str, reason: str | None = None, progress: str | None = None):
        with self.db.transaction() as conn:
            conn.execute(update(D).where(D.c.doc_id == doc_id).values(status=status, fail_reason=reason,
                                                                       progress=progress))

    def set_progress(self, doc_id: int, progress: str | None) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(D).where(D.c.doc_id == doc_id).values(progress=progress))

    def mark_ready(self, doc_id: int, chunk_count: int) -> bool:
        """就绪 (and a new version waiting for it becomes the active one, see activate_waiting_version)."""
        with self.db.transaction() as conn:
            conn.execute(update(D).where(D.c.doc_id == doc_id).values(
                status="ready", fail_reason=None, progress=None, chunk_count=chunk_count))
            return activate_waiting_version(conn, doc_id)

    # --- versions ----------------------------------------------------------------------------------
    def find_active_by_name(self, kb_id: int, file_name: str) -> dict | None:
        """The active version of the document called `file_name` in the knowledge base, if any."""
        return self._one_doc(D.c.kb_id == int(kb_id), D.c.file_name == file_name, D.c.active == ACTIVE)

    def find_active_in_lineage(self, lineage_id: int) -> dict | None:
        return self._one_doc(D.c.lineage_id == lineage_id, D.c.active == ACTIVE)

    def next_version(self, lineage_id: int) -> int:
        with self.db.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(D.c.version), 0) + 1)
                                    .where(D.c.lineage_id == lineage_id)).scalar_one())

    def versions_of(self, lineage_id: int) -> list[dict]:
        """Every version of a document, newest first."""
        with self.db.connect() as conn:
            return [_labelled(d) for d in dicts(conn.execute(
                select(D).where(D.c.lineage_id == lineage_id).order_by(D.c.version.desc())))]

    def restore(self, doc_id: int) -> None:
        """Make this (就绪, inactive) version the active one; the lineage's active version turns inactive."""
        with self.db.transaction() as conn:
            lineage_id = conn.execute(select(D.c.lineage_id).where(D.c.doc_id == doc_id)).first()
            if lineage_id is not None:
                _activate(conn, doc_id, lineage_id[0])

    def active_states(self, doc_ids: Iterable[int]) -> dict[int, dict]:
        """doc_id → {active, version, status, current_version} for cited documents (replays mark 旧版本)."""
        ids = sorted({int(i) for i in doc_ids})
        if not ids:
            return {}
        a = D.alias("a")
        current = select(a.c.version).where(a.c.lineage_id == D.c.lineage_id, a.c.active == ACTIVE).scalar_subquery()
        with self.db.connect() as conn:
            rows = dicts(conn.execute(select(D.c.doc_id, D.c.active, D.c.version, D.c.status,
                                             current.label("current_version")).where(D.c.doc_id.in_(ids))))
        return {d["doc_id"]: d for d in rows}

    def delete(self, doc_id: int) -> bool:
        with self.db.transaction() as conn:
            conn.execute(delete(C).where(C.c.doc_id == doc_id))
            conn.execute(delete(kb_section).where(kb_section.c.doc_id == doc_id))
            for t in (kb_doc_tag, kb_doc_meta):  # its tags and metadata (store/doc_tags.py)
                conn.execute(delete(t).where(t.c.doc_id == doc_id))
            return conn.execute(delete(D).where(D.c.doc_id == doc_id)).rowcount > 0

    def counts(self, kb_id: int | None = None) -> dict:
        """docs (visible), ready_docs (retrievable), processing, chunks (retrievable) — of one KB or all."""
        def count(*where) -> int:
            return conn.execute(select(func.count()).select_from(D).where(*where, *_in_kb(kb_id))).scalar_one()

        with self.db.connect() as conn:
            docs, ready_docs, processing = count(VISIBLE), count(RETRIEVABLE), count(D.c.status == "processing")
        return {"docs": docs, "ready_docs": ready_docs, "processing": processing,
                "chunks": self.ready_chunk_count(kb_id)}

    # --- chunks ------------------------------------------------------------------------------
    def replace_chunks(self, doc_id: int, chunks: list[ChunkRow], sections: list[SectionRow] | None = None,
                       note: str | None = None, guard: Callable[[Any], None] | None = None) -> list[int]:
        """Drop any old chunks (and parsed sections) of the document and insert these; returns the new global
        chunk_ids (in the order of `chunks`). `note`: the parser's remarks (empty sheet skipped, …), shown with
        the document.

        `guard(conn)` runs first in the same transaction and may raise to refuse the write (the ingest lease)."""
        ids: list[int] = []
        with self.db.transaction() as conn:
            if guard is not None:
                guard(conn)
            conn.execute(delete(C).where(C.c.doc_id == doc_id))
            if chunks:
                ids = list(conn.execute(
                    insert(C).returning(C.c.chunk_id, sort_by_parameter_order=True),
                    [{"doc_id": doc_id, "chunk_index": c.chunk_index, "text": c.text, "page": c.page,
                      "char_start": c.char_start, "char_end": c.char_end, "source": c.source,
                      "tokens": encode_tokens(c.tokens), "context": c.context, "section": c.section}
                     for c in chunks]).scalars())
            if sections is not None:
                conn.execute(delete(kb_section).where(kb_section.c.doc_id == doc_id))
                if sections:
                    conn.execute(insert(kb_section), [
                        {"doc_id": doc_id, "section": x.section, "page": x.page, "source": x.source,
                         "context": x.context, "text": x.text} for x in sections])
                conn.execute(update(D).where(D.c.doc_id == doc_id).values(note=note))
        return ids

    def sections_of(self, doc_id: int) -> list[dict]:
        s = kb_section.c
        with self.db.connect() as conn:
            return dicts(conn.execute(
                select(s.section, s.page, s.source, s.context, s.text).where(s.doc_id == doc_id).order_by(s.section)))

    def chunk_count_of(self, doc_id: int) -> int:
        with self.db.connect() as conn:
            return conn.execute(select(func.count()).select_from(C).where(C.c.doc_id == doc_id)).scalar_one()

    def delete_chunks(self, doc_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(C).where(C.c.doc_id == doc_id))
            conn.execute(delete(kb_section).where(kb_section.c.doc_id == doc_id))

    def chunks_of(self, doc_id: int) -> list[dict]:
        c = C.c
        with self.db.connect() as conn:
            return dicts(conn.execute(select(c.chunk_id, c.chunk_index, c.text, c.page, c.char_start, c.char_end,
                                             c.source, c.context, c.section, c.enabled, c.original_text,
                                             c.edited_by, c.edited_at, c.manual).where(c.doc_id == doc_id)
                                      .order_by(c.chunk_index)))

    def texts_before(self, doc_id: int, chunk_index: int, n: int) -> list[str]:
        """The texts of up to `n` chunks of the document just before `chunk_index`, nearest first (idx_chunk_doc)."""
        c = C.c
        with self.db.connect() as conn:
            return list(conn.execute(select(c.text).where(c.doc_id == doc_id, c.chunk_index < chunk_index)
                                     .order_by(c.chunk_index.desc()).limit(n)).scalars())

    def get_chunks(self, chunk_ids: Iterable[int]) -> dict[int, dict]:
        ids = list({int(i) for i in chunk_ids})
        out: dict[int, dict] = {}
        with self.db.connect() as conn:
            for i in range(0, len(ids), 500):
                for d in dicts(conn.execute(_CHUNK_ROWS, {"ids": ids[i:i + 500]})):
                    out[d["chunk_id"]] = d
        return out

    def _ready_chunks(self, *columns, kb_id: int | None = None, retrievable: bool = True):
        """SELECT columns FROM the enabled chunks of retrievable documents (or, retrievable=False, the chunks of
        documents not retrievable)."""
        return (select(*columns).select_from(_CHUNKS_OF_DOCS)
                .where(and_(RETRIEVABLE, ENABLED) if retrievable else ~RETRIEVABLE, *_in_kb(kb_id)))

    def iter_ready_tokens(self, kb_id: int | None = None) -> Iterator[tuple[int, list[str]]]:
        """(chunk_id, tokens) of every chunk of a 就绪, active document (of one KB, or all), by chunk_id."""
        with self.db.connect() as conn:
            for chunk_id, tokens in conn.execute(
                    self._ready_chunks(C.c.chunk_id, C.c.tokens, kb_id=kb_id).order_by(C.c.chunk_id)):
                yield chunk_id, decode_tokens(tokens)

    def tokens_of(self, chunk_ids: Iterable[int]) -> Iterator[tuple[int, list[str]]]:
        """(chunk_id, tokens) of these chunks, by chunk_id (ready or not: the caller chose them)."""
        ids = sorted({int(i) for i in chunk_ids})
        with self.db.connect() as conn:
            for i in range(0, len(ids), 500):
                for chunk_id, tokens in conn.execute(select(C.c.chunk_id, C.c.tokens)
                                                     .where(C.c.chunk_id.in_(ids[i:i + 500])).order_by(C.c.chunk_id)):
                    yield chunk_id, decode_tokens(tokens)

    def ready_chunk_ids_of_docs(self, doc_ids: Iterable[int]) -> list[int]:
        """Enabled chunks of these documents when they are retrievable: the ids a document filter hands to the
        vector search."""
        docs = sorted({int(d) for d in doc_ids})
        out: list[int] = []
        with self.db.connect() as conn:
            for i in range(0, len(docs), 500):
                out += [r[0] for r in conn.execute(self._ready_chunks(C.c.chunk_id).where(C.c.doc_id.in_(docs[i:i + 500])))]
        return out

    def ready_chunk_count(self, kb_id: int | None = None) -> int:
        """Retrievable chunks (就绪, active version) of one knowledge base or all."""
        with self.db.connect() as conn:
            return conn.execute(self._ready_chunks(func.count(), kb_id=kb_id)).scalar_one()

    def pending_chunk_count(self, kb_id: int | None = None) -> int:
        """Chunks whose vectors may sit in Chroma but must not be returned: documents not yet 就绪, and
        inactive (old) versions. The vector route over-fetches by this many."""
        with self.db.connect() as conn:
            return conn.execute(self._ready_chunks(func.count(), kb_id=kb_id, retrievable=False)).scalar_one()

    def disabled_chunk_ids(self) -> set[int]:
        """Chunks a KB admin switched off: absent from both indexes on purpose (the audit does not miss them)."""
        with self.db.connect() as conn:
            return set(conn.execute(select(C.c.chunk_id).where(~ENABLED)).scalars())

    def audit_rows(self) -> list[tuple[int, int, str, str]]:
        """(chunk_id, doc_id, text, stored tokens) of every chunk: what the consistency audit compares."""
        with self.db.connect() as conn:
            return [tuple(r) for r in conn.execute(select(C.c.chunk_id, C.c.doc_id, C.c.text, C.c.tokens))]

    def chunk_contexts(self) -> dict[int, str]:
        """chunk_id → context (heading path / sheet) of the chunks that have one: their stored tokens and their
        vectors were made from context + text (pipeline.ingestion.structured_chunking.indexed_text)."""
        with self.db.connect() as conn:
            rows = conn.execute(select(C.c.chunk_id, C.c.context).where(C.c.context.is_not(None)))
            return {chunk_id: context for chunk_id, context in rows}

    def set_tokens(self, tokens: dict[int, list[str]]) -> None:
        """Rewrite stored BM25 tokens (repair re-tokenizes from the chunk text, the source of truth)."""
        if not tokens:
            return
        with self.db.transaction() as conn:
            conn.execute(update(C).where(C.c.chunk_id == bindparam("b_chunk_id")).values(tokens=bindparam("b_tokens")),
                         [{"b_chunk_id": int(c), "b_tokens": encode_tokens(t)} for c, t in tokens.items()])

    def set_chunk_count(self, doc_id: int, n: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(D).where(D.c.doc_id == int(doc_id)).values(chunk_count=int(n)))

    def all_chunk_ids(self, kb_id: int | None = None) -> set[int]:
        with self.db.connect() as conn:
            return set(conn.execute(select(C.c.chunk_id).select_from(_CHUNKS_OF_DOCS).where(*_in_kb(kb_id))).scalars())

    def ready_chunk_ids(self, kb_id: int | None = None) -> set[int]:
        """The chunks the BM25 index of the KB must hold (retrievable ones)."""
        with self.db.connect() as conn:
            return set(conn.execute(self._ready_chunks(C.c.chunk_id, kb_id=kb_id)).scalars())
