"""Verified Q&A entries (`verified_qa`, migration 7): an admin's checked answer to a question, with the chunks it was
based on. Each entry is indexed as a small document of its own (kb_document.file_type = 'qa', one chunk), so
`doc_id` links it to retrieval; deleting that document deletes the entry (ON DELETE CASCADE)."""
from __future__ import annotations

import json
from datetime import datetime

from .db import Database, row_with_json


class VerifiedQAStore:
    def __init__(self, db: Database):
        self.db = db

    def add(self, doc_id: int, question: str, answer: str, cited: list, turn_id: int | None, user: str) -> dict:
        with self.db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO verified_qa(doc_id, question, answer, cited, turn_id, created_by, created_at)"
                " VALUES (?,?,?,?,?,?,?)",
                (doc_id, question, answer, json.dumps(cited, ensure_ascii=False), turn_id, user,
                 datetime.now().isoformat(sep=" ", timespec="seconds")))
            qa_id = cur.lastrowid
        return self.get(qa_id)

    def get(self, qa_id: int) -> dict | None:
        with self.db.connect() as conn:
            r = conn.execute("SELECT * FROM verified_qa WHERE qa_id = ?", (qa_id,)).fetchone()
        return row_with_json(r, "cited") if r else None

    def list(self) -> list[dict]:
        with self.db.connect() as conn:
            return [row_with_json(r, "cited") for r in conn.execute(
                "SELECT q.*, d.status FROM verified_qa q JOIN kb_document d ON d.doc_id = q.doc_id"
                " ORDER BY q.qa_id DESC")]

    def delete(self, qa_id: int) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM verified_qa WHERE qa_id = ?", (qa_id,))
