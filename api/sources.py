"""REST for what a knowledge base follows: web pages (add, list, 重新抓取, interval, stop following) and the
server-side folder (set — admins only, since the path reads the server's disk —, show with its reports, 同步).
Everything else here is for KB admins; a caller limited to some knowledge bases (an API key's kb_ids, per-KB
readers) reaches only those (4003). No logic: each endpoint calls the engine."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from api.envelope import Body, ok, require
from pipeline.access.callers import Caller
from pipeline.access.policy import Role
from pipeline.services.audit_log import Actor


class WebSourceBody(Body):
    url: str = Field(min_length=1, max_length=2000, description="http:// or https://")
    interval_min: int | None = Field(None, ge=1, le=43200, description="re-fetch every N minutes; null = on demand")


class IntervalBody(Body):
    interval_min: int | None = Field(None, ge=1, le=43200)


class FolderBody(Body):
    path: str = Field(min_length=1, max_length=4000, description="absolute path of a folder on the server")
    interval_min: int | None = Field(None, ge=1, le=43200, description="sync every N minutes; null = on demand")


def router(engine, caller_of) -> APIRouter:
    r = APIRouter(prefix="/api", tags=["sources"])

    def actor_with(role: Role):
        def dependency(request: Request, caller: Caller = Depends(caller_of)) -> Actor:
            require(caller, role)
            kb_id, source_id = request.path_params.get("kb_id"), request.path_params.get("source_id")
            if kb_id is None and source_id is not None and str(source_id).isdigit():
                kb_id = engine.web_sources.get(int(source_id))["kb_id"]  # the knowledge base the URL belongs to
            if kb_id is not None and str(kb_id).isdigit():
                engine.get_kb(int(kb_id), caller.reader)  # 3002 / 4003 outside what the caller may reach
            return Actor(caller.label, "rest")
        return dependency

    kb_admin, admin = actor_with(Role.KB_ADMIN), actor_with(Role.ADMIN)

    # --- web pages
    @r.get("/kbs/{kb_id}/web-sources")
    def list_web_sources(kb_id: int, _: Actor = Depends(kb_admin)):
        """The URLs the knowledge base follows: status (pending / ok / unchanged / failed), message, last fetch,
        interval, the document."""
        return ok(engine.list_web_sources(kb_id))

    @r.post("/kbs/{kb_id}/web-sources")
    def add_web_source(kb_id: int, body: WebSourceBody, actor: Actor = Depends(kb_admin)):
        """Follow a URL: fetched now (the reply is the source after the fetch) and ingested as a document named
        after it; a failed fetch is a 失败 document with the reason, never content."""
        return ok(engine.add_web_source(kb_id, body.url, body.interval_min, actor=actor))

    @r.post("/web-sources/{source_id}/refetch")
    def refetch_web_source(source_id: int, actor: Actor = Depends(kb_admin)):
        """重新抓取 now; changed content becomes a new version, unchanged content none."""
        return ok(engine.refetch_web_source(source_id, actor=actor))

    @r.put("/web-sources/{source_id}")
    def set_web_source_interval(source_id: int, body: IntervalBody, actor: Actor = Depends(kb_admin)):
        return ok(engine.set_web_source_interval(source_id, body.interval_min, actor=actor))

    @r.delete("/web-sources/{source_id}")
    def remove_web_source(source_id: int, actor: Actor = Depends(kb_admin)):
        """Stop following the URL (its document stays)."""
        return ok(engine.remove_web_source(source_id, actor=actor))

    # --- the folder
    @r.get("/kbs/{kb_id}/folder")
    def get_folder(kb_id: int, _: Actor = Depends(kb_admin)):
        """The folder the knowledge base follows with its last sync reports, or null."""
        return ok(engine.folder_source(kb_id))

    @r.put("/kbs/{kb_id}/folder")
    def set_folder(kb_id: int, body: FolderBody, actor: Actor = Depends(admin)):
        """Follow a server-side folder (admins only)."""
        return ok(engine.set_folder_source(kb_id, body.path, body.interval_min, actor=actor))

    @r.delete("/kbs/{kb_id}/folder")
    def remove_folder(kb_id: int, actor: Actor = Depends(admin)):
        return ok(engine.remove_folder_source(kb_id, actor=actor))

    @r.post("/kbs/{kb_id}/folder/sync")
    def sync_folder(kb_id: int, actor: Actor = Depends(kb_admin)):
        """同步 now: new files ingested, changed ones new versions, deleted ones deleted (or flagged); the report."""
        return ok(engine.sync_folder(kb_id, actor=actor))

    return r
