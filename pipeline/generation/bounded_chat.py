"""One non-streaming chat call that cannot hold a question longer than its own timeout.

The query rewrite (before retrieval) and the multi-query expansion (after the gate let the question through) each
ask the LLM one short thing; a stalled server must cost them at most `timeout_s`, after which the caller takes its
offline fall-back. The call runs in a daemon thread: the openai client's own timeout bounds the request, the join
bounds everything around it (a connection pool wait, a slow DNS answer).
"""
from __future__ import annotations

import threading
from typing import Any


def chat_within(llm: Any, messages: list, timeout_s: float, *, max_tokens: int, name: str) -> str:
    """The reply text of one chat call at temperature 0; TimeoutError past `timeout_s`, the client's error else."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["text"] = llm.chat(messages, temperature=0.0, max_tokens=max_tokens,
                                   timeout=timeout_s).message.content or ""
        except Exception as exc:  # noqa: BLE001 — handed to the caller's thread below
            box["error"] = exc

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    if t.is_alive():
        raise TimeoutError(f"超过 {timeout_s:g} 秒未返回")
    if "error" in box:
        raise box["error"]
    return box["text"]
