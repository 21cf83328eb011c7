"""The retrievals behind recent answers (`qa_retrieval`: JSON by key, the key being (conversation, question)
as JSON), for 重试 on any app process."""
from __future__ import annotations

from sqlalchemy import delete, select

from .db import Database
from .schema import qa_retrieval

R = qa_retrieval.c


class RetrievalStore:
    def __init__(self, db: Database, capacity: int = 64):
        self.db = db
        self.capacity = capacity

    def get(self, question: str) -> str | None:
        with self.db.connect() as conn:
            return conn.execute(select(R.result).where(R.question == question)).scalar()

    def put(self, question: str, result_json: str) -> None:
        stmt = self.db.insert(qa_retrieval).values(stored_at=self.db.clock.now())
        newest = select(R.question).order_by(R.stored_at.desc()).limit(self.capacity).correlate(None)
        with self.db.transaction() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=[R.question], set_={
                "result": stmt.excluded.result, "stored_at": stmt.excluded.stored_at}),
                {"question": question, "result": result_json})
            conn.execute(delete(qa_retrieval).where(R.question.not_in(newest)))

    def copy(self, question: str, to: str) -> None:
        """The retrieval stored under `question` also under `to` (as stored: not decoded, not checked)."""
        text = self.get(question)
        if text is not None:
            self.put(to, text)

    def clear(self) -> None:
        with self.db.transaction() as conn:
            conn.execute(delete(qa_retrieval))
