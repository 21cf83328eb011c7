"""Request-body limits before anything reads the body (issue 27: an unauthenticated 200 MB JSON body cost
+600 MB RSS and 16.8 s before its 401; a 200 MB multipart upload was spooled in full first).

A pure ASGI middleware in front of the whole app (REST, the OpenAI-compatible /v1 and the mounted Gradio UI):
- a limit per route class: uploads (POST /api/kb/documents, Gradio's upload) MAX_BATCH_FILES × MAX_FILE_BYTES
  plus multipart overhead; the upload preview (POST /api/kbs/{id}/preview) one file's; everything else (JSON)
  JSON_LIMIT;
- a declared Content-Length over the limit is answered 413 at once, before the app runs (so before the login
  check, which would otherwise need the body parsed first for JSON routes);
- a chunked body (no Content-Length) or one that sends more than it declared is counted as it arrives: the
  first chunk past the limit ends the request with 413, nothing more is read;
- the 413 names the limit, in the envelope {code, msg, data} on /api (code 1001) and the OpenAI error shape on
  /v1; a plain text for the UI's own routes.
"""
from __future__ import annotations

import json
import re

from pipeline.errors import CODE_VALIDATION
from pipeline.ingestion.parsing import MAX_BATCH_FILES, MAX_FILE_BYTES

MB = 1024 * 1024
JSON_LIMIT = 1 * MB
UPLOAD_OVERHEAD = 1 * MB  # multipart boundaries, headers and the kb_id field
UPLOAD_LIMIT = MAX_BATCH_FILES * MAX_FILE_BYTES + UPLOAD_OVERHEAD
UPLOAD_ROUTES = (("POST", "/api/kb/documents"), ("POST", "/gradio_api/upload"), ("POST", "/upload"))
PREVIEW_ROUTE = re.compile(r"/api/kbs/\d+/preview")  # 预览分块 (api/kb_chunking.py): one file
PREVIEW_LIMIT = MAX_FILE_BYTES + UPLOAD_OVERHEAD


def limit_for(method: str, path: str) -> int:
    path = path.rstrip("/") or "/"
    if (method, path) in UPLOAD_ROUTES:
        return UPLOAD_LIMIT
    if method == "POST" and PREVIEW_ROUTE.fullmatch(path):
        return PREVIEW_LIMIT
    return JSON_LIMIT


def _mb(n: int) -> str:
    return f"{n / MB:g} MB"


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app, limit=limit_for):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit(scope.get("method", "GET"), scope.get("path", ""))
        declared = None
        for k, v in scope.get("headers") or ():
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = None
        if declared is not None and declared > limit:
            return await self._refuse(scope, send, limit)

        seen = 0
        over = False
        started = False

        async def counted_receive():
            nonlocal seen, over
            if over:  # the app asks again after we refused: tell it the client is gone
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise _TooLarge()
            return message

        async def guarded_send(message):
            nonlocal started
            if over:  # the app's own answer to the broken-off body (an error page, a 500) is not sent
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(scope, send, limit)

    @staticmethod
    async def _refuse(scope, send, limit: int) -> None:
        path = scope.get("path", "")
        msg = f"请求体过大：超过 {_mb(limit)} 上限"
        if path.startswith("/v1/") or path == "/v1":
            body = {"error": {"message": f"Request body too large: over the {_mb(limit)} limit ({msg})",
                              "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
        elif path.startswith("/api/") or path == "/api":
            body = {"code": CODE_VALIDATION, "msg": msg, "data": {"limit_bytes": limit}}
        else:
            body = {"detail": msg, "limit_bytes": limit}
        raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json; charset=utf-8"),
                                (b"content-length", str(len(raw)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": raw})
