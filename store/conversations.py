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

from sqlalchemy import delete, func, insert, select, update

from .db import Store, as_dict, dicts, with_json
from .schema import conversation, conversation_turn

CV, T = conversation.c, conversation_turn.c

TITLE_CHARS = 40


def _now() -> str:
    # microseconds: two turns within one second still order correctly (the list sorts on updated_at)
    return datetime.now().isoformat(sep=" ", timespec="microseconds")


def new_conv_id() -> str:
    return uuid.uuid4().hex


def title_from(question: str) -> str:
    q = " ".join((question or "").split())
    return q[:TITLE_CHARS] + ("…" if len(q) > TITLE_CHARS else "") or "新对话"


def _turn_dict(d: dict | None) -> dict | None:
    if d is not None:
        with_json(d, "sources")
        d["trace"] = json.loads(d.get("trace") or "{}")
        d["no_answer"] = bool(d.get("no_answer"))
    return d


def _conv_dict(d: dict | None) -> dict | None:
    if d is not None:
        d["time"] = (d.get("updated_at") or "")[:19]
    return d


class ConversationStore(Store):
    # --- conversations ---------------------------------------------------------------------------
    def create(self, user: str, title: str) -> dict:
        cid, now = new_conv_id(), _now()
        with self.db.transaction() as conn:
            conn.execute(insert(conversation), {"conv_id": cid, "user": user, "title": title, "created_at": now,
                                                "updated_at": now})
        return self.get(cid)

    def get(self, conv_id: str) -> dict | None:
        with self.db.connect() as conn:
            return _conv_dict(as_dict(conn.execute(select(conversation).where(CV.conv_id == conv_id)).first()))

    def list(self, user: str, limit: int = 50, offset: int = 0) -> tuple[list[dict], int]:
        """Newest first (last activity), paged; served by idx_conv_user_updated."""
        with self.db.connect() as conn:
            total = conn.execute(select(func.count()).select_from(conversation).where(CV.user == user)).scalar_one()
            rows = dicts(conn.execute(select(conversation).where(CV.user == user)
                                      .order_by(CV.updated_at.desc(), CV.created_at.desc(), CV.conv_id.desc())
                                      .limit(limit).offset(offset)))
        return [_conv_dict(d) for d in rows], total

    def rename(self, conv_id: str, title: str) -> None:
        with self.db.transaction() as conn:
            conn.execute(update(conversation).where(CV.conv_id == conv_id).values(title=title))

    def delete(self, conv_id: str) -> bool:
        with self.db.transaction() as conn:
            conn.execute(delete(conversation_turn).where(T.conv_id == conv_id))
            return conn.execute(delete(conversation).where(CV.conv_id == conv_id)).rowcount > 0

    def clear(self, user: str) -> int:
        with self.db.transaction() as conn:
            conn.execute(delete(conversation_turn).where(
                T.conv_id.in_(select(CV.conv_id).where(CV.user == user))))
            return conn.execute(delete(conversation).where(CV.user == user)).rowcount

    # --- turns -----------------------------------------------------------------------------------
    def add_turn(self, conv_id: str, user: str, question: str, answer: str, *, rewritten: str | None = None,
                 sources: list | None = None, trace: dict | None = None, mode: str | None = None,
                 route: str | None = None, no_answer: bool = False, elapsed_ms: Any = None) -> dict:
        now = _now()
        with self.db.transaction() as conn:
            seq = conn.execute(select(func.coalesce(func.max(T.seq), 0) + 1).where(T.conv_id == conv_id)).scalar_one()
            turn_id = conn.execute(insert(conversation_turn).returning(T.turn_id), {
                "conv_id": conv_id, "seq": seq, "user": user, "question": question, "rewritten": rewritten,
                "answer": answer, "sources": json.dumps(sources or [], ensure_ascii=False),
                "trace": json.dumps(trace or {}, ensure_ascii=False), "mode": mode, "route": route,
                "no_answer": int(bool(no_answer)), "elapsed_ms": None if elapsed_ms is None else int(elapsed_ms),
                "created_at": now}).scalar_one()
            conn.execute(update(conversation).where(CV.conv_id == conv_id)
                         .values(updated_at=now, turn_count=CV.turn_count + 1))
        return {"turn_id": turn_id, "seq": seq, "created_at": now}

    def turns(self, conv_id: str) -> list[dict]:
        with self.db.connect() as conn:
            rows = dicts(conn.execute(select(conversation_turn).where(T.conv_id == conv_id).order_by(T.seq)))
        return [_turn_dict(d) for d in rows]

    def recent_turns(self, conv_id: str, n: int) -> list[dict]:
        """The last n turns, oldest first, without the bulky trace (rewrite and the answer prompt need text); of
        the sources only which document each came from and whether the answer cited it (`source_docs`)."""
        with self.db.connect() as conn:
            rows = dicts(conn.execute(select(T.turn_id, T.seq, T.question, T.rewritten, T.answer, T.route,
                                             T.no_answer, T.sources)
                                      .where(T.conv_id == conv_id).order_by(T.seq.desc()).limit(n)))
        for r in rows:
            r["source_docs"] = [{"doc_id": s.get("doc_id"), "cited": bool(s.get("cited"))}
                                for s in json.loads(r.pop("sources") or "[]") if isinstance(s, dict)]
        return rows[::-1]

    def get_turn(self, turn_id: int) -> dict | None:
        with self.db.connect() as conn:
            return _turn_dict(as_dict(conn.execute(select(conversation_turn).where(T.turn_id == turn_id)).first()))
