"""Conversations, feedback and verified Q&A entries, as the doors see them: a user's own conversations (sources
of knowledge bases the reader may no longer read lose their text), 👍/👎 with reasons, and verified entries."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.access.kb_readers import KBAccess, Reader
from pipeline.conversation.service import conversation_markdown
from store.migrations import DEFAULT_KB_ID

if TYPE_CHECKING:
    from pipeline.components import Components


class ConversationDesk:
    def __init__(self, c: Components, access: KBAccess):
        self.conversations = c.conversations
        self.feedback = c.feedback
        self.verified = c.verified
        self.docs = c.docs
        self.access = access

    # ---- conversations
    def list_conversations(self, user: str | None, page: int = 1, size: int = 50) -> dict:
        return self.conversations.list(user, page, size)

    def get_conversation(self, conv_id: str, user: str | None, reader: Reader | None = None) -> dict:
        """The conversation with its turns; sources from knowledge bases the reader may not read lose their text."""
        return self.access.redact_conversation(self.conversations.get(conv_id, user), reader)

    def rename_conversation(self, conv_id: str, user: str | None, title: str) -> dict:
        return self.conversations.rename(conv_id, user, title)

    def delete_conversation(self, conv_id: str, user: str | None) -> dict:
        return self.conversations.delete(conv_id, user)

    def clear_conversations(self, user: str | None) -> dict:
        return self.conversations.clear(user)

    def export_conversation(self, conv_id: str, user: str | None, reader: Reader | None = None) -> str:
        return conversation_markdown(self.get_conversation(conv_id, user, reader))

    # ---- feedback
    def give_feedback(self, turn_id: int, user: str | None, rating: str, reason: str | None = None,
                      comment: str | None = None) -> dict:
        return self.feedback.give(turn_id, user, rating, reason, comment)

    def list_feedback(self, rating: str | None = None, page: int = 1, size: int = 50) -> dict:
        return self.feedback.list(rating, page, size)

    def get_feedback(self, fb_id: int) -> dict:
        return self.feedback.get(fb_id)

    def export_feedback(self, rating: str | None = None) -> str:
        return self.feedback.export_jsonl(rating)

    # ---- verified Q&A entries (they join retrieval: adding and removing one goes through the ingest / delete
    # paths, and so through the change hook)
    def create_verified(self, question: str, answer: str, user: str | None, feedback_id: int | None = None,
                        kb_id: int | None = None) -> dict:
        """A verified Q&A entry; from a feedback item it keeps that answer's cited chunks and turn. It is stored
        in `kb_id`, by default the knowledge base its sources came from, and refused where the target's readers
        may not read a source (KBAccess.place_copy): restricted text never moves into a wider knowledge base."""
        cited, turn_id = [], None
        if feedback_id is not None:
            fb = self.feedback.get(feedback_id)
            cited = [s for s in fb["sources"] if s.get("cited")] or fb["sources"]
            turn_id = fb["turn_id"]
        target = self.access.place_copy(self._source_kbs(cited), kb_id)
        return self.verified.create(question, answer, user, cited, turn_id, kb_id=target)

    def _source_kbs(self, sources: list[dict]) -> set[int]:
        out = set()
        for s in sources:
            kb = s.get("kb_id")
            if kb is None and isinstance(s.get("doc_id"), int):  # a turn stored before sources carried kb_id
                doc = self.docs.get(s["doc_id"])
                kb = doc.get("kb_id") if doc else None
            out.add(int(kb) if kb is not None else DEFAULT_KB_ID)
        return out

    def list_verified(self) -> list[dict]:
        return self.verified.list()

    def delete_verified(self, qa_id: int) -> dict:
        return self.verified.delete(qa_id)
