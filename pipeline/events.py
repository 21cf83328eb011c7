"""The one answer event stream (SRS §7.3–7.4).

`Engine.ask()` yields these; the Gradio chat and the HTTP SSE endpoint both consume the very same objects.
Order: stage(recall) → stage(rerank) → trace → stage(generate) → delta* → sources → done, or error at any point.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

EVENT_TYPES = ("stage", "trace", "delta", "sources", "done", "error")

# Error codes shared by the event stream and the REST envelope.
CODE_VALIDATION = 1001
CODE_LLM = 2001
CODE_ENGINE = 2002
CODE_PARSE = 3001
CODE_NO_DOC = 3002

NO_ANSWER_TEXT = "根据现有资料无法回答该问题，请到知识库补充相关资料。"
NO_ANSWER_SHORT = "根据现有资料无法回答"
EXTRACTIVE_LABEL = "未配置大模型，以下为知识库原文摘录"


@dataclass(frozen=True)
class Event:
    type: str
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.type not in EVENT_TYPES:
            raise ValueError(f"unknown event type {self.type!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.type, "data": self.data}

    def to_sse(self) -> str:
        """Serialize as one Server-Sent Event frame."""
        return f"event: {self.type}\ndata: {json.dumps(self.data, ensure_ascii=False)}\n\n"


def stage(phase: str) -> Event:
    return Event("stage", {"phase": phase})


def delta(text: str) -> Event:
    return Event("delta", {"text": text})


def error(code: int, msg: str) -> Event:
    return Event("error", {"code": code, "msg": msg})
