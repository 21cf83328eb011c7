"""The OpenAI-compatible API (`/v1`): any chat client or the `openai` SDK asks the knowledge base. Thin: every
answer is the engine's one answer event stream (pipeline/services/answering.py), as /api/qa/ask serves it.

- `GET /v1/models`: one model per knowledge base the caller may read, `kb-<kb_id>` (its name in
  `description`), and `kb-all` = every knowledge base the caller may read.
- `POST /v1/chat/completions`: the last user message is the question; earlier user/assistant turns are the
  conversation (the same follow-up rewrite as the page; nothing is stored); a client's `system` message is
  ignored (our answer rules stay). `temperature` / `max_tokens` go to the configured LLM; offline the answer is
  extractive as on the page. The text carries `[n]` exactly as on the page; structured sources travel as
  `citations` (non-stream: on the response and on the message; stream: on the final chunk before `[DONE]`), the
  outcome as `kbqa.outcome` = answer | weak | refuse. README "Connect other tools" documents the fields.
  An answer the LLM retracts at its end (the 「资料不足」 verdict, the stream's `replace` event): the non-stream
  response holds only the refusal; a stream cannot take back chunks a client already shows, so it appends a
  notice that the text above is void and the refusal, and the final chunk says `kbqa.retracted` with the whole
  answer in `kbqa.answer` for clients that can replace what they show.
  `kbqa_filter` (an extra body field; the SDK's `extra_body`): the document filter of api/doc_tags.py.
- Errors in OpenAI's shape `{"error": {"message", "type", "code", "param"}}`: 400, 401 (key), 403 (knowledge
  base not readable), 404 (unknown model), 429 (+ Retry-After), 502 (LLM failed), 503 (engine loading).
"""
from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from api.doc_tags import FILTER_DOC, DocFilterBody, as_filter
from api.sse import sse_frames
from pipeline import events as ev
from pipeline.access.callers import Caller
from pipeline.errors import (
    CODE_AUTH,
    CODE_ENGINE,
    CODE_FORBIDDEN,
    CODE_LLM,
    CODE_NO_DOC,
    CODE_RATE_LIMIT,
    CODE_VALIDATION,
    EngineError,
)
from pipeline.retrieval.gate import WEAK_BANNER
from pipeline.services.answering import Generation
from pipeline.services.audit_log import Actor

ALL_MODEL = "kb-all"
OWNER = "kbqa"
EXCERPT_CHARS = 500
WEAK_PREFIX = f"⚠️ {WEAK_BANNER}\n\n"  # the page's banner, as text a plain chat client shows

# engine / envelope code → (HTTP status, OpenAI error type, code)
ERRORS = {
    CODE_VALIDATION: (400, "invalid_request_error", "invalid_request"),
    CODE_AUTH: (401, "invalid_request_error", "invalid_api_key"),
    CODE_FORBIDDEN: (403, "permission_error", "knowledge_base_forbidden"),
    CODE_NO_DOC: (404, "invalid_request_error", "model_not_found"),
    CODE_RATE_LIMIT: (429, "rate_limit_error", "rate_limit_exceeded"),
    CODE_LLM: (502, "api_error", "llm_error"),
    CODE_ENGINE: (503, "server_error", "engine_unavailable"),
}


def is_v1(request: Request) -> bool:
    path = request.url.path
    return path == "/v1" or path.startswith("/v1/")


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def error_response(status: int, message: str, type_: str, code: str, *, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code, param), status_code=status, headers=headers)


def engine_error_response(code: int, msg: str, headers: dict | None = None) -> JSONResponse:
    status, type_, ocode = ERRORS.get(code, (400, "invalid_request_error", "invalid_request"))
    return error_response(status, msg, type_, ocode, headers=headers)


# --- request -------------------------------------------------------------------------------------------
class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls … are accepted and ignored
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones
            return "".join(str(p.get("text") or "") for p in self.content if p.get("type") in ("text", None))
        return self.content or ""


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # top_p, user, n … that other clients send are accepted, ignored
    model: str = Field(min_length=1, max_length=100)
    messages: list[ChatMessage] = Field(min_length=1, max_length=200)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32768)
    # not OpenAI's: the SDK sends it with extra_body={"kbqa_filter": {...}} (api/doc_tags.py)
    kbqa_filter: DocFilterBody | None = Field(None, description=FILTER_DOC)


def split_messages(messages: list[ChatMessage]) -> tuple[str, list[dict]]:
    """(question, history): the last message must be the user's; earlier user → assistant pairs are the turns
    (a user message without a reply is a turn with an empty answer). system / developer / tool messages are
    ignored: our answer rules are never replaced by a client's."""
    turns = [m for m in messages if m.role in ("user", "assistant")]
    if not turns or turns[-1].role != "user" or not turns[-1].text().strip():
        raise EngineError(CODE_VALIDATION, "messages 的最后一条必须是非空的 user 消息（即要问的问题）", "messages")
    history: list[dict] = []
    pending: str | None = None
    for m in turns[:-1]:
        if m.role == "user":
            if pending is not None:
                history.append({"question": pending, "answer": ""})
            pending = m.text()
        elif pending is not None:
            history.append({"question": pending, "answer": m.text()})
            pending = None
    if pending is not None:
        history.append({"question": pending, "answer": ""})
    return turns[-1].text(), history


# --- response pieces -----------------------------------------------------------------------------------
def citation(s: dict) -> dict:
    """One source as the `citations` field carries it (documented in README)."""
    text = s.get("text") or ""
    score = s.get("rerank_score") if s.get("rerank_score") is not None else s.get("similarity")
    return {"n": s.get("no"), "doc_id": s.get("doc_id"), "file_name": s.get("doc_name"), "page": s.get("page"),
            "chunk_id": s.get("chunk_id"), "kb_id": s.get("kb_id"), "kb_name": s.get("kb_name"),
            "text": text[:EXCERPT_CHARS] + ("…" if len(text) > EXCERPT_CHARS else ""), "score": score,
            "similarity": s.get("similarity"), "rerank_score": s.get("rerank_score"),
            "cited": bool(s.get("cited")), "verified": bool(s.get("verified"))}


def outcome(done: dict) -> Literal["answer", "weak", "refuse"]:
    if done.get("no_answer"):
        return "refuse"
    return "weak" if done.get("weak") else "answer"


def kbqa_info(done: dict, kb_ids: list[int], replaced: str | None = None) -> dict:
    """`replaced`: the answer that replaced the streamed text (a retraction), else None."""
    info = {"outcome": outcome(done), "mode": done.get("mode"), "route": done.get("route"),
            "rewritten_query": done.get("rewritten_query"), "elapsed_ms": done.get("elapsed_ms"), "kb_ids": kb_ids,
            "retracted": replaced is not None}
    if replaced is not None:
        info["answer"] = replaced
    return info


def retract_notice(reason: str) -> str:
    """What a stream appends when the text it sent is void (a chunk cannot be taken back)."""
    return f"\n\n---\n〔以上内容作废：{reason}〕\n\n"


def _created(kb: dict) -> int:
    try:
        return int(datetime.fromisoformat(str(kb.get("created_at"))).timestamp())
    except ValueError:
        return 0


def model_entry(model_id: str, description: str, created: int, kb: dict | None) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": OWNER, "description": description,
            "kbqa": {"kb_id": kb["kb_id"] if kb else None, "name": kb["name"] if kb else None,
                     "docs": kb.get("docs") if kb else None}}


def router(engine, caller_of) -> APIRouter:
    r = APIRouter(prefix="/v1", tags=["openai"])

    def models_of(caller: Caller) -> list[dict]:
        kbs = engine.list_kbs(caller.reader)
        out = [model_entry(ALL_MODEL, f"全部可访问的知识库（{len(kbs)} 个）：" + "、".join(k["name"] for k in kbs),
                           min((_created(k) for k in kbs), default=0), None)]
        out += [model_entry(f"kb-{k['kb_id']}", k["name"] + (f"：{k['description']}" if k.get("description") else ""),
                            _created(k), k) for k in kbs]
        return out

    def scope_of(model: str, caller: Caller) -> list[int]:
        """The knowledge bases a model id stands for: 404 unknown, 403 not readable by the caller."""
        if model == ALL_MODEL:
            ids = [k["kb_id"] for k in engine.list_kbs(caller.reader)]
            if not ids:
                raise EngineError(CODE_FORBIDDEN, "没有可以访问的知识库：请联系管理员开通")
            return ids
        num = model[3:] if model.startswith("kb-") else ""
        if not num.isdigit():
            raise EngineError(CODE_NO_DOC, f"模型不存在：{model}（可用的模型见 GET /v1/models）")
        try:
            return [engine.get_kb(int(num), caller.reader)["kb_id"]]
        except EngineError as exc:
            if exc.code == CODE_NO_DOC:
                raise EngineError(CODE_NO_DOC, f"模型不存在：{model}（知识库 {num} 不存在）") from None
            raise

    @r.get("/models")
    def list_models(caller: Caller = Depends(caller_of)):
        """Every knowledge base the caller may read as a model `kb-<id>`, and `kb-all`."""
        return {"object": "list", "data": models_of(caller)}

    @r.get("/models/{model_id}")
    def get_model(model_id: str, caller: Caller = Depends(caller_of)):
        for m in models_of(caller):
            if m["id"] == model_id:
                return m
        scope_of(model_id, caller)  # 403 for a knowledge base that exists but is not readable
        raise EngineError(CODE_NO_DOC, f"模型不存在：{model_id}")

    @r.post("/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request, caller: Caller = Depends(caller_of)):
        """OpenAI chat completions over the knowledge bases of `model` (stream or not), with `citations` and
        `kbqa` (outcome answer | weak | refuse) besides the OpenAI fields."""
        question, history = split_messages(body.messages)
        scope = await run_in_threadpool(scope_of, body.model, caller)
        gen = Generation(body.temperature, body.max_tokens or body.max_completion_tokens)
        events = engine.ask(question, user=caller.user, kb_ids=scope, reader=caller.reader, history=history,
                            generation=gen, actor=Actor(caller.label, "openai"),
                            doc_filter=as_filter(body.kbqa_filter))
        first = await run_in_threadpool(next, events, None)
        if first is not None and first.type is ev.EventType.ERROR:  # refused before anything was said
            events.close()
            raise EngineError(first.data["code"], first.data["msg"])
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            return StreamingResponse(sse_frames(_prepend(first, events), request,
                                                ChunkWriter(cid, created, body.model, scope)),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await run_in_threadpool(_complete, _prepend(first, events), cid, created, body.model, scope)

    return r


def _prepend(first, events):
    try:
        if first is not None:
            yield first
        yield from events
    finally:
        events.close()


class _Collector:
    """Folds answer events into the answer text (weak banner first), the sources and the done payload. `text` is
    the answer as it stands (a `replace` voids what came before); `replaced` the replacing answer, if any."""

    def __init__(self):
        self.sources: list[dict] = []
        self.done: dict = {}
        self.text = ""
        self.replaced: str | None = None

    def text_of(self, e) -> str | None:
        """The text this event adds to a stream ('' none); raises EngineError for an error event."""
        if e.type is ev.EventType.TRACE and (e.data.get("gate") or {}).get("weak"):
            self.text += WEAK_PREFIX
            return WEAK_PREFIX
        if e.type is ev.EventType.DELTA:
            self.text += e.data.get("text") or ""
            return e.data.get("text") or ""
        if e.type is ev.EventType.REPLACE:
            self.text = self.replaced = e.data.get("text") or ""
            return retract_notice(e.data.get("reason") or "") + self.replaced
        if e.type is ev.EventType.SOURCES:
            self.sources = e.data.get("sources") or []
        elif e.type is ev.EventType.DONE:
            self.done = e.data
        elif e.type is ev.EventType.ERROR:
            raise EngineError(e.data["code"], e.data["msg"])
        return ""


def _complete(events, cid: str, created: int, model: str, scope: list[int]) -> dict:
    col = _Collector()
    for e in events:
        col.text_of(e)
    cites = [citation(s) for s in col.sources]
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": col.text, "citations": cites},
                         "finish_reason": "stop"}],
            "citations": cites, "kbqa": kbqa_info(col.done, scope, col.replaced)}


class ChunkWriter:
    """Answer events → `chat.completion.chunk` SSE frames: the role first, one chunk per delta, the final chunk
    (finish_reason stop, `citations`, `kbqa`) and `data: [DONE]`; an error mid-stream as OpenAI's
    `data: {"error": …}` frame (the SDK raises APIError on it)."""

    def __init__(self, cid: str, created: int, model: str, scope: list[int]):
        self.cid, self.created, self.model, self.scope = cid, created, model, scope
        self.col = _Collector()
        self.started = False

    def _chunk(self, delta: dict, finish: str | None = None, **extra) -> str:
        payload = {"id": self.cid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def __call__(self, e) -> str:
        out = ""
        if not self.started:
            self.started = True
            out += self._chunk({"role": "assistant", "content": ""})
        try:
            text = self.col.text_of(e)
        except EngineError as exc:
            status, type_, code = ERRORS.get(exc.code, (500, "server_error", "internal_error"))
            return out + f"data: {json.dumps(error_body(exc.msg, type_, code), ensure_ascii=False)}\n\ndata: [DONE]\n\n"
        if text:
            out += self._chunk({"content": text})
        if e.type is ev.EventType.DONE:
            out += self._chunk({}, "stop", citations=[citation(s) for s in self.col.sources],
                               kbqa=kbqa_info(self.col.done, self.scope, self.col.replaced))
            out += "data: [DONE]\n\n"
        return out
