"""The retrievals behind recent answers (`qa_retrieval`: JSON by key, the key being (conversation, question)
as JSON), for 重试 on any app process."""
from __future__ import annotations

from .db import Database


class RetrievalStore:
    def __init__(self, db: Database, capacity: int = 64):
        self.db = db
        self.capacity = capacity

    def get(self, question: str) -> str | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT result FROM qa_retrieval WHERE question = ?", (question,)).fetchone()
        return row[0] if row else None

    def put(self, question: str, result_json: str) -> None:
        now = self.db.now_sql
        with self.db.transaction() as conn:
            conn.execute(f"INSERT INTO qa_retrieval(question, result, stored_at) VALUES (?, ?, {now})"
                         f" ON CONFLICT(question) DO UPDATE SET result = excluded.result,"
                         f" stored_at = excluded.stored_at", (question, result_json))
            conn.execute("DELETE FROM qa_retrieval WHERE question NOT IN"
                         " (SELECT question FROM qa_retrieval ORDER BY stored_at DESC LIMIT ?)", (self.capacity,))

    def clear(self) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM qa_retrieval")
