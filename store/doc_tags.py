"""Document tags and key-value metadata (`kb_doc_tag`, `kb_doc_meta`), and the filter that turns them into the
documents a question may search.

A filter is resolved here, in SQL, to the retrievable documents it allows (`allowed`): both routes then score only
their chunks (pipeline/retrieval/doc_filter.py), so a filter restricts the search itself instead of
thinning a top-k found without it. Automatic metadata is read from the document row, never copied: file_type,
version, pages (the highest page number parsed), the upload date (created_at). `source` (the folder or URL a
document came from) is ordinary metadata that whoever imports the document sets.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
from sqlalchemy import delete, exists, false, func, insert, select

from .db import Store
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
    # these documents only: a follow-up searched within the documents its conversation's last answer cited
    # (set by the app, not a door's filter field)
    doc_ids: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.tags_any or self.tags_all or self.meta or self.date_from or self.date_to or self.doc_ids)

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
        if self.doc_ids:
            out["doc_ids"] = list(self.doc_ids)
        return out

    def where(self) -> list:
        """WHERE terms on kb_document rows."""
        terms: list = []
        if self.doc_ids:
            terms.append(D.c.doc_id.in_([int(d) for d in self.doc_ids]))
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


class DocTagStore(Store):
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

    def put(self, doc_id: int, key: str, value: str | None) -> None:
        """Set (or, value None, remove) one metadata key and keep the others — how an importer records `source`
        (the folder or URL a document came from) without touching what an admin set."""
        with self.db.transaction() as conn:
            conn.execute(delete(M).where(M.c.doc_id == int(doc_id), M.c.key == key))
            if value is not None:
                conn.execute(insert(M), {"doc_id": int(doc_id), "key": key, "value": str(value)})

    def copy(self, from_doc: int, to_doc: int) -> None:
        """A new version starts with the tags and metadata of the version it replaces."""
        got = self.get(from_doc)
        self.set(to_doc, got["tags"], got["metadata"])

    # --- across documents -----------------------------------------------------------------------------------
    def tags_in_use(self, kb_ids: Iterable[int] | None = None) -> list[dict]:
        """[{tag, docs}] of the visible documents of these knowledge bases (None: all), by tag."""
        where = [VISIBLE] + ([D.c.kb_id.in_([int(k) for k in kb_ids])] if kb_ids is not None else [])
        with self.db.connect() as conn:
            rows = conn.execute(select(T.c.tag, func.count()).select_from(T.join(D, D.c.doc_id == T.c.doc_id))
                                .where(*where).group_by(T.c.tag).order_by(T.c.tag))
            return [{"tag": t, "docs": n} for t, n in rows]

    def allowed(self, kb_ids: Iterable[int], flt: DocFilter) -> tuple[dict[int, list[int]], int]:
        """The retrievable documents of these knowledge bases the filter lets through: ({kb_id: [doc_id]},
        their chunk count). One small query over document rows (the chunks are not read: both routes restrict
        by document, pipeline/retrieval/doc_filter.py)."""
        by_kb: dict[int, list[int]] = {}
        chunks = 0
        with self.db.connect() as conn:
            rows = conn.execute(select(D.c.doc_id, D.c.kb_id, D.c.chunk_count)
                                .where(RETRIEVABLE, D.c.kb_id.in_([int(k) for k in kb_ids]), *flt.where())
                                .order_by(D.c.doc_id))
            for doc_id, kb_id, n in rows:
                by_kb.setdefault(int(kb_id), []).append(int(doc_id))
                chunks += int(n or 0)
        return by_kb, chunks

    def doc_ids_of(self, chunk_ids: np.ndarray) -> np.ndarray:
        """doc_id of each chunk id (−1 for one that is gone). Few ids: an IN list. Many (a BM25 snapshot's): the
        id range of each document's chunks — a document's chunks are inserted together, so their ids are almost
        always one contiguous run, and ~100 ranges read far faster than 50,000 rows (~5 µs a row here);
        documents whose ids interleave with another's are read row by row."""
        q = np.asarray(chunk_ids, dtype=np.int64)
        out = np.full(len(q), -1, dtype=np.int64)
        if not len(q):
            return out
        if len(q) <= 500:
            return self._rows_of(select(C.c.chunk_id, C.c.doc_id).where(C.c.chunk_id.in_([int(c) for c in q])), q, out)
        lo, hi = int(q.min()), int(q.max())
        with self.db.connect() as conn:
            ranges = conn.execute(select(C.c.doc_id, func.min(C.c.chunk_id), func.max(C.c.chunk_id), func.count())
                                  .where(C.c.chunk_id.between(lo, hi)).group_by(C.c.doc_id)).all()
        runs = sorted((int(a), int(b), int(d)) for d, a, b, n in ranges if int(b) - int(a) + 1 == int(n))
        if runs:
            starts = np.array([r[0] for r in runs], dtype=np.int64)
            ends = np.array([r[1] for r in runs], dtype=np.int64)
            docs = np.array([r[2] for r in runs], dtype=np.int64)
            at = np.searchsorted(starts, q, side="right") - 1
            ok = (at >= 0) & (q <= ends[np.maximum(at, 0)])
            out = np.where(ok, docs[np.maximum(at, 0)], -1)
        mixed = [int(d) for d, a, b, n in ranges if int(b) - int(a) + 1 != int(n)]
        if mixed:
            out = self._rows_of(select(C.c.chunk_id, C.c.doc_id).where(C.c.doc_id.in_(mixed)), q, out)
        return out

    def _rows_of(self, stmt, q: np.ndarray, out: np.ndarray) -> np.ndarray:
        """`out` with the doc_id of every id of `q` that the (chunk_id, doc_id) rows of `stmt` hold."""
        with self.db.connect() as conn:
            rows = conn.execute(stmt.order_by(C.c.chunk_id)).all()
        if not rows:
            return out
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        docs = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        at = np.minimum(np.searchsorted(ids, q), len(ids) - 1)
        return np.where(ids[at] == q, docs[at], out)
