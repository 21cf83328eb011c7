"""Answer feedback (`answer_feedback`, migration 6): 👍 / 👎 on a turn, 👎 with a reason and a comment.

One row per turn (rating again replaces it). The row keeps a snapshot of the turn's question, answer and
sources, so the admin view and the JSONL export still show what was rated after the user deletes the
conversation (feedback is quality data of the knowledge base, kept deliberately).
"""
from __future__ import annotations

import json

from sqlalchemy import func, select

from .db import Store, as_dict, dicts, now_text, with_json
from .schema import answer_feedback

F = answer_feedback.c


def _row(d: dict | None) -> dict | None:
    if d is not None:
        with_json(d, "sources")
        d["rating"] = "up" if d["rating"] == 1 else "down"
    return d


def _rated(rating: int | None) -> list:
    return [] if rating is None else [F.rating == rating]


class FeedbackStore(Store):
    def upsert(self, turn: dict, rating: int, reason: str | None, comment: str | None) -> dict:
        stmt = self.db.insert(answer_feedback)
        new = stmt.excluded
        with self.db.transaction() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=[F.turn_id], set_={
                "rating": new.rating, "reason": new.reason, "comment": new.comment, "created_at": new.created_at}), {
                "turn_id": turn["turn_id"], "conv_id": turn["conv_id"], "user": turn["user"], "rating": rating,
                "reason": reason, "comment": comment, "question": turn["question"], "rewritten": turn.get("rewritten"),
                "answer": turn["answer"], "sources": json.dumps(turn.get("sources") or [], ensure_ascii=False),
                "created_at": now_text()})
        return self.get_by_turn(turn["turn_id"])

    def _one(self, *where) -> dict | None:
        with self.db.connect() as conn:
            return _row(as_dict(conn.execute(select(answer_feedback).where(*where)).first()))

    def get_by_turn(self, turn_id: int) -> dict | None:
        return self._one(F.turn_id == turn_id)

    def get(self, fb_id: int) -> dict | None:
        return self._one(F.fb_id == fb_id)

    def list(self, rating: int | None = None, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
        with self.db.connect() as conn:
            total = conn.execute(select(func.count()).select_from(answer_feedback).where(*_rated(rating))).scalar_one()
            rows = dicts(conn.execute(select(answer_feedback).where(*_rated(rating)).order_by(F.fb_id.desc())
                                      .limit(limit).offset(offset)))
        return [_row(d) for d in rows], total

    def iter_all(self, rating: int | None = None):
        with self.db.connect() as conn:
            result = conn.execute(select(answer_feedback).where(*_rated(rating)).order_by(F.fb_id))
            keys = tuple(result.keys())
            for row in result:  # streamed: an export may hold many rows
                yield _row(dict(zip(keys, row)))
