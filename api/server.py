"""REST API and SSE (SRS §7) over the engine. No logic lives here: every endpoint calls the engine.

Envelope: {"code": 0, "msg": "ok", "data": ...}. Non-zero codes: 1001 validation, 2001 LLM failure,
2002 engine not loaded / reloading / busy, 3001 parse failure, 3002 no such document. The HTTP status mirrors
the class of error (400 / 502 / 503 / 422 / 404) so generic clients see failures too; the body is always
the envelope, never a stack trace.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import chunks, doc_tags, kb_chunking, openai_compat, security_headers, sources
from api.auth_first import AuthBeforeBody
from api.body_limit import BodyLimit
from api.doc_tags import FILTER_DOC, DocFilterBody, as_filter, upload_metadata
from api.envelope import Body, ok, require, save_upload
from api.int_range import IntRange
from api.mcp_server import CallerRefused, mount_mcp
from api.sse import sse_frames
from pipeline.access.callers import Caller, CallerResolver
from pipeline.access.policy import AccessPolicy, Reader, Role
from pipeline.engine import Engine
from pipeline.errors import (
    CODE_AUTH,
    CODE_ENGINE,
    CODE_FORBIDDEN,
    CODE_LLM,
    CODE_NO_DOC,
    CODE_PARSE,
    CODE_RATE_LIMIT,
    CODE_VALIDATION,
    EngineError,
    RateLimited,
)
from pipeline.ingestion.parsing import MAX_BATCH_FILES, MAX_FILE_BYTES
from pipeline.retrieval.kb_indexes import DEFAULT_KB_ID
from pipeline.services.audit_log import Actor
from pipeline.settings import SettingsError

log = logging.getLogger(__name__)

MEDIA_TYPES = {"txt": "text/plain", "md": "text/markdown", "csv": "text/csv",  # encodings vary: no charset
               "pdf": "application/pdf",
               "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
               "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"}
HTTP_STATUS = {CODE_VALIDATION: 400, CODE_LLM: 502, CODE_ENGINE: 503, CODE_PARSE: 422, CODE_NO_DOC: 404,
               CODE_AUTH: 401, CODE_FORBIDDEN: 403, CODE_RATE_LIMIT: 429}


def fail(code: int, msg: str, data: Any = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "msg": msg, "data": data}, status_code=HTTP_STATUS.get(code, 400),
                        headers=headers)


def api_error_response(request: Request, exc: ApiError) -> JSONResponse:
    """An ApiError in the shape of the door it came through: OpenAI's on /v1, the envelope on /api and /mcp."""
    if openai_compat.is_v1(request):
        return openai_compat.engine_error_response(exc.code, exc.msg, exc.headers)
    realm = 'Basic realm="kbqa", Bearer' if request.url.path.startswith("/mcp") else 'Basic realm="kbqa"'
    auth = {"WWW-Authenticate": realm} if exc.code == CODE_AUTH else {}
    return fail(exc.code, exc.msg, exc.data, {**auth, **(exc.headers or {})} or None)


class ApiError(Exception):
    def __init__(self, code: int, msg: str, data: Any = None, headers: dict | None = None):
        self.code, self.msg, self.data, self.headers = code, msg, data, headers


def error_headers(exc: EngineError) -> dict | None:
    if isinstance(exc, RateLimited):
        return {"Retry-After": str(exc.retry_after)}
    return None


# --- request bodies (extra keys refused so typos are reported, not ignored) ----------------------------
class KBScope(BaseModel):
    """Which knowledge bases to search: `kb_id` (one) or `kb_ids` (several); neither = the default one."""
    kb_id: int | None = Field(None, ge=1)
    kb_ids: list[int] | None = Field(None, max_length=100)
    filter: DocFilterBody | None = Field(None, description=FILTER_DOC)

    def doc_filter(self) -> dict | None:
        return as_filter(self.filter)

    def scope(self) -> list[int] | None:
        ids = list(self.kb_ids or []) + ([self.kb_id] if self.kb_id is not None else [])
        return ids or None


class SearchBody(KBScope):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=2000)
    top_k: int = Field(10, ge=1, le=50)


class AskBody(KBScope):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=2000)
    retry: bool = False
    conversation_id: str | None = Field(None, description="omit to start a conversation; its id is in done")
    use_kb: bool = Field(True, description="false: talk to the LLM without the knowledge base (route DIRECT)")


class FeedbackBody(Body):
    turn_id: int
    rating: str = Field(description="up | down")
    reason: str | None = Field(None, description="👎 only: 不准确 / 引用错误 / 没回答 / 其他")
    comment: str | None = Field(None, max_length=500)


class VerifiedBody(Body):
    question: str = Field(min_length=1, max_length=500)
    answer: str = Field(min_length=1, max_length=4000)
    feedback_id: int | None = Field(None, ge=1, le=2**63 - 1, description="the feedback item (and so the answer) it comes from")
    kb_id: int | None = Field(None, ge=1, description="where to store it (default: the knowledge base of its "
                                                       "sources; refused where that would widen who reads them)")


class RenameBody(Body):
    title: str = Field(min_length=1, max_length=100)


class BackupBody(Body):
    dest: str = Field(min_length=1, max_length=1000, description="absolute path on the app's machine; new or empty")


READERS_DOC = "user names who may read it (KB admins always may); null = every logged-in user"


class KBCreate(Body):
    name: str = Field(min_length=1, max_length=50)
    description: str = Field("", max_length=500)
    readers: list[str] | None = Field(None, max_length=200, description=READERS_DOC)


class KBUpdate(Body):
    name: str | None = Field(None, min_length=1, max_length=50)
    description: str | None = Field(None, max_length=500)
    readers: list[str] | None = Field(None, max_length=200, description=READERS_DOC + " (omit: unchanged)")


class KeyCreate(Body):
    name: str = Field(min_length=1, max_length=50)
    role: str = Field("reader", description="reader | kb-admin | admin")
    kb_ids: list[int] | None = Field(None, max_length=200, description="knowledge bases it may read; null = all "
                                                                         "its role may read")
    expires_at: str | None = Field(None, description="ISO 8601 time it stops working; null = never")
    expires_in_days: float | None = Field(None, gt=0, le=3650)
    rate_limit: int | None = Field(None, ge=0, le=100000, description="requests per minute; null = the setting "
                                                                       "api_rate_limit_per_min; 0 = no limit")


class Envelope(BaseModel):
    code: int = 0
    msg: str = "ok"
    data: Any = None


def create_api(engine: Engine, policy: AccessPolicy | None = None, bind_host: str = "127.0.0.1") -> FastAPI:
    policy = policy or AccessPolicy()
    app = FastAPI(
        title="中文知识库问答 API",
        version="1.0",
        description="SRS §7 interface. All responses use the envelope {code, msg, data}. With --auth, send "
                    "HTTP Basic credentials of an app user, or an API key (Authorization: Bearer kbqa-…). "
                    "/v1: the OpenAI-compatible API (OpenAI's error shape).",
    )
    callers = CallerResolver(policy, engine.api_keys, engine.rate_limits, engine.login_throttle)
    security_headers.install(app)  # CSP, nosniff, frame-ancestors, Referrer-Policy on the API and the page
    app.add_middleware(BodyLimit)  # body-size limits per route class, before anything reads a body (issue 27)
    app.add_middleware(IntRange, api=app)  # ids / page numbers ≥ 2^63 in paths and queries: 3002 / 1001, not 500

    # --- errors → envelope --------------------------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
        field = ".".join(loc) or "body"
        if first.get("type") == "json_invalid":
            msg = "请求体不是合法的 JSON"
            field = "body"
        else:
            msg = f"参数 {field} 无效：{first.get('msg', '')}"
        if openai_compat.is_v1(request):
            return openai_compat.error_response(400, msg, "invalid_request_error", "invalid_request", param=field)
        return fail(CODE_VALIDATION, msg, {"field": field, "errors": [
            {"field": ".".join(str(x) for x in e.get("loc", ())), "msg": e.get("msg")} for e in errs]})

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return api_error_response(request, exc)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError):
        if openai_compat.is_v1(request):
            return openai_compat.engine_error_response(exc.code, exc.msg, error_headers(exc))
        return fail(exc.code, exc.msg, {"field": exc.field} if exc.field else None, error_headers(exc))

    @app.exception_handler(SettingsError)
    async def _settings_error(_: Request, exc: SettingsError):
        field = next(iter(exc.errors), None)
        return fail(CODE_VALIDATION, str(exc), {"field": field, "errors": exc.errors})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if openai_compat.is_v1(request):
            return openai_compat.error_response(exc.status_code, str(exc.detail), "invalid_request_error",
                                                "not_found" if exc.status_code == 404 else "invalid_request")
        code = CODE_NO_DOC if exc.status_code == 404 else CODE_VALIDATION
        return JSONResponse({"code": code, "msg": str(exc.detail), "data": None}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled API error")
        if openai_compat.is_v1(request):
            return openai_compat.error_response(500, f"内部错误：{type(exc).__name__}", "server_error", "internal_error")
        return JSONResponse({"code": CODE_ENGINE, "msg": f"内部错误：{type(exc).__name__}", "data": None},
                            status_code=500)

    # --- auth: one resolution per request (pipeline/access/callers.py), cached by FastAPI for the request ----
    def caller_of(request: Request) -> Caller:
        resolved = getattr(request.state, "caller", None)
        if resolved is not None:  # AuthBeforeBody resolved it before the body was read
            return resolved
        try:
            # /v1 and /mcp (the doors of other tools) are open only while no usable key exists
            caller = callers.resolve(request.headers.get("authorization"),
                                     key_required_if_any=openai_compat.is_v1(request)
                                     or request.url.path.startswith("/mcp"),
                                     address=request.client.host if request.client else None)
        except EngineError as exc:
            raise ApiError(exc.code, exc.msg, headers=error_headers(exc)) from None
        request.state.caller = caller  # for whatever looks at the request afterwards (logs, audit)
        return caller

    def current_user(caller: Caller = Depends(caller_of)) -> str | None:
        return caller.user

    def rest_actor(caller: Caller = Depends(caller_of)) -> Actor:
        """Who acts, for the audit log: the user, key:<name>, or 本机."""
        return Actor(caller.label, "rest")

    def role_user(role: Role):
        def dependency(caller: Caller = Depends(caller_of)) -> str | None:
            return require(caller, role).user
        return dependency

    admin_user = role_user(Role.ADMIN)
    kb_admin_user = role_user(Role.KB_ADMIN)

    def reader_of(caller: Caller = Depends(caller_of)) -> Reader:
        """Who reads (per-KB readers, a key's knowledge bases: a knowledge base they may not read answers 4003)."""
        return caller.reader

    def check_readers(readers: list[str] | None) -> None:
        unknown = policy.unknown_users(readers)
        if unknown:
            raise ApiError(CODE_VALIDATION, f"readers 中有不存在的用户：{', '.join(unknown)}", {"field": "readers"})

    # --- config -------------------------------------------------------------------------------
    @app.get("/api/config", response_model=Envelope, tags=["config"])
    def get_config(_: str | None = Depends(admin_user)):
        """All settings grouped (llm, retrieval, chunking, models, ocr); the API key masked."""
        return ok(engine.settings.grouped(mask=True))

    @app.put("/api/config", response_model=Envelope, tags=["config"])
    def put_config(payload: dict[str, Any], _: str | None = Depends(admin_user),
                   actor: Actor = Depends(rest_actor)):
        """Partial update in the grouped shape. Keys not sent and masked secrets stay unchanged. Reply lists
        `immediate` (took effect now), `need_reload` (重载引擎) and `need_rebuild` (全量重建 for old docs)."""
        return ok(engine.update_settings(payload, actor=actor))

    @app.post("/api/config/test-llm", response_model=Envelope, tags=["config"])
    def test_llm(payload: dict[str, Any] | None = None, _: str | None = Depends(admin_user)):
        """Test LLM connectivity with the body's (unsaved) llm settings; omitted values use the saved ones."""
        return ok(engine.test_llm(payload or {}))

    @app.post("/api/config/reload", response_model=Envelope, tags=["config"])
    def reload(_: str | None = Depends(admin_user),
               actor: Actor = Depends(rest_actor)):
        """Reload models and indexes (blocking). Questions get 2002 meanwhile."""
        ms = engine.reload(actor=actor)
        return ok({"elapsed_ms": round(ms)})

    # --- API keys (admins) ----------------------------------------------------------------------
    @app.post("/api/keys", response_model=Envelope, tags=["keys"])
    def create_key(body: KeyCreate, caller: Caller = Depends(caller_of), _: str | None = Depends(admin_user)):
        """Create an API key. The reply's `secret` (kbqa-…) is shown this once; only its hash is stored."""
        return ok(engine.create_api_key(body.name, body.role, body.kb_ids, expires_at=body.expires_at,
                                        expires_in_days=body.expires_in_days, rate_limit=body.rate_limit,
                                        created_by=caller.label if caller.kind == "key" else caller.user,
                                        actor=Actor(caller.label, "rest")))

    @app.get("/api/keys", response_model=Envelope, tags=["keys"])
    def list_keys(_: str | None = Depends(admin_user)):
        """Every key: key_id, name, role, kb_ids, prefix, rate_limit, expires_at, created_by, created_at,
        last_used_at, revoked, active — never the secret."""
        return ok(engine.list_api_keys())

    @app.delete("/api/keys/{key_id}", response_model=Envelope, tags=["keys"])
    def revoke_key(key_id: int, _: str | None = Depends(admin_user), actor: Actor = Depends(rest_actor)):
        """Revoke a key: every process refuses it from the next request on."""
        return ok(engine.revoke_api_key(key_id, actor=actor))

    # --- knowledge bases ----------------------------------------------------------------------
    @app.get("/api/kbs", response_model=Envelope, tags=["kbs"])
    def list_kbs(reader: Reader = Depends(reader_of)):
        """The knowledge bases the caller may read: kb_id, name, description, created_at, docs, chunks,
        is_default, readers (null = every logged-in user)."""
        return ok(engine.list_kbs(reader))

    @app.post("/api/kbs", response_model=Envelope, tags=["kbs"])
    def create_kb(body: KBCreate, _: str | None = Depends(kb_admin_user),
                  actor: Actor = Depends(rest_actor)):
        """Create a knowledge base (its own vector collection and BM25 index). Names are unique; `readers`
        restricts who may read it."""
        check_readers(body.readers)
        return ok(engine.create_kb(body.name, body.description, body.readers, actor=actor))

    @app.get("/api/kbs/{kb_id}", response_model=Envelope, tags=["kbs"])
    def get_kb(kb_id: int, reader: Reader = Depends(reader_of)):
        return ok(engine.get_kb(kb_id, reader))

    @app.put("/api/kbs/{kb_id}", response_model=Envelope, tags=["kbs"])
    def update_kb(kb_id: int, body: KBUpdate, _: str | None = Depends(kb_admin_user),
                  actor: Actor = Depends(rest_actor)):
        """Rename and/or re-describe a knowledge base; `readers` (when sent) sets who may read it, null opens it."""
        readers = body.readers if "readers" in body.model_fields_set else ...
        if readers is not ...:
            check_readers(readers)
        return ok(engine.update_kb(kb_id, body.name, body.description, readers, actor=actor))

    @app.delete("/api/kbs/{kb_id}", response_model=Envelope, tags=["kbs"])
    def delete_kb(kb_id: int, confirm: bool = Query(False, description="must be true"),
                  _: str | None = Depends(kb_admin_user), actor: Actor = Depends(rest_actor)):
        """Delete a knowledge base with all its documents, versions, vectors, BM25 entries and files
        (`?confirm=true` required). The default knowledge base cannot be deleted."""
        if not confirm:
            raise ApiError(CODE_VALIDATION, "删除知识库会同时删除其中全部文档，请确认后带 confirm=true 重试",
                           {"field": "confirm"})
        return ok(engine.delete_kb(kb_id, actor=actor))

    # --- knowledge base -----------------------------------------------------------------------
    @app.post("/api/kb/documents", response_model=Envelope, tags=["kb"])
    async def upload(file: list[UploadFile] = File(..., description="repeatable"),
                     kb_id: int | None = Query(None, ge=1, description="knowledge base (default: the default one)"),
                     kb_id_form: int | None = Form(None, alias="kb_id", ge=1),
                     tags: str | None = Form(None, max_length=3000, description="comma-separated tags for every file"),
                     metadata: str | None = Form(None, max_length=30000, description='JSON {"key": "value"}'),
                     _: str | None = Depends(kb_admin_user), actor: Actor = Depends(rest_actor)):
        """Upload up to 10 files (txt/md/pdf/docx/xlsx/csv, ≤ 20 MB each) into a knowledge base (`kb_id` as a
        query parameter or form field). Returns one record per file: status processing (a file named like an
        active document with other content becomes its next version), 已存在 (same content in this knowledge
        base), or refused with the reason. `tags` / `metadata` (form fields) go onto every new document; a new
        version keeps those of the version it replaces."""
        target = kb_id or kb_id_form or DEFAULT_KB_ID
        engine.get_kb(target)  # 3002 before reading the files
        meta = upload_metadata(metadata)
        tmpdir = Path(tempfile.mkdtemp(prefix="kbqa-up-"))
        try:
            items, refused = [], []
            for i, f in enumerate(file):
                name = f.filename or "未命名"
                if i >= MAX_BATCH_FILES:
                    refused.append({"file_name": name, "ok": False, "status": "refused",
                                    "msg": f"单次最多上传 {MAX_BATCH_FILES} 个文件，本文件未处理"})
                    continue
                dest = tmpdir / f"{i}.bin"
                if not await save_upload(f, dest, MAX_FILE_BYTES):
                    refused.append({"file_name": name, "ok": False, "status": "refused",
                                    "msg": f"文件超过 {MAX_FILE_BYTES // (1024 * 1024)} MB"})
                    continue
                items.append((name, dest))
            results = (await run_in_threadpool(engine.upload, items, target, tags, meta, actor) if items else [])
            return ok([r.to_dict() for r in results] + refused)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)

    @app.get("/api/kb/documents", response_model=Envelope, tags=["kb"])
    def list_documents(page: int = Query(1, ge=1), size: int = Query(20, ge=1, le=200),
                       keyword: str = Query("", max_length=200), kb_id: int = Query(DEFAULT_KB_ID, ge=1),
                       reader: Reader = Depends(reader_of)):
        """Paged document list of a knowledge base with chunk counts, status, failure reason, version and
        progress: `stage` (queued/parse/ocr/chunk/embed/write), `stage_label`, `done`, `total`, `position`
        (place in the queue), `eta_s`."""
        return ok(engine.list_documents(page, size, keyword, kb_id, reader))

    @app.get("/api/kb/documents/{doc_id}/chunks", response_model=Envelope, tags=["kb"])
    def document_chunks(doc_id: int, reader: Reader = Depends(reader_of)):
        """Chunk index + text of one document."""
        return ok(engine.document_chunks(doc_id, reader))

    @app.get("/api/kb/documents/{doc_id}/text", response_model=Envelope, tags=["kb"])
    def document_text(doc_id: int, part: int | None = Query(None, ge=1, description="1-based part"),
                      chunk_id: int | None = Query(None, ge=1, description="the part holding this chunk"),
                      reader: Reader = Depends(reader_of)):
        """The document's parsed text, one part at a time (a PDF page / sheet, long texts cut into ≤ 20,000
        characters): {text, part, parts, page, source (text|ocr), context, chunks: [{chunk_id, start, end}],
        highlight, version, active, kb_name}. With `chunk_id`: the part that holds it, to highlight."""
        return ok(engine.document_text(doc_id, part, chunk_id, reader))

    @app.get("/api/kb/documents/{doc_id}/file", tags=["kb"], response_class=FileResponse,
             responses={200: {"content": {"application/octet-stream": {}}}})
    def document_file(doc_id: int, reader: Reader = Depends(reader_of)):
        """The uploaded original (download; needs a login when logins are on)."""
        path, name = engine.document_file(doc_id, reader)
        return FileResponse(path, filename=name, media_type=MEDIA_TYPES.get(path.suffix.lstrip("."),
                                                                           "application/octet-stream"))

    @app.get("/api/kb/documents/{doc_id}/page", tags=["kb"], response_class=Response,
             responses={200: {"content": {"image/jpeg": {}}}})
    def document_page(doc_id: int, page: int = Query(1, ge=1), chunk_id: int | None = Query(None, ge=1),
                      reader: Reader = Depends(reader_of)):
        """A PDF page as JPEG; with `chunk_id` its page, the passage boxed where the text layer allows (header
        X-Passage-Boxed: 1 / 0)."""
        data, boxed = engine.page_image(doc_id, page, chunk_id, reader)
        return Response(data, media_type="image/jpeg", headers={"X-Passage-Boxed": "1" if boxed else "0"})

    @app.get("/api/kb/documents/{doc_id}/versions", response_model=Envelope, tags=["kb"])
    def document_versions(doc_id: int, reader: Reader = Depends(reader_of)):
        """Every version of the document, newest first: version, active, status, created_at."""
        return ok(engine.document_versions(doc_id, reader))

    @app.post("/api/kb/documents/{doc_id}/restore", response_model=Envelope, tags=["kb"])
    def restore_version(doc_id: int, _: str | None = Depends(kb_admin_user)):
        """Make this old version the active one (the current one becomes inactive)."""
        return ok(engine.restore_version(doc_id))

    @app.delete("/api/kb/documents/{doc_id}", response_model=Envelope, tags=["kb"])
    def delete_document(doc_id: int, _: str | None = Depends(kb_admin_user),
                        actor: Actor = Depends(rest_actor)):
        """Delete the document, its chunks, its vectors, its BM25 entries and its stored file. The active version
        deletes the whole document (all versions); an old or failed version deletes only itself."""
        return ok(engine.delete_document(doc_id, actor=actor))

    @app.post("/api/kb/rebuild", response_model=Envelope, tags=["kb"])
    def rebuild(kb_id: int | None = Query(None, ge=1, description="one knowledge base (default: all)"),
                _: str | None = Depends(kb_admin_user)):
        """Start a full rebuild with the current chunk params (refused while one runs) of all knowledge bases
        or of `kb_id`. Poll GET."""
        return ok(engine.start_rebuild(kb_id))

    @app.get("/api/kb/rebuild", response_model=Envelope, tags=["kb"])
    def rebuild_status(reader: Reader = Depends(reader_of)):
        """Progress of the running/last full rebuild: running, done, total (documents), eta_s, current,
        current_stage, elapsed_ms."""
        return ok(engine.rebuild_status(reader))

    @app.get("/api/kb/audit", response_model=Envelope, tags=["kb"])
    def audit(quick: bool = Query(False, description="skip re-tokenizing every chunk"),
              _: str | None = Depends(kb_admin_user)):
        """Read-only consistency report: files vs documents, chunks vs vectors and BM25 tokens, stuck documents,
        embedding model. `problems` 0 means consistent; each finding says whether repair can fix it."""
        return ok(engine.audit(check_tokens=not quick))

    @app.post("/api/kb/repair", response_model=Envelope, tags=["kb"])
    def repair(_: str | None = Depends(admin_user)):
        """Repair derived state only (vectors, tokens, BM25, stuck jobs, unreferenced files); never an original.
        Returns the actions taken and the audit after them (requeued documents show as 处理中)."""
        return ok(engine.repair())

    @app.post("/api/kb/backup", response_model=Envelope, tags=["kb"])
    def backup(body: BackupBody, _: str | None = Depends(admin_user)):
        """Consistent backup of the live data dir into `dest` (writes pause for the copy, questions go on).
        Returns the manifest (counts, sha256 per file). Restore offline: python -m tools.ops.restore."""
        return ok(engine.backup(body.dest))

    @app.post("/api/kb/search", response_model=Envelope, tags=["kb"])
    def search(body: SearchBody, reader: Reader = Depends(reader_of)):
        """Dual-route debug search: {bm25, vector, fused}, and `rrf` = the fused list under SRS §7.2's name
        (whatever the fusion mode)."""
        found = engine.search(body.query, body.top_k, body.scope(), reader, doc_filter=body.doc_filter())
        return ok(found | {"rrf": found["fused"]})

    # --- question answering -------------------------------------------------------------------
    @app.post("/api/qa/ask/sync", response_model=Envelope, tags=["qa"])
    def ask_sync(body: AskBody, caller: Caller = Depends(caller_of)):
        """{answer, sources, elapsed_ms, trace, conversation_id, turn_id, route, rewritten_query} from the same
        pipeline as the stream; `kb_id` / `kb_ids` pick the knowledge bases (default: the default one)."""
        return ok(engine.ask_sync(body.question, retry=body.retry, conversation_id=body.conversation_id,
                                  user=caller.user, use_kb=body.use_kb, kb_ids=body.scope(), reader=caller.reader,
                                  actor=Actor(caller.label, "rest"), doc_filter=body.doc_filter()))

    @app.post("/api/qa/ask", tags=["qa"], response_class=StreamingResponse,
              responses={200: {"content": {"text/event-stream": {}},
                               "description": "events stage / trace / delta / replace / sources / done / error"}})
    async def ask(body: AskBody, request: Request, caller: Caller = Depends(caller_of)):
        """Server-Sent Events: the engine's event stream, serialized. `retry: true` regenerates from the
        stored retrieval of the same question. A client that disconnects stops generation. `replace` {text, reason}
        voids the text streamed so far (the LLM's 「资料不足」 at its end): show `text` instead. `done` carries
        conversation_id (created when absent), turn_id, route and rewritten_query."""
        gen = engine.ask(body.question, retry=body.retry, conversation_id=body.conversation_id, user=caller.user,
                         use_kb=body.use_kb, kb_ids=body.scope(), reader=caller.reader,
                         actor=Actor(caller.label, "rest"), doc_filter=body.doc_filter())
        return StreamingResponse(sse_frames(gen, request, lambda event: event.to_sse()),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # --- the audit log (admins): questions through every door, admin actions -------------------------
    def audit_filters(actor: str | None = Query(None, description="user name or key:<name>"),
                      door: str | None = Query(None, description="page / rest / openai / mcp / internal"),
                      kind: str | None = Query(None, description="question / admin"),
                      outcome: str | None = Query(None, description="answer / weak / refuse / error / aborted / ok"),
                      kb_id: int | None = Query(None), since: str | None = Query(None, description="ISO date"),
                      until: str | None = Query(None, description="ISO date (a bare date includes that day)")):
        return {"actor": actor, "door": door, "kind": kind, "outcome": outcome, "kb_id": kb_id, "since": since,
                "until": until}

    @app.get("/api/audit-log", response_model=Envelope, tags=["audit"])
    def audit_log(filters: dict = Depends(audit_filters), page: int = Query(1, ge=1),
                  size: int = Query(50, ge=1, le=500), _: str | None = Depends(admin_user)):
        """Newest first: time, actor, door, kind, action, kb_ids, question, outcome, latency_ms, cited, detail."""
        return ok(engine.audit_log(page, size, **filters))

    @app.get("/api/audit-log/export", tags=["audit"], response_class=PlainTextResponse)
    def audit_log_export(filters: dict = Depends(audit_filters),
                         format: str = Query("jsonl", pattern="^(jsonl|csv)$"), _: str | None = Depends(admin_user)):
        """The matching entries, oldest first, as JSON lines or CSV (UTF-8 with BOM)."""
        media = "text/csv" if format == "csv" else "application/x-ndjson"
        return PlainTextResponse(engine.export_audit_log(format, **filters), media_type=f"{media}; charset=utf-8",
                                 headers={"Content-Disposition": f'attachment; filename="audit-log.{format}"'})

    # --- conversations (server-side history; a user sees only their own) -------------------------
    @app.get("/api/conversations", response_model=Envelope, tags=["conversations"])
    def list_conversations(page: int = Query(1, ge=1), size: int = Query(50, ge=1, le=200),
                           user: str | None = Depends(current_user)):
        """The caller's conversations, newest activity first: {items: [{conv_id, title, turn_count, …}], total}."""
        return ok(engine.list_conversations(user, page, size))

    @app.delete("/api/conversations", response_model=Envelope, tags=["conversations"])
    def clear_conversations(user: str | None = Depends(current_user)):
        """Delete all of the caller's conversations."""
        return ok(engine.clear_conversations(user))

    @app.get("/api/conversations/{conv_id}", response_model=Envelope, tags=["conversations"])
    def get_conversation(conv_id: str, caller: Caller = Depends(caller_of)):
        """One conversation with every turn (question, rewritten query, answer, sources, trace, route …).
        3002 unknown id; 4003 another user's."""
        return ok(engine.get_conversation(conv_id, caller.user, caller.reader))

    @app.patch("/api/conversations/{conv_id}", response_model=Envelope, tags=["conversations"])
    def rename_conversation(conv_id: str, body: RenameBody, user: str | None = Depends(current_user)):
        """Rename: {"title": "…"}."""
        return ok(engine.rename_conversation(conv_id, user, body.title))

    @app.delete("/api/conversations/{conv_id}", response_model=Envelope, tags=["conversations"])
    def delete_conversation(conv_id: str, user: str | None = Depends(current_user)):
        """Delete one conversation and its turns."""
        return ok(engine.delete_conversation(conv_id, user))

    @app.get("/api/conversations/{conv_id}/export", tags=["conversations"], response_class=PlainTextResponse,
             responses={200: {"content": {"text/markdown": {}}}})
    def export_conversation(conv_id: str, caller: Caller = Depends(caller_of)):
        """The conversation as Markdown with each answer's citations (a download)."""
        md = engine.export_conversation(conv_id, caller.user, caller.reader)
        return PlainTextResponse(md, media_type="text/markdown; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="conversation-{conv_id}.md"'})

    # --- feedback and verified Q&A entries ------------------------------------------------------
    @app.post("/api/feedback", response_model=Envelope, tags=["feedback"])
    def give_feedback(body: FeedbackBody, user: str | None = Depends(current_user)):
        """👍 / 👎 on one of the caller's answers (turn_id from `done`); 👎 may carry a reason and a comment.
        Rating again replaces the earlier rating."""
        return ok(engine.give_feedback(body.turn_id, user, body.rating, body.reason, body.comment))

    @app.get("/api/feedback", response_model=Envelope, tags=["feedback"])
    def list_feedback(rating: str | None = Query(None, description="up | down"), page: int = Query(1, ge=1),
                      size: int = Query(50, ge=1, le=200), _: str | None = Depends(kb_admin_user)):
        """Feedback with the question, answer and sources it was given on, newest first (KB admins)."""
        return ok(engine.list_feedback(rating, page, size))

    @app.get("/api/feedback/export", tags=["feedback"], response_class=PlainTextResponse,
             responses={200: {"content": {"application/x-ndjson": {}}}})
    def export_feedback(rating: str | None = Query(None), _: str | None = Depends(kb_admin_user)):
        """All feedback (or one rating) as JSON Lines, a download."""
        return PlainTextResponse(engine.export_feedback(rating), media_type="application/x-ndjson; charset=utf-8",
                                 headers={"Content-Disposition": 'attachment; filename="feedback.jsonl"'})

    @app.post("/api/verified", response_model=Envelope, tags=["feedback"])
    def create_verified(body: VerifiedBody, user: str | None = Depends(kb_admin_user)):
        """A verified Q&A entry (question + checked answer [+ the cited chunks of feedback_id's answer]),
        indexed like a small document on both routes and cited as 「已核实问答」 (KB admins)."""
        return ok(engine.create_verified(body.question, body.answer, user, body.feedback_id, body.kb_id))

    @app.get("/api/verified", response_model=Envelope, tags=["feedback"])
    def list_verified(_: str | None = Depends(kb_admin_user)):
        """Verified Q&A entries with their document's status (processing → ready)."""
        return ok(engine.list_verified())

    @app.delete("/api/verified/{qa_id}", response_model=Envelope, tags=["feedback"])
    def delete_verified(qa_id: int, _: str | None = Depends(kb_admin_user)):
        """Delete the entry; its document leaves both retrieval routes."""
        return ok(engine.delete_verified(qa_id))

    @app.get("/api/health", response_model=Envelope, tags=["status"])
    def health(request: Request, kb_id: int | None = Query(None, ge=1)):
        """{status, chunks, docs, engine: ready|loading, …} of all knowledge bases or of `kb_id`. Open without
        login, but then (logins on) only {status, engine, state}: counts and file names only to readers."""
        try:
            caller = caller_of(request)
        except ApiError:
            return ok(engine.public_health())
        return ok(engine.health(kb_id, caller.reader))

    app.include_router(openai_compat.router(engine, caller_of))
    app.include_router(kb_chunking.router(engine, caller_of))  # a KB's chunking, the upload preview
    app.include_router(chunks.router(engine, caller_of))  # chunks: view, edit, restore, disable, add
    app.include_router(sources.router(engine, caller_of))  # web pages and folders a KB follows
    app.include_router(doc_tags.router(engine, reader_of, kb_admin_user, rest_actor))  # tags and metadata

    # --- MCP (streamable HTTP at /mcp): the same callers, readers and rate limits as above ---------------
    def mcp_caller(request: Request) -> Caller:
        try:
            return caller_of(request)
        except ApiError as exc:
            raise CallerRefused(api_error_response(request, exc)) from None

    mount_mcp(app, engine, mcp_caller, bind_host)
    # outermost: who calls is decided first, refused in the door's own shape
    app.add_middleware(AuthBeforeBody, resolve=caller_of,
                       refuse=lambda request, exc: api_error_response(request, exc) if isinstance(exc, ApiError)
                       else None)
    return app

