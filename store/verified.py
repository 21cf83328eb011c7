"""Verified Q&A entries (`verified_qa`, migration 7): an admin's checked answer to a question, with the chunks it was
based on. Each entry is indexed as a small document of its own (kb_document.file_type = 'qa', one chunk), so
`doc_id` links it to retrieval; deleting that document deletes the entry (ON DELETE CASCADE)."""
from __future__ import annotations

import json

from sqlalchemy import delete, insert, select

from .db import Store, as_dict, dicts, now_text, with_json
from .schema import kb_document, verified_qa

Q = verified_qa.c


class VerifiedQAStore(Store):
    def add(self, doc_id: int, question: str, answer: str, cited: list, turn_id: int | None, user: str) -> dict:
        with self.db.transaction() as conn:
            qa_id = conn.execute(insert(verified_qa).returning(Q.qa_id), {
                "doc_id": doc_id, "question": question, "answer": answer, "cited": json.dumps(cited, ensure_ascii=False),
                "turn_id": turn_id, "created_by": user,
                "created_at": now_text()}).scalar_one()
        return self.get(qa_id)

    def get(self, qa_id: int) -> dict | None:
        with self.db.connect() as conn:
            d = as_dict(conn.execute(select(verified_qa).where(Q.qa_id == qa_id)).first())
        return with_json(d, "cited") if d else None

    def list(self) -> list[dict]:
        with self.db.connect() as conn:
            return [with_json(d, "cited") for d in dicts(conn.execute(
                select(verified_qa, kb_document.c.status)
                .join_from(verified_qa, kb_document, kb_document.c.doc_id == Q.doc_id).order_by(Q.qa_id.desc())))]

    def delete(self, qa_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(verified_qa).where(Q.qa_id == qa_id))
