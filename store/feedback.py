"""Answer feedback (`answer_feedback`, migration 6): 👍 / 👎 on a turn, 👎 with a reason and a comment.

One row per turn (rating again replaces it). The row keeps a snapshot of the turn's question, answer and
sources, so the admin view and the JSONL export still show what was rated after the user deletes the
conversation (feedback is quality data of the knowledge base, kept deliberately).
"""
from __future__ import annotations

import json
from datetime import datetime

from .db import Database, row_with_json


def _now() -> str:
    return datetime.now().isoformat(sep=" ", timespec="seconds")


def _row(r) -> dict:
    d = row_with_json(r, "sources")
    d["rating"] = "up" if d["rating"] == 1 else "down"
    return d


class FeedbackStore:
    def __init__(self, db: Database):
        self.db = db

    def upsert(self, turn: dict, rating: int, reason: str | None, comment: str | None) -> dict:
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO answer_feedback(turn_id, conv_id, user, rating, reason, comment, question, rewritten,"
                " answer, sources, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(turn_id) DO UPDATE SET"
                " rating = excluded.rating, reason = excluded.reason, comment = excluded.comment,"
                " created_at = excluded.created_at",
                (turn["turn_id"], turn["conv_id"], turn["user"], rating, reason, comment, turn["question"],
                 turn.get("rewritten"), turn["answer"], json.dumps(turn.get("sources") or [], ensure_ascii=False),
                 _now()))
        return self.get_by_turn(turn["turn_id"])

    def get_by_turn(self, turn_id: int) -> dict | None:
        with self.db.connect() as conn:
            r = conn.execute("SELECT * FROM answer_feedback WHERE turn_id = ?", (turn_id,)).fetchone()
        return _row(r) if r else None

    def get(self, fb_id: int) -> dict | None:
        with self.db.connect() as conn:
            r = conn.execute("SELECT * FROM answer_feedback WHERE fb_id = ?", (fb_id,)).fetchone()
        return _row(r) if r else None

    def list(self, rating: int | None = None, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
        where, args = ("WHERE rating = ?", [rating]) if rating is not None else ("", [])
        with self.db.connect() as conn:
            total = conn.execute(f"SELECT COUNT(*) FROM answer_feedback {where}", args).fetchone()[0]
            rows = conn.execute(f"SELECT * FROM answer_feedback {where} ORDER BY fb_id DESC LIMIT ? OFFSET ?",
                                [*args, limit, offset]).fetchall()
        return [_row(r) for r in rows], total

    def iter_all(self, rating: int | None = None):
        where, args = ("WHERE rating = ?", [rating]) if rating is not None else ("", [])
        with self.db.connect() as conn:
            for r in conn.execute(f"SELECT * FROM answer_feedback {where} ORDER BY fb_id", args):
                yield _row(r)
