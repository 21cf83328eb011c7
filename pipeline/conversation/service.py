"""Conversations on the server: who may see what, validation, the turn record, Markdown export.

Every public method takes the caller's user name (None when logins are off, stored as ''). An id that does not
exist is a 3002 error — never a new conversation created silently; a conversation of another user is 4003
(HTTP 403). The engine's answer stream calls `resolve()` before retrieval and `record()` before `done`.
"""
from __future__ import annotations

import re
from typing import Any

from pipeline.errors import CODE_FORBIDDEN, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.events import trace_with_support
from store.conversations import ConversationStore, title_from

HISTORY_TURNS = 3  # turns handed to the rewrite and to the answer prompt (the last few, not the whole chat)
MAX_TITLE_CHARS = 100
MAX_PAGE_SIZE = 200
_CONV_ID = re.compile(r"^[0-9a-f]{32}$")


def user_key(user: str | None) -> str:
    return user or ""


class ConversationService:
    def __init__(self, store: ConversationStore):
        self.store = store

    # --- access ----------------------------------------------------------------------------------
    def resolve(self, conv_id: Any, user: str | None) -> dict:
        """The caller's conversation `conv_id`, or EngineError 3002 (unknown) / 4003 (another user's)."""
        if not isinstance(conv_id, str) or not _CONV_ID.match(conv_id):
            raise EngineError(CODE_NO_DOC, f"会话不存在：{str(conv_id)[:64]}", "conversation_id")
        return _owned(self.store.get(conv_id), user, f"会话不存在：{conv_id}", "无权访问该会话：它属于其他用户",
                      "conversation_id")

    def history(self, conv_id: str | None, n: int = HISTORY_TURNS) -> list[dict]:
        return self.store.recent_turns(conv_id, n) if conv_id else []

    # --- the answer stream -----------------------------------------------------------------------
    def record(self, conv_id: str | None, user: str | None, question: str, answer: str, **turn: Any) -> dict:
        """Store a finished turn; a conversation is created (titled by its first question) when none is given."""
        if conv_id is None:
            conv_id = self.store.create(user_key(user), title_from(question))["conv_id"]
        saved = self.store.add_turn(conv_id, user_key(user), question, answer, **turn)
        return {"conversation_id": conv_id, **saved}

    # --- the history panel / API -----------------------------------------------------------------
    def list(self, user: str | None, page: int = 1, size: int = 50) -> dict:
        if not isinstance(page, int) or page < 1:
            raise EngineError(CODE_VALIDATION, "page 必须是 ≥ 1 的整数", "page")
        if not isinstance(size, int) or not 1 <= size <= MAX_PAGE_SIZE:
            raise EngineError(CODE_VALIDATION, f"size 必须是 1–{MAX_PAGE_SIZE} 的整数", "size")
        items, total = self.store.list(user_key(user), size, (page - 1) * size)
        return {"items": items, "total": total, "page": page, "size": size}

    def get(self, conv_id: Any, user: str | None) -> dict:
        conv = self.resolve(conv_id, user)
        return {**conv, "turns": self.store.turns(conv["conv_id"])}

    def rename(self, conv_id: Any, user: str | None, title: Any) -> dict:
        conv = self.resolve(conv_id, user)
        t = " ".join(title.split()) if isinstance(title, str) else ""
        if not t:
            raise EngineError(CODE_VALIDATION, "标题不能为空", "title")
        if len(t) > MAX_TITLE_CHARS:
            raise EngineError(CODE_VALIDATION, f"标题过长（最多 {MAX_TITLE_CHARS} 字）", "title")
        self.store.rename(conv["conv_id"], t)
        return self.store.get(conv["conv_id"])

    def delete(self, conv_id: Any, user: str | None) -> dict:
        conv = self.resolve(conv_id, user)
        self.store.delete(conv["conv_id"])
        return {"conversation_id": conv["conv_id"], "turns_removed": conv["turn_count"]}

    def clear(self, user: str | None) -> dict:
        return {"conversations_removed": self.store.clear(user_key(user))}

    def turn_of(self, turn_id: Any, user: str | None) -> dict:
        """A turn the caller owns (feedback is given on one's own answers)."""
        if not isinstance(turn_id, int) or isinstance(turn_id, bool):
            raise EngineError(CODE_VALIDATION, "turn_id 必须是整数", "turn_id")
        return _owned(self.store.get_turn(turn_id), user, f"回答记录不存在：{turn_id}", "无权操作该回答：它属于其他用户",
                      "turn_id")


def _owned(row: dict | None, user: str | None, missing: str, foreign: str, field: str) -> dict:
    """The row when it exists and is the caller's: else 3002 (missing) or 4003 (another user's)."""
    if row is None:
        raise EngineError(CODE_NO_DOC, missing, field)
    if row["user"] != user_key(user):
        raise EngineError(CODE_FORBIDDEN, foreign, field)
    return row


def _md_quote(text: str) -> str:
    return "\n".join("> " + line if line.strip() else ">" for line in (text or "").splitlines()) or ">"


def conversation_markdown(conv: dict) -> str:
    """The whole conversation as Markdown: each turn's question, answer and its numbered citations."""
    out = [f"# {conv['title']}", "", f"- 创建时间：{conv['created_at'][:19]}", f"- 轮次：{len(conv['turns'])}", ""]
    for t in conv["turns"]:
        out += [f"## 第 {t['seq']} 轮 · {t['created_at'][:19]}", "", f"**问：** {t['question']}", ""]
        if t.get("rewritten") and t["rewritten"] != t["question"]:
            out += [f"*检索问题：{t['rewritten']}*", ""]
        out += ["**答：**", "", t["answer"], ""]
        cited = [s for s in t.get("sources") or [] if s.get("cited")] or list(t.get("sources") or [])
        if cited:
            out += ["**引用来源：**", ""]
            for s in cited:
                where = s.get("doc_name") or "未知文档"
                if s.get("verified"):
                    where = f"已核实问答 · {where}"
                if s.get("page"):
                    where += f" · 第{s['page']}页"
                out += [f"[{s.get('no')}] {where}", "", _md_quote(s.get("text") or ""), ""]
    return "\n".join(out).rstrip() + "\n"


class TurnRecorder:
    """Collects one answer stream's events; `finish(done)` stores the turn and returns the enriched done payload.

    The engine feeds every event it yields through `see()`; nothing is stored for a stream that ends in an
    error (the user retries, and the retried answer is the turn that counts).
    """

    def __init__(self, service: ConversationService, conv_id: str | None, user: str | None, question: str):
        self.service, self.conv_id, self.user, self.question = service, conv_id, user, question
        self.parts: list[str] = []
        self.sources: list = []
        self.trace: dict = {}

    def see(self, event) -> None:
        if event.type == "delta":
            self.parts.append(event.data.get("text", ""))
        elif event.type == "replace":  # the streamed text was retracted: the turn holds what replaced it
            self.parts = [event.data.get("text", "")]
        elif event.type == "sources":
            self.sources = event.data.get("sources") or []
        elif event.type == "trace":
            self.trace = event.data

    def finish(self, done: dict, route: str) -> dict:
        rewritten = done.get("rewritten_query")
        saved = self.service.record(
            self.conv_id, self.user, self.question, "".join(self.parts), rewritten=rewritten,
            sources=self.sources, trace=trace_with_support(self.trace, done), mode=done.get("mode"), route=route,
            no_answer=bool(done.get("no_answer")), elapsed_ms=done.get("elapsed_ms"))
        return {**done, "conversation_id": saved["conversation_id"], "turn_id": saved["turn_id"],
                "route": route, "rewritten_query": rewritten}
