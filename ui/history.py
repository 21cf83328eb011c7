"""The 历史 panel's pure helpers: server-side conversations (pipeline.conversation) → Gradio choices and chat
messages. No Gradio import; everything from documents, the model or the user is escaped by ui.render.

A conversation shown in the chat is a list of turn dicts (as the engine stores them): question, answer,
sources, trace, elapsed_ms, no_answer, route, rewritten, turn_id. One turn is "active": its answer has clickable
[n] citations and its sources / trace fill the side panels; the other answers show their [n] as plain text, so
a citation always points at the sources on screen.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

from .render import answer_markdown, trace_marks
from .safe_markdown import safe_markdown

STORAGE_VERSION = "v2"
_CITE = re.compile(r"\[(\d{1,3})\]")


def storage_key(data_dir: Any) -> str:
    """localStorage key of the open conversation's id: stable per data dir (two apps on one origin don't mix)."""
    h = hashlib.sha256(str(data_dir).encode("utf-8")).hexdigest()[:10]
    return f"kbqa-conversation-{STORAGE_VERSION}-{h}"


def storage_secret(data_dir: Any) -> str:
    """Stable across restarts so the browser can still read the id after one. Only an id is kept there; the
    server checks on every use that the conversation is the caller's (another user's id → refused)."""
    return hashlib.sha256(f"kbqa-conversation-secret|{data_dir}".encode()).hexdigest()[:32]


def conversation_label(c: dict) -> str:
    title = " ".join((c.get("title") or "").split())
    return f"{(c.get('updated_at') or '')[:16]} · {title} （{c.get('turn_count', 0)} 轮）"


def conversation_choices(items: list[dict]) -> list[tuple[str, str]]:
    return [(conversation_label(c), c["conv_id"]) for c in items]


def turn_label(t: dict, i: int) -> str:
    q = " ".join((t.get("question") or "").split())
    flag = "💬 " if t.get("route") == "DIRECT" else ("∅ " if t.get("no_answer") else "")
    return f"第 {i + 1} 轮 · {flag}{q[:24]}{'…' if len(q) > 24 else ''}"


def turn_choices(turns: list[dict]) -> list[tuple[str, int]]:
    return [(turn_label(t, i), i) for i, t in enumerate(turns)]


def plain_answer(text: str) -> str:
    """An inactive answer: escaped, citations left as text (they belong to that turn's sources)."""
    return _CITE.sub(r"<span class='kb-cite-off'>[\1]</span>", safe_markdown(text))


def messages(turns: list[dict], active: int | None, suffix: dict[int, str] | None = None) -> list[dict]:
    """Chatbot messages of a conversation; `suffix` adds text under some answers (e.g. the KB hint)."""
    out: list[dict] = []
    for i, t in enumerate(turns):
        out.append({"role": "user", "content": safe_markdown(str(t.get("question") or ""))})
        body = (answer_markdown(t.get("answer") or "", **trace_marks(t.get("trace"))) if i == active
                else plain_answer(t.get("answer") or ""))
        if t.get("route") == "DIRECT":
            body = f"<span class='kb-direct-tag'>未检索知识库</span>\n\n{body}"
        out.append({"role": "assistant", "content": body + ((suffix or {}).get(i) or "")})
    return out


def turn_record(question: str, answer: str, sources: list | None, trace: dict | None, done: dict) -> dict:
    """A turn as the chat keeps it, from one answer stream (the same fields the server stored)."""
    return {"turn_id": done.get("turn_id"), "question": question, "answer": answer, "sources": list(sources or []),
            "trace": trace or {}, "elapsed_ms": done.get("elapsed_ms"), "no_answer": bool(done.get("no_answer")),
            "route": done.get("route"), "rewritten": done.get("rewritten_query"), "mode": done.get("mode")}
