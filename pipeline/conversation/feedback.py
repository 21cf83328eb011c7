"""👍 / 👎 on answers: validation, ownership (one rates one's own answers), the admin list and JSONL export."""
from __future__ import annotations

import json
from typing import Any

from pipeline.errors import CODE_NO_DOC, CODE_VALIDATION, EngineError
from store.feedback import FeedbackStore

from .service import ConversationService

REASONS = ("不准确", "引用错误", "没回答", "其他")
MAX_COMMENT_CHARS = 500
RATINGS = {"up": 1, "down": -1}


class FeedbackService:
    def __init__(self, store: FeedbackStore, conversations: ConversationService):
        self.store = store
        self.conversations = conversations

    def give(self, turn_id: Any, user: str | None, rating: Any, reason: Any = None, comment: Any = None) -> dict:
        if rating not in RATINGS:
            raise EngineError(CODE_VALIDATION, "rating 必须是 up 或 down", "rating")
        reason = reason or None
        if comment is not None and not isinstance(comment, str):
            raise EngineError(CODE_VALIDATION, "comment 必须是文本", "comment")
        comment = (comment or "").strip() or None
        if rating == "up" and (reason or comment):
            raise EngineError(CODE_VALIDATION, "👍 不需要原因；原因只用于 👎", "reason")
        if reason is not None and reason not in REASONS:
            raise EngineError(CODE_VALIDATION, f"reason 必须是 {' / '.join(REASONS)} 之一", "reason")
        if comment is not None and len(comment) > MAX_COMMENT_CHARS:
            raise EngineError(CODE_VALIDATION, f"comment 必须是不超过 {MAX_COMMENT_CHARS} 字的文本", "comment")
        turn = self.conversations.turn_of(turn_id, user)  # 3002 unknown / 4003 another user's
        return self.store.upsert(turn, RATINGS[rating], reason, comment)

    def list(self, rating: Any = None, page: int = 1, size: int = 50) -> dict:
        if rating not in (None, "", "up", "down"):
            raise EngineError(CODE_VALIDATION, "rating 只能是 up、down 或不填", "rating")
        if not isinstance(page, int) or page < 1 or not isinstance(size, int) or not 1 <= size <= 200:
            raise EngineError(CODE_VALIDATION, "page ≥ 1，size 为 1–200", "size")
        items, total = self.store.list(RATINGS.get(rating or ""), size, (page - 1) * size)
        return {"items": items, "total": total, "page": page, "size": size}

    def get(self, fb_id: Any) -> dict:
        fb = self.store.get(fb_id) if isinstance(fb_id, int) else None
        if fb is None:
            raise EngineError(CODE_NO_DOC, f"反馈不存在：{fb_id}", "fb_id")
        return fb

    def export_jsonl(self, rating: Any = None) -> str:
        """One JSON object a line: question, rewritten query, answer, sources, rating, reason, comment, user, time."""
        self.list(rating, 1, 1)  # validates rating
        rows = self.store.iter_all(RATINGS.get(rating or ""))
        return "".join(json.dumps(fb, ensure_ascii=False) + "\n" for fb in rows)
