"""Document tags and key-value metadata (`kb_doc_tag`, `kb_doc_meta`), and the filter that turns them into the
documents a question may search.

A filter is resolved here, in SQL, to the retrievable chunks of the documents it allows (`allowed`): both routes
then score only those (pipeline/retrieval/doc_filter.py), so a filter restricts the search itself instead of
thinning a top-k found without it. Automatic metadata is read from the document row, never copied: file_type,
version, pages (the highest page number parsed), the upload date (created_at). `source` (the folder or URL a
document came from) is ordinary metadata that whoever imports the document sets.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np
from sqlalchemy import and_, delete, exists, false, func, insert, select

from .db import Database
from .documents import RETRIEVABLE, VISIBLE
from .schema import kb_chunk, kb_doc_meta, kb_doc_tag, kb_document, kb_section

D, C, T, M = kb_document, kb_chunk, kb_doc_tag, kb_doc_meta

# Keys read from the document itself (not settable): what a key = value filter may also name.
AUTO_KEYS = ("file_type", "version", "pages", "file_name")
_PAGES = select(func.max(kb_section.c.page)).where(kb_section.c.doc_id == D.c.doc_id).scalar_subquery()


@dataclass(frozen=True)
class DocFilter:
    """Which documents a question searches, on top of its knowledge bases. Empty parts do not restrict.

    tags_any: at least one of these tags; tags_all: every one of them; meta: each key = value (a key of
    AUTO_KEYS compares the document's own field); date_from / date_to: the upload date, inclusive (date objects).
    """

    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    meta: tuple[tuple[str, str], ...] = ()
    date_from: date | None = None
    date_to: date | None = None

    @property
    def empty(self) -> bool:
        return not (self.tags_any or self.tags_all or self.meta or self.date_from or self.date_to)

    def to_dict(self) -> dict:
        """The filter as the doors take it and the trace shows it."""
        out: dict = {}
        if self.tags_any:
            out["tags_any"] = list(self.tags_any)
        if self.tags_all:
            out["tags_all"] = list(self.tags_all)
        if self.meta:
            out["metadata"] = dict(self.meta)
        if self.date_from:
            out["date_from"] = self.date_from.isoformat()
        if self.date_to:
            out["date_to"] = self.date_to.isoformat()
        return out

    def where(self) -> list:
        """WHERE terms on kb_document rows."""
        terms: list = []
        if self.tags_any:
            terms.append(exists().where(T.c.doc_id == D.c.doc_id, T.c.tag.in_(list(self.tags_any))))
        for tag in self.tags_all:
            terms.append(exists().where(T.c.doc_id == D.c.doc_id, T.c.tag == tag))
        for key, value in self.meta:
            if key == "version" or key == "pages":
                col = D.c.version if key == "version" else _PAGES
                terms.append(col == int(value) if str(value).isdigit() else false())
            elif key in AUTO_KEYS:
                terms.append(getattr(D.c, key) == value)
            else:
                terms.append(exists().where(M.c.doc_id == D.c.doc_id, M.c.key == key, M.c.value == value))
        # created_at is "YYYY-MM-DD HH:MM:SS" text: a date range is a range of strings
        if self.date_from:
            terms.append(D.c.created_at >= self.date_from.isoformat())
        if self.date_to:
            terms.append(D.c.created_at < (self.date_to + timedelta(days=1)).isoformat())
        return terms


@dataclass
class Allowed:
    """What a filter lets a question search: documents by knowledge base and their retrievable chunk ids."""

    doc_ids: dict[int, list[int]] = field(default_factory=dict)  # kb_id → doc_ids
    chunk_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # sorted

    def docs_in(self, kb_id: int) -> list[int]:
        return self.doc_ids.get(int(kb_id), [])

    @property
    def all_doc_ids(self) -> list[int]:
        return sorted(d for ids in self.doc_ids.values() for d in ids)


class DocTagStore:
    def __init__(self, db: Database):
        self.db = db

    # --- per document ---------------------------------------------------------------------------------------
    def get(self, doc_id: int) -> dict:
        """{tags: [...], metadata: {key: value}} of one document (user-set parts only)."""
        with self.db.connect() as conn:
            tags = list(conn.execute(select(T.c.tag).where(T.c.doc_id == int(doc_id)).order_by(T.c.tag)).scalars())
            meta = {k: v for k, v in conn.execute(select(M.c.key, M.c.value).where(M.c.doc_id == int(doc_id))
                                                  .order_by(M.c.key))}
        return {"tags": tags, "metadata": meta}

    def auto(self, doc_id: int) -> dict:
        """The automatic metadata of a document: file_type, version, pages, upload date."""
        with self.db.connect() as conn:
            row = conn.execute(select(D.c.file_type, D.c.version, D.c.created_at, _PAGES.label("pages"))
                               .where(D.c.doc_id == int(doc_id))).first()
        if row is None:
            return {}
        return {"file_type": row.file_type, "version": row.version, "pages": row.pages,
                "uploaded": (row.created_at or "")[:10]}

    def many(self, doc_ids: Iterable[int]) -> dict[int, dict]:
        """doc_id → {tags, metadata} for several documents (the KB list)."""
        ids = sorted({int(i) for i in doc_ids})
        out = {i: {"tags": [], "metadata": {}} for i in ids}
        if not ids:
            return out
        with self.db.connect() as conn:
            for d, tag in conn.execute(select(T.c.doc_id, T.c.tag).where(T.c.doc_id.in_(ids)).order_by(T.c.tag)):
                out[d]["tags"].append(tag)
            for d, k, v in conn.execute(select(M.c.doc_id, M.c.key, M.c.value).where(M.c.doc_id.in_(ids))):
                out[d]["metadata"][k] = v
        return out

    def set(self, doc_id: int, tags: list[str] | None = None, metadata: dict[str, str] | None = None) -> None:
        """Replace the tags (when given) and / or the metadata (when given) of a document."""
        with self.db.transaction() as conn:
            if tags is not None:
                conn.execute(delete(T).where(T.c.doc_id == int(doc_id)))
                if tags:
                    conn.execute(insert(T), [{"doc_id": int(doc_id), "tag": t} for t in tags])
            if metadata is not None:
                conn.execute(delete(M).where(M.c.doc_id == int(doc_id)))
                if metadata:
                    conn.execute(insert(M), [{"doc_id": int(doc_id), "key": k, "value": v}
                                             for k, v in metadata.items()])

    def copy(self, from_doc: int, to_doc: int) -> None:
        """A new version starts with the tags and metadata of the version it replaces."""
        got = self.get(from_doc)
        self.set(to_doc, got["tags"], got["metadata"])

    def delete_doc(self, doc_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(T).where(T.c.doc_id == int(doc_id)))
            conn.execute(delete(M).where(M.c.doc_id == int(doc_id)))

    # --- across documents -----------------------------------------------------------------------------------
    def tags_in_use(self, kb_ids: Iterable[int] | None = None) -> list[dict]:
        """[{tag, docs}] of the visible documents of these knowledge bases (None: all), by tag."""
        where = [VISIBLE] + ([D.c.kb_id.in_([int(k) for k in kb_ids])] if kb_ids is not None else [])
        with self.db.connect() as conn:
            rows = conn.execute(select(T.c.tag, func.count()).select_from(T.join(D, D.c.doc_id == T.c.doc_id))
                                .where(*where).group_by(T.c.tag).order_by(T.c.tag))
            return [{"tag": t, "docs": n} for t, n in rows]

    def allowed(self, kb_ids: Iterable[int], flt: DocFilter) -> Allowed:
        """The retrievable documents of these knowledge bases the filter lets through, and their chunks."""
        doc_where = and_(RETRIEVABLE, D.c.kb_id.in_([int(k) for k in kb_ids]), *flt.where())
        out = Allowed()
        with self.db.connect() as conn:
            for doc_id, kb_id in conn.execute(select(D.c.doc_id, D.c.kb_id).where(doc_where).order_by(D.c.doc_id)):
                out.doc_ids.setdefault(int(kb_id), []).append(int(doc_id))
            if out.doc_ids:
                ids = conn.execute(select(C.c.chunk_id).select_from(C.join(D, D.c.doc_id == C.c.doc_id))
                                   .where(doc_where).order_by(C.c.chunk_id)).scalars().all()
                out.chunk_ids = np.asarray(ids, dtype=np.int64)
        return out
