"""REST routes of chunks as first-class objects (pipeline/services/chunks.py), included by api/server.py.

Readers of the document's knowledge base may list and read chunks; editing, restoring, switching off / on and
adding a chunk need a KB admin whose reach covers that knowledge base (a key bound to other knowledge bases gets
4003). The caller is resolved once per request by the server's `caller_of`, as on every other /api route.
"""
from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from api.envelope import Body, ok, require
from pipeline.access.callers import Caller
from pipeline.access.policy import Role
from pipeline.services.audit_log import Actor
from pipeline.services.chunks import MAX_CHUNK_CHARS, MAX_CONTEXT_CHARS


class ChunkText(Body):
    text: str = Field(..., min_length=1, max_length=MAX_CHUNK_CHARS, description="the chunk's new text")


class ChunkEnabled(Body):
    enabled: bool = Field(..., description="false: out of both retrieval routes and of citations; true: back")


class ChunkNew(Body):
    doc_id: int = Field(..., ge=1)
    text: str = Field(..., min_length=1, max_length=MAX_CHUNK_CHARS)
    context: str | None = Field(None, max_length=MAX_CONTEXT_CHARS, description="heading path shown with it")


class DocRef(Body):
    doc_id: int = Field(..., ge=1)


def router(engine, caller_of) -> APIRouter:
    r = APIRouter(prefix="/api/kb/chunks", tags=["chunks"])

    def kb_admin(caller: Caller = Depends(caller_of)) -> Caller:
        return require(caller, Role.KB_ADMIN)

    def actor(caller: Caller) -> Actor:
        return Actor(caller.label, "rest")

    @r.get("")
    def list_chunks(doc_id: int = Query(..., ge=1), caller: Caller = Depends(caller_of)):
        """Every chunk of a document: text, context, length, enabled, edited (by / at, the parsed original), manual."""
        return ok(engine.list_chunks(doc_id, caller.reader))

    @r.post("/reparse")
    def reparse(body: DocRef, caller: Caller = Depends(kb_admin)):
        """Discard every chunk edit of the document: its original is parsed again (处理中 until done)."""
        return ok(engine.reparse_document(body.doc_id, actor(caller), caller.reader))

    @r.get("/{chunk_id}")
    def get_chunk(chunk_id: int, caller: Caller = Depends(caller_of)):
        return ok(engine.get_chunk(chunk_id, caller.reader))

    @r.put("/{chunk_id}")
    def edit_chunk(chunk_id: int, body: ChunkText, caller: Caller = Depends(kb_admin)):
        """New text: re-tokenized and re-embedded before the answer; the parsed original is kept (restore)."""
        return ok(engine.edit_chunk(chunk_id, body.text, actor(caller), caller.reader))

    @r.post("/{chunk_id}/restore")
    def restore_chunk(chunk_id: int, caller: Caller = Depends(kb_admin)):
        """The parsed original text back."""
        return ok(engine.restore_chunk(chunk_id, actor(caller), caller.reader))

    @r.put("/{chunk_id}/enabled")
    def set_enabled(chunk_id: int, body: ChunkEnabled, caller: Caller = Depends(kb_admin)):
        """Switch a chunk off (never retrieved nor cited, in every process) or on again."""
        return ok(engine.set_chunk_enabled(chunk_id, body.enabled, actor(caller), caller.reader))

    @r.post("")
    def add_chunk(body: ChunkNew, caller: Caller = Depends(kb_admin)):
        """A chunk written by hand, appended to the document; searchable when this answers."""
        return ok(engine.add_chunk(body.doc_id, body.text, body.context, actor(caller), caller.reader))

    return r
