"""Replies of the router's DIRECT route: no retrieval, no sources.

With an LLM: a short chat call (system prompt + the last few turns + the message); its answer is labelled as
not coming from the knowledge base. Offline: a fixed text per chit-chat kind.
"""
from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

from pipeline.events import Event, delta

from .router import Route

FIXED_REPLIES = {
    "greeting": "你好！我是知识库问答助手，可以根据已上传的资料回答问题并标注出处。请直接输入你的问题。",
    "thanks": "不客气！还有其他问题可以继续问我。",
    "farewell": "再见！需要时随时回来提问。",
    "identity": "我是知识库问答助手：根据知识库中已上传的文档回答问题，每个结论都标注引用的资料编号 [n]；"
                "资料中没有的内容我会如实说明无法回答。",
    "ack": "好的。还有其他问题可以继续问我。",
}
KB_OFF_OFFLINE = ("当前未配置大模型：关闭「知识库检索」后没有可用的回答方式。请打开「知识库检索」后提问，"
                  "或由管理员在「配置」中连接大模型。")
KB_OFF_LABEL = "（未使用知识库：以下回答来自大模型自身，没有资料依据）\n\n"

CHAT_SYSTEM = ("你是一个知识库问答助手。用户现在在闲聊或不使用知识库直接提问。请用简体中文简短、友好地回应；"
               "不要编造具体事实、数据或引用编号；涉及资料的问题，提醒用户打开「知识库检索」后提问。")


def direct_messages(question: str, history: Sequence[dict]) -> list:
    from llama_index.core.llms import ChatMessage, MessageRole

    from pipeline.generation.containment import contain  # no role token of a past turn becomes a real one

    msgs = [ChatMessage(role=MessageRole.SYSTEM, content=CHAT_SYSTEM)]
    for t in history or ():
        msgs.append(ChatMessage(role=MessageRole.USER, content=contain(t.get("question") or "")))
        msgs.append(ChatMessage(role=MessageRole.ASSISTANT, content=contain(str(t.get("answer") or "")[:500])))
    msgs.append(ChatMessage(role=MessageRole.USER, content=contain(question)))
    return msgs


def direct_reply(question: str, route: Route, history: Sequence[dict], llm: Any,
                 temperature: float, max_tokens: int | None = None) -> Generator[Event, None, str]:
    """Yield the reply's delta events; return the answer mode ("llm" or "fixed"). LLM failures raise LLMError."""
    if llm is None:
        text = KB_OFF_OFFLINE if route.kind == "kb_off" else FIXED_REPLIES.get(route.kind or "", FIXED_REPLIES["ack"])
        yield delta(text)
        return "fixed"
    from pipeline.generation.answer import stream_llm

    if route.kind == "kb_off":
        yield delta(KB_OFF_LABEL)
    yield from stream_llm(direct_messages(question, history), llm, temperature, materials=0, max_tokens=max_tokens)
    return "llm"
