"""Answer generation: stream an LLM answer over the reranked nodes, or an extractive one when no LLM is set.

    result = yield from stream_answer(question, nodes, llm, temperature)

yields `pipeline.events.delta` events only and returns a `GenerationResult`. Any LLM failure — before or in the
middle of the stream — raises `LLMError` whose `.msg` is a specific Chinese message. An LLM answer that is the
「资料不足」 verdict (verdict.py) returns `insufficient` (and `shown` when text was streamed before it): the answer
stream turns it into the refusal.

Helpers live in: prompting.py (materials + rules), citations.py (CitationGuard), extractive.py (no-LLM mode),
llm_client.py (build_llm, LLMError, error mapping, test_llm_connection).
"""
from __future__ import annotations

import logging
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.events import NO_ANSWER_TEXT, Event, delta
from pipeline.generation.citations import CitationGuard
from pipeline.generation.extractive import extractive_deltas
from pipeline.generation.llm_client import (
    KIND_INTERRUPTED,
    KIND_OTHER,
    STREAM_TAG_HEADER,
    LLMError,
    map_llm_error,
    new_stream_tag,
    release_stream,
    supports_stream_tag,
)
from pipeline.generation.prompting import build_messages
from pipeline.generation.verdict import VerdictWatch, ends_with_verdict

logger = logging.getLogger(__name__)

__all__ = ["GenerationResult", "ThinkFilter", "stream_answer"]


@dataclass
class GenerationResult:
    text: str
    cited: set[int]
    order: list[int] = field(default_factory=list)  # cited numbers, first-cited first
    # the LLM's 「资料不足」 verdict (verdict.py): the materials do not address the point asked. `shown`: some
    # answer text was streamed before it (a verdict at the end), so what was shown must be replaced
    insufficient: bool = False
    shown: bool = False
    # the answer itself says its sources lack what was asked (an extractive answer to 「多少」 quoting no number):
    # answered, but weak, whatever the gate said
    weak: bool = False
    # the extractive answer's 「资料中未找到…」 (its words): it quotes nothing and points at the closest sources — a
    # refusal decided after the gate let the question through, like the LLM's 「资料不足」
    not_found: str | None = None


class ThinkFilter:
    """Drops a leading `<think>…</think>` block (reasoning models served with thinking inside `content`)."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self):
        self._state = "start"  # start → (thinking →) pass
        self._buf = ""

    def feed(self, text: str) -> str:
        if self._state == "pass":
            return text
        self._buf += text
        if self._state == "start":
            s = self._buf.lstrip()
            if s.startswith(self.OPEN):
                self._state = "thinking"
                self._buf = s[len(self.OPEN):]
            elif self.OPEN.startswith(s):
                return ""  # could still be "<think>"
            else:
                self._state = "pass"
                out, self._buf = self._buf, ""
                return out
        # thinking
        idx = self._buf.find(self.CLOSE)
        if idx < 0:
            self._buf = self._buf[-len(self.CLOSE):]
            return ""
        self._state = "pass"
        out, self._buf = self._buf[idx + len(self.CLOSE):].lstrip(), ""
        return out

    def flush(self) -> str:
        out = self._buf if self._state == "start" else ""
        self._buf = ""
        return out


def _llm_context(llm: Any) -> dict:
    return {
        "timeout": getattr(llm, "timeout", None),
        "model": getattr(llm, "model", None),
        "api_base": getattr(llm, "api_base", None),
        "api_key": getattr(llm, "api_key", None),  # only used to scrub messages, never logged
    }


def stream_answer(question: str, nodes: Sequence[Any], llm: Any, temperature: float,
                  *, history: Sequence[dict] = (),
                  retrieval_query: str | None = None, picker: Any = None,
                  query_embedding: Any = None, max_tokens: int | None = None,
                  kb_ids: Sequence[int] | None = None) -> Generator[Event, None, GenerationResult]:
    """Yield delta events of the answer; return GenerationResult(text, cited).

    `nodes` are the reranked NodeWithScore list (material [n] = nodes[n-1]). `llm` None → extractive answer
    with the engine's `picker` (pipeline.generation.extractive.ExtractivePicker, built by pipeline.components over
    the tokenizer and the embedding model) and the retrieval query's `query_embedding`.
    No nodes → the standard no-answer text without calling the LLM. `history` (the last few turns) and the
    rewritten `retrieval_query` of a follow-up go into the prompt, apart from the materials. `max_tokens` caps
    the LLM's answer (a client of the OpenAI-compatible API may ask for it; None: the server's default).
    `kb_ids`: the knowledge bases the question searched (what an extractive answer says the KB holds or lacks;
    None: those of the sources).
    """
    nodes = list(nodes or [])
    if not nodes:
        yield delta(NO_ANSWER_TEXT)
        return GenerationResult(NO_ANSWER_TEXT, set())

    if llm is None:
        if picker is None:
            raise ValueError("an extractive answer needs the picker that pipeline.components builds")
        # the rewritten query carries the follow-up's topic (「那乙方呢」 alone matches no sentence)
        ex = extractive_deltas(retrieval_query or question, nodes, picker, query_embedding, kb_ids=kb_ids)
        for d in ex.deltas:
            yield delta(d)
        return GenerationResult("".join(ex.deltas), ex.cited, sorted(ex.cited), weak=ex.weak, not_found=ex.not_found)

    messages = build_messages(question, nodes, history=history, retrieval_query=retrieval_query)
    return (yield from watch_verdict(stream_llm(messages, llm, temperature, materials=len(nodes),
                                                max_tokens=max_tokens)))


def watch_verdict(answer: Generator[Event, None, GenerationResult]) -> Generator[Event, None, GenerationResult]:
    """An LLM answer's deltas with its 「资料不足」 verdict (verdict.py) taken out: a verdict first stops the
    stream (the model need not write on) before anything is shown; one at the end is reported with `shown`."""
    watch = VerdictWatch()
    shown = False
    try:
        while True:
            try:
                e = next(answer)
            except StopIteration as stop:
                result: GenerationResult = stop.value
                break
            out = watch.feed(e.data["text"])
            if watch.verdict:
                return GenerationResult("", set(), insufficient=True)
            if out:
                shown = True
                yield delta(out)
    finally:
        answer.close()  # a verdict first, or a consumer that hangs up: the LLM stream closes now
    tail = watch.flush()
    if watch.verdict:
        return GenerationResult("", set(), insufficient=True)
    if tail:
        shown = True
        yield delta(tail)
    if ends_with_verdict(result.text):
        return GenerationResult(result.text, result.cited, result.order, insufficient=True, shown=shown)
    result.shown = shown
    return result


def stream_llm(messages: list, llm: Any, temperature: float,
               *, materials: int = 0, max_tokens: int | None = None) -> Generator[Event, None, GenerationResult]:
    """Stream one chat call as delta events: citations beyond `materials` removed, a leading <think> dropped,
    every failure raised as LLMError (also used for the no-retrieval replies of the router's DIRECT route)."""
    guard = CitationGuard(materials)
    think = ThinkFilter()
    ctx = _llm_context(llm)
    parts: list[str] = []
    chunks = 0
    saw_openai_chunks = False
    finished = False
    stream = None
    tag = new_stream_tag() if supports_stream_tag(llm) else None
    kwargs: dict[str, Any] = {"temperature": temperature}
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if tag:
        kwargs["extra_headers"] = {STREAM_TAG_HEADER: tag}
    try:
        stream = llm.stream_chat(messages, **kwargs)
        for resp in stream:
            chunks += 1
            raw = getattr(resp, "raw", None)
            choices = getattr(raw, "choices", None)
            if choices is not None:
                saw_openai_chunks = True
                if any(getattr(c, "finish_reason", None) for c in choices):
                    finished = True
            out = guard.feed(think.feed(getattr(resp, "delta", None) or ""))
            if out:
                parts.append(out)
                yield delta(out)
    except GeneratorExit:
        raise
    except Exception as exc:  # noqa: BLE001 — every LLM failure becomes an LLMError
        err = map_llm_error(exc, mid_stream=chunks > 0, **ctx)
        logger.warning("LLM call failed [%s] after %d chunks: %s (%s)", err.kind, chunks, err.msg,
                       type(exc).__name__)
        raise err from exc
    finally:
        if tag:
            release_stream(tag)  # a consumer that hangs up stops the model now, not at the next GC
        close = getattr(stream, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001
                pass

    if saw_openai_chunks and not finished:
        # a close-delimited body that just stops looks like a normal end to openai; the spec's finish_reason
        # on the last chunk is the only sign the answer was complete
        err = LLMError("大模型输出中断：连接在回答结束前关闭（未收到结束标记）", KIND_INTERRUPTED)
        logger.warning("LLM stream ended without finish_reason after %d chunks", chunks)
        raise err

    tail = guard.feed(think.flush()) + guard.flush()
    if tail:
        parts.append(tail)
        yield delta(tail)
    text = "".join(parts)
    if not text.strip():
        raise LLMError("大模型返回了空回答，请检查模型是否正常或稍后重试", KIND_OTHER)
    if guard.removed:
        logger.info("removed %d invented citation(s): %s", len(guard.removed), guard.removed)
    return GenerationResult(text, set(guard.cited), list(guard.order))
