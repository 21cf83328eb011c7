"""REST for document tags and metadata, and the filter body every question door accepts.

GET/PUT /api/kb/documents/{doc_id}/tags, GET /api/kb/tags (the tags in use). The filter (`DocFilterBody`) is the
`filter` field of /api/kb/search and /api/qa/ask(/sync), the `kbqa_filter` extra field of /v1, and the MCP tools'
`filter` argument; it is applied inside both retrieval routes (pipeline/retrieval/doc_filter.py).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from api.envelope import Body, ok
from pipeline.access.kb_readers import Reader
from pipeline.errors import CODE_VALIDATION, EngineError
from pipeline.services.audit_log import Actor

FILTER_DOC = ("only documents matching it: tags_any (one of these tags), tags_all (every one), metadata "
              "(key = value; file_type / version / pages / file_name are the document's own), date_from / date_to "
              "(upload date YYYY-MM-DD, inclusive); applied inside both retrieval routes before fusion")


class DocFilterBody(Body):
    tags_any: list[str] | None = Field(None, max_length=50, description="at least one of these tags")
    tags_all: list[str] | None = Field(None, max_length=50, description="every one of these tags")
    metadata: dict[str, str | int | float] | None = Field(None, description="key = value, each must hold")
    date_from: str | None = Field(None, max_length=10, description="upload date from (YYYY-MM-DD, inclusive)")
    date_to: str | None = Field(None, max_length=10, description="upload date to (YYYY-MM-DD, inclusive)")

    def as_filter(self) -> dict:
        return self.model_dump(exclude_none=True)


class TagsBody(Body):
    tags: list[str] | None = Field(None, max_length=50, description="replaces the tags (omit: unchanged)")
    metadata: dict[str, str | int | float] | None = Field(
        None, description="replaces the key-value metadata (omit: unchanged; e.g. source = folder or URL)")


def as_filter(body: DocFilterBody | None) -> dict | None:
    return body.as_filter() if body is not None else None


def upload_metadata(text: str | None) -> dict | None:
    """The upload form's `metadata` field: JSON {key: value} (empty: none)."""
    if not text or not text.strip():
        return None
    try:
        meta = json.loads(text)
    except ValueError:
        raise EngineError(CODE_VALIDATION, 'metadata 必须是 JSON 对象，例如 {"source": "…"}', "metadata") from None
    if not isinstance(meta, dict):
        raise EngineError(CODE_VALIDATION, 'metadata 必须是 JSON 对象，例如 {"source": "…"}', "metadata")
    return meta


def router(engine, reader_of: Callable[..., Reader], kb_admin_user: Callable[..., Any],
           rest_actor: Callable[..., Actor]) -> APIRouter:
    r = APIRouter()

    @r.get("/api/kb/documents/{doc_id}/tags", tags=["kb"])
    def get_tags(doc_id: int, reader: Reader = Depends(reader_of)):
        """{doc_id, tags, metadata, auto}: the tags and metadata set by KB admins, and the automatic metadata
        (file_type, version, pages, uploaded)."""
        return ok(engine.document_tags(doc_id, reader))

    @r.put("/api/kb/documents/{doc_id}/tags", tags=["kb"])
    def put_tags(doc_id: int, body: TagsBody, _: str | None = Depends(kb_admin_user),
                 actor: Actor = Depends(rest_actor)):
        """Replace a document's tags and / or metadata (recorded in the audit log); the next question's filter
        sees the change."""
        return ok(engine.set_document_tags(doc_id, body.tags, body.metadata, actor=actor))

    @r.get("/api/kb/tags", tags=["kb"])
    def list_tags(kb_ids: list[int] | None = Query(None, description="knowledge bases (default: all readable)"),
                  reader: Reader = Depends(reader_of)):
        """[{tag, docs}]: the tags in use and how many documents carry each."""
        return ok(engine.list_tags(kb_ids, reader))

    return r
