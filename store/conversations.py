"""Conversations and their turns in the app database (`conversation`, `conversation_turn`; schema: migration 5).

A conversation belongs to one user ('' when logins are off); its public id is a random 32-hex string so ids
cannot be guessed or enumerated. A turn keeps everything a full replay needs: the user's words, the query that
retrieval really saw (after rewriting), the answer, the numbered sources and the retrieval trace (JSON), the
route, the answer mode and the elapsed time. Ownership checks live in pipeline.conversation.service; this
module only stores.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from .db import Database, row_with_json

TITLE_CHARS = 40


def _now() -> str:
    # microseconds: two turns within one second still order correctly (the list sorts on updated_at)
    return datetime.now().isoformat(sep=" ", timespec="microseconds")


def new_conv_id() -> str:
    return uuid.uuid4().hex


def title_from(question: str) -> str:
    q = " ".join((question or "").split())
    return q[:TITLE_CHARS] + ("…" if len(q) > TITLE_CHARS else "") or "新对话"


def _turn_dict(row) -> dict:
    d = row_with_json(row, "sources")
    d["trace"] = json.loads(d.get("trace") or "{}")
    d["no_answer"] = bool(d.get("no_answer"))
    return d


def _conv_dict(row) -> dict:
    d = dict(row)
    d["time"] = (d.get("updated_at") or "")[:19]
    return d


class ConversationStore:
    def __init__(self, db: Database):
        self.db = db

    # --- conversations ---------------------------------------------------------------------------
    def create(self, user: str, title: str) -> dict:
        cid, now = new_conv_id(), _now()
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO conversation(conv_id, user, title, created_at, updated_at) VALUES (?,?,?,?,?)",
                         (cid, user, title, now, now))
        return self.get(cid)

    def get(self, conv_id: str) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM conversation WHERE conv_id = ?", (conv_id,)).fetchone()
        return _conv_dict(row) if row else None

    def list(self, user: str, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
        """Newest first (last activity), paged; served by idx_conv_user_updated."""
        with self.db.connect() as conn:
            total = conn.execute("SELECT COUNT(*) FROM conversation WHERE user = ?", (user,)).fetchone()[0]
            rows = conn.execute(
                "SELECT * FROM conversation WHERE user = ? ORDER BY updated_at DESC, created_at DESC, conv_id DESC"
                " LIMIT ? OFFSET ?",
                (user, limit, offset)).fetchall()
        return [_conv_dict(r) for r in rows], total

    def rename(self, conv_id: str, title: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE conversation SET title = ? WHERE conv_id = ?", (title, conv_id))

    def delete(self, conv_id: str) -> bool:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM conversation_turn WHERE conv_id = ?", (conv_id,))
            return conn.execute("DELETE FROM conversation WHERE conv_id = ?", (conv_id,)).rowcount > 0

    def clear(self, user: str) -> int:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM conversation_turn WHERE conv_id IN"
                         " (SELECT conv_id FROM conversation WHERE user = ?)", (user,))
            return conn.execute("DELETE FROM conversation WHERE user = ?", (user,)).rowcount

    # --- turns -----------------------------------------------------------------------------------
    def add_turn(self, conv_id: str, user: str, question: str, answer: str, *, rewritten: str | None = None,
                 sources: list | None = None, trace: dict | None = None, mode: str | None = None,
                 route: str | None = None, no_answer: bool = False, elapsed_ms: Any = None) -> dict:
        now = _now()
        with self.db.transaction() as conn:
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM conversation_turn WHERE conv_id = ?",
                               (conv_id,)).fetchone()[0]
            cur = conn.execute(
                "INSERT INTO conversation_turn(conv_id, seq, user, question, rewritten, answer, sources, trace,"
                " mode, route, no_answer, elapsed_ms, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (conv_id, seq, user, question, rewritten, answer, json.dumps(sources or [], ensure_ascii=False),
                 json.dumps(trace or {}, ensure_ascii=False), mode, route, int(bool(no_answer)),
                 None if elapsed_ms is None else int(elapsed_ms), now))
            conn.execute("UPDATE conversation SET updated_at = ?, turn_count = turn_count + 1 WHERE conv_id = ?",
                         (now, conv_id))
            turn_id = cur.lastrowid
        return {"turn_id": turn_id, "seq": seq, "created_at": now}

    def turns(self, conv_id: str) -> list[dict]:
        with self.db.connect() as conn:
            rows = conn.execute("SELECT * FROM conversation_turn WHERE conv_id = ? ORDER BY seq",
                                (conv_id,)).fetchall()
        return [_turn_dict(r) for r in rows]

    def recent_turns(self, conv_id: str, n: int) -> list[dict]:
        """The last n turns, oldest first, without the bulky trace (rewrite and the answer prompt need text)."""
        with self.db.connect() as conn:
            rows = conn.execute(
                "SELECT turn_id, seq, question, rewritten, answer, route, no_answer FROM conversation_turn"
                " WHERE conv_id = ? ORDER BY seq DESC LIMIT ?", (conv_id, n)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def get_turn(self, turn_id: int) -> dict | None:
        with self.db.connect() as conn:
            row = conn.execute("SELECT * FROM conversation_turn WHERE turn_id = ?", (turn_id,)).fetchone()
        return _turn_dict(row) if row else None
