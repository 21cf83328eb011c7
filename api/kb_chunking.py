"""REST for a knowledge base's chunking and the upload preview (KB admins only):

    GET  /api/kbs/{kb_id}/chunking   what the KB's ingest uses, its own values, the global defaults, field bounds
    PUT  /api/kbs/{kb_id}/chunking   {"chunk_size": 200, "chunk_overlap": null, …, "rebuild": true}
                                     (null = follow the global setting; rebuild = re-chunk this KB only, now)
    POST /api/kbs/{kb_id}/preview    multipart `file` (+ optional form fields chunk_size / chunk_overlap /
                                     chunk_structure to try values unsaved) → the chunks, nothing stored

Values are validated by the settings' own Field declarations (pipeline/ingestion/kb_chunking.py), not here.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi import Path as PathParam
from starlette.concurrency import run_in_threadpool

from api.envelope import ok, require, save_upload
from pipeline.access.callers import Caller
from pipeline.access.policy import Role
from pipeline.errors import CODE_VALIDATION, EngineError
from pipeline.ingestion.parsing import MAX_FILE_BYTES
from pipeline.services.audit_log import Actor


def router(engine, caller_of) -> APIRouter:
    r = APIRouter(prefix="/api/kbs", tags=["kb"])

    def kb_admin(caller: Caller = Depends(caller_of)) -> Actor:
        return Actor(require(caller, Role.KB_ADMIN).label, "rest")

    @r.get("/{kb_id}/chunking")
    def get_chunking(kb_id: int = PathParam(ge=1), _: Actor = Depends(kb_admin)):
        return ok(engine.kb_chunking(kb_id))

    @r.put("/{kb_id}/chunking")
    def put_chunking(payload: dict[str, Any], kb_id: int = PathParam(ge=1), actor: Actor = Depends(kb_admin)):
        """Change this KB's chunking; the answer says whether its documents need a rebuild (`need_rebuild`), or
        carries the rebuild's status when `"rebuild": true` started it (this knowledge base only)."""
        rebuild = payload.pop("rebuild", False)
        if not isinstance(rebuild, bool):
            raise EngineError(CODE_VALIDATION, "rebuild 必须是 true/false", "rebuild")
        return ok(engine.update_kb_chunking(kb_id, payload, rebuild=rebuild, actor=actor))

    @r.post("/{kb_id}/preview")
    async def preview(file: UploadFile = File(...), kb_id: int = PathParam(ge=1),
                      chunk_size: int | None = Form(None), chunk_overlap: int | None = Form(None),
                      chunk_structure: bool | None = Form(None), _: Actor = Depends(kb_admin)):
        """How the file would be cut in this knowledge base (its chunking, or the form's values tried unsaved):
        the chunks with text, context, length and page. Nothing is stored."""
        engine.get_kb(kb_id)  # 3002 before reading the file
        tmpdir = Path(tempfile.mkdtemp(prefix="kbqa-preview-"))
        try:
            dest = tmpdir / "upload.bin"
            if not await save_upload(file, dest, MAX_FILE_BYTES):
                raise EngineError(CODE_VALIDATION, f"文件超过 {MAX_FILE_BYTES // (1024 * 1024)} MB", "file")
            tried = {k: v for k, v in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap),
                                       ("chunk_structure", chunk_structure)) if v is not None}
            return ok(await run_in_threadpool(engine.preview_upload, kb_id, file.filename or "未命名", dest,
                                               tried or None))
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    return r
