"""Knowledge bases in SQLite (`kb_base`): name, description, creation time, document and chunk counts.

`readers`: the user names who may read it (a JSON list), NULL = every logged-in user (pipeline.access.Reader).
Knowledge base 1 is the default one (created by store.migrations for every data dir, holding the documents of
releases before knowledge bases existed); it can be renamed but not deleted.
"""
from __future__ import annotations

import json

from sqlalchemy import and_, delete, func, or_, select, update

from .db import Store, as_dict, dicts, now_text
from .migrations import DEFAULT_KB_ID
from .schema import kb_base, kb_chunk, kb_document

B, D, C = kb_base.c, kb_document.c, kb_chunk.c
_DOCS = (select(func.count()).where(D.kb_id == B.kb_id, or_(D.active == 1, D.status != "ready"))
         .scalar_subquery().label("docs"))
_CHUNKS = (select(func.count()).select_from(kb_chunk.join(kb_document, D.doc_id == C.doc_id))
           .where(and_(D.kb_id == B.kb_id, D.status == "ready", D.active == 1)).scalar_subquery().label("chunks"))
# each knowledge base with its visible documents and retrievable chunks
_COUNTS = select(B.kb_id, B.name, B.description, B.created_at, B.readers, _DOCS, _CHUNKS)


def _kb_dict(d: dict | None) -> dict | None:
    if d is None:
        return None
    d["is_default"] = d["kb_id"] == DEFAULT_KB_ID
    d["readers"] = json.loads(d["readers"]) if d.get("readers") is not None else None  # None = every user
    return d


def _readers_json(readers: list[str] | None) -> str | None:
    return None if readers is None else json.dumps(sorted(set(readers)), ensure_ascii=False)


class KBStore(Store):
    def list(self) -> list[dict]:
        with self.db.connect() as conn:
            return [_kb_dict(d) for d in dicts(conn.execute(_COUNTS.order_by(B.kb_id)))]

    def get(self, kb_id: int) -> dict | None:
        with self.db.connect() as conn:
            return _kb_dict(as_dict(conn.execute(_COUNTS.where(B.kb_id == int(kb_id))).first()))

    def exists(self, kb_id: int) -> bool:
        with self.db.connect() as conn:
            return conn.execute(select(1).where(B.kb_id == int(kb_id))).first() is not None

    def ids(self) -> list[int]:
        with self.db.connect() as conn:
            return list(conn.execute(select(B.kb_id).order_by(B.kb_id)).scalars())

    def names(self) -> dict[int, str]:
        with self.db.connect() as conn:
            return {k: v for k, v in conn.execute(select(B.kb_id, B.name))}

    def find_by_name(self, name: str) -> dict | None:
        with self.db.connect() as conn:
            kb_id = conn.execute(select(B.kb_id).where(B.name == name)).scalar()
        return self.get(kb_id) if kb_id is not None else None

    def create(self, name: str, description: str = "", readers: list[str] | None = None) -> dict:
        with self.db.transaction() as conn:
            kb_id = conn.execute(kb_base.insert().returning(B.kb_id), {
                "name": name, "description": description,
                "created_at": now_text(),
                "readers": _readers_json(readers)}).scalar_one()
        return self.get(kb_id)

    def update(self, kb_id: int, name: str | None = None, description: str | None = None,
               readers: list[str] | None | object = ...) -> dict | None:
        """`readers` ... (the default) leaves them; None opens the knowledge base to everyone."""
        values: dict = {}
        if readers is not ...:
            values["readers"] = _readers_json(readers)
        if name is not None:
            values["name"] = name
        if description is not None:
            values["description"] = description
        if values:
            with self.db.transaction() as conn:
                conn.execute(update(kb_base).where(B.kb_id == int(kb_id)).values(values))
        return self.get(kb_id)

    def delete(self, kb_id: int) -> None:
        """The row only: its documents must be gone first (Engine.delete_kb)."""
        with self.db.transaction() as conn:
            conn.execute(delete(kb_base).where(B.kb_id == int(kb_id)))
