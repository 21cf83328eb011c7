"""Documents of a knowledge base: upload, list with progress, read (chunks, text, page images, the original),
delete, versions and restore, and the full rebuild."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.access.kb_readers import KBAccess, Reader
from pipeline.errors import CODE_ENGINE, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.progress import shared_snapshot
from pipeline.ingestion.rebuild import Rebuild
from pipeline.ingestion.service import IngestBusy, UploadResult
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.changes import SearchableChanges
from pipeline.services.doc_tags import DocTagService
from pipeline.services.lifecycle import Lifecycle
from store.migrations import DEFAULT_KB_ID

if TYPE_CHECKING:
    from pipeline.components import Components

_NO_PROGRESS = {"stage": None, "stage_label": None, "done": None, "total": None, "position": None, "eta_s": None}


class DocumentService:
    def __init__(self, c: Components, access: KBAccess, lifecycle: Lifecycle, changes: SearchableChanges,
                 rebuild: Rebuild, audit: AuditLog, tags: DocTagService | None = None):
        self.c = c
        self.tags = tags
        self.audit = audit
        self.access = access
        self.lifecycle = lifecycle
        self.changes = changes
        self.rebuild_job = rebuild

    # ---- upload and the queue
    def upload(self, items: list[tuple[str, Path]], kb_id: int = DEFAULT_KB_ID, tags=None, metadata=None,
               actor: Actor | None = None) -> list[UploadResult]:
        """`tags` (a list, or comma-separated text) and `metadata` ({key: value}) go onto every new document;
        a new version starts with those of the version it replaces (pipeline/services/doc_tags.py)."""
        self.c.kbs.check(kb_id, fresh=True)  # deleted by another process meanwhile: 3002
        if self.tags is not None:
            tags, metadata = self.tags.check_upload(tags, metadata)
        try:
            results = self.c.ingest.upload(items, kb_id)
        except IngestBusy as exc:
            raise EngineError(CODE_ENGINE, str(exc)) from None
        if self.tags is not None:
            self.tags.at_upload(results, tags, metadata, actor)
        return results

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued document is processed (scripts, tests, benchmarks)."""
        return self.c.ingest.wait_idle(timeout)

    def list(self, page: int = 1, size: int = 20, keyword: str = "", kb_id: int = DEFAULT_KB_ID,
             reader: Reader | None = None) -> dict:
        """Paged documents of a knowledge base; processing ones carry stage / stage_label / done / total /
        position / eta_s; each its version and how many versions it has."""
        kb_id = self.access.check(kb_id, reader)
        items, total = self.c.docs.list(page, size, keyword, kb_id)
        elsewhere: dict | None = None  # what the queue in the database says (one read, only when needed)
        for d in items:
            d.pop("stored_name", None)
            p = self._progress_of(d)
            if d["status"] == "processing" and p["position"] is None and p["stage"] in ("queued", None):
                elsewhere = self.c.jobs.progress() if elsewhere is None else elsewhere
                p = shared_snapshot(elsewhere.get(d["doc_id"])) or p  # another process's document or place
            d.update(p)
        return {"items": items, "total": total, "page": page, "size": size, "kb_id": kb_id}

    def _progress_of(self, doc: dict) -> dict:
        snap = self.c.ingest.progress.snapshot(doc["doc_id"]) if doc["status"] == "processing" else None
        if snap is None:
            # 处理中 but not (yet) on the board: just enqueued by a restart, or the rebuild's turn is to come
            return _NO_PROGRESS | ({"stage": "queued", "stage_label": "排队"} if doc["status"] == "processing" else {})
        snap["progress"] = snap.pop("text")  # the text field of the first release, now from the board
        return snap

    # ---- reading
    def get(self, doc_id: int, reader: Reader | None = None) -> dict:
        d = self.access.document(doc_id, reader, field=None)
        d.pop("stored_name", None)
        return d

    def chunks(self, doc_id: int, reader: Reader | None = None) -> list[dict]:
        self.get(doc_id, reader)
        return self.c.docs.chunks_of(doc_id)

    def text(self, doc_id: int, part: int | None = None, chunk_id: int | None = None,
             reader: Reader | None = None) -> dict:
        """One part of a document's parsed text with its chunks' spans (pipeline.services.document_view); with `chunk_id`
        the part holding that chunk, which is the one to highlight."""
        from pipeline.services.document_view import document_view

        c = self.c
        doc = self.access.document(doc_id, reader, field=None)
        view = document_view(c.docs, doc, c.kbs.store.names().get(doc.get("kb_id")), part, chunk_id)
        if doc.get("active") != 1 and doc.get("lineage_id"):
            current = c.docs.find_active_in_lineage(doc["lineage_id"])
            view["current_version"] = current["version"] if current else None
            view["current_doc_id"] = current["doc_id"] if current else None
        return view

    def page_image(self, doc_id: int, page: int, chunk_id: int | None = None,
                   reader: Reader | None = None) -> tuple[bytes, bool]:
        """(JPEG of a PDF page, whether the chunk's passage is boxed on it — only where the text layer allows)."""
        from pipeline.services.page_image import render_page

        path, _ = self.file(doc_id, reader)
        doc = self.c.docs.get(doc_id)
        if doc["file_type"] != "pdf":
            raise EngineError(CODE_VALIDATION, "只有 PDF 文档有页面图", "doc_id")
        passage = None
        if chunk_id is not None:
            ch = next((c for c in self.c.docs.chunks_of(doc_id) if c["chunk_id"] == int(chunk_id)), None)
            if ch is None:
                raise EngineError(CODE_NO_DOC, f"块 {chunk_id} 不属于文档 {doc_id}", "chunk_id")
            page = ch["page"] or page
            passage = ch["text"] if ch["source"] != "ocr" else None
        try:
            return render_page(path, int(page), passage)
        except IndexError:
            raise EngineError(CODE_VALIDATION, f"页码 {page} 超出范围", "page") from None

    def chunk_document(self, chunk_id: int) -> int:
        """The document a chunk belongs to (a source card knows its chunk)."""
        row = self.c.docs.get_chunks([chunk_id]).get(int(chunk_id))
        if row is None:
            raise EngineError(CODE_NO_DOC, f"块不存在：{chunk_id}")
        return row["doc_id"]

    def file(self, doc_id: int, reader: Reader | None = None) -> tuple[Path, str]:
        """(path of the stored original, its display name) for download."""
        doc = self.access.document(doc_id, reader, field=None)
        path = self.c.files.path_of(doc["stored_name"]) if doc.get("stored_name") else None
        if path is None or not path.exists():
            raise EngineError(CODE_NO_DOC, f"文档 {doc_id} 的原始文件不存在")
        return path, doc["file_name"]

    def source_states(self, doc_ids) -> dict[int, dict]:
        """For cited documents: still there, active or an old version (replays show 「旧版本」)."""
        return self.c.docs.active_states(doc_ids)

    # ---- changes
    def delete(self, doc_id: int, actor: Actor | None = None) -> dict:
        """Delete a document: its active version deletes the whole document (every version); an old, a failed
        or a still-processing new version deletes only that version."""
        self.lifecycle.refuse_while_rebuilding()
        c = self.c
        doc = c.docs.get(doc_id)
        if doc is None:
            raise EngineError(CODE_NO_DOC, f"文档不存在：{doc_id}")
        whole = doc.get("active", 1) == 1
        targets = c.docs.versions_of(doc["lineage_id"]) if whole and doc.get("lineage_id") else [doc]
        kb = c.kbs.get(doc["kb_id"])
        removed = 0
        for d in targets:
            chunk_ids = [ch["chunk_id"] for ch in c.docs.chunks_of(d["doc_id"])]
            kb.bm25.soft_delete(chunk_ids)  # excluded from BM25 at once, before the rebuild lands
            c.ingest.cancel(d["doc_id"])
            with c.write_lock.writing():  # all three stores or none, as far as a backup can see
                kb.vectors.delete_doc(d["doc_id"])
                c.docs.delete(d["doc_id"])
                c.files.delete(d.get("stored_name"))
            removed += len(chunk_ids)
        self.changes.changed()  # the lookups of both routes already skip it; BM25 rebuilds in the background
        self.audit.admin(actor, "document.delete", {"doc_id": doc_id, "file_name": doc["file_name"],
                                                    "versions_removed": len(targets)}, [doc["kb_id"]])
        return {"doc_id": doc_id, "file_name": doc["file_name"], "chunks_removed": removed,
                "versions_removed": len(targets)}

    def versions(self, doc_id: int, reader: Reader | None = None) -> list[dict]:
        """Every version of the document `doc_id` belongs to, newest first (active flag, date, status)."""
        doc = self.get(doc_id, reader)
        out = self.c.docs.versions_of(doc["lineage_id"] or doc_id)
        for d in out:
            d.pop("stored_name", None)
        return out

    def restore_version(self, doc_id: int) -> dict:
        """Make an old (就绪) version the active one again; the current one becomes inactive."""
        self.lifecycle.refuse_while_rebuilding()
        doc = self.get(doc_id)
        if doc["status"] != "ready":
            raise EngineError(CODE_VALIDATION, "只能恢复已就绪的版本", "doc_id")
        if doc["active"] == 1:
            return {"doc_id": doc_id, "version": doc["version"], "changed": False}
        self.c.docs.restore(doc_id)
        # Both routes filter on the active flag at once; the BM25 indexes must hold the restored chunks before
        # the answer returns, here and (through the counter) in every other process.
        self.changes.changed(wait=True)
        return {"doc_id": doc_id, "version": doc["version"], "changed": True}

    # ---- full rebuild
    def start_rebuild(self, kb_id: int | None = None) -> dict:
        """Full rebuild of all knowledge bases, or of one."""
        return self.rebuild_job.start(require_ready=self.lifecycle.require_ready, kb_id=kb_id)

    def rebuild_status(self, reader: Reader | None = None) -> dict:
        """The rebuild's progress; the current file named only to a reader of its knowledge base."""
        return self.access.redact_progress(self.rebuild_job.status(), reader)

    def rebuild(self, timeout: float | None = None, kb_id: int | None = None) -> dict:
        """Blocking full rebuild (scripts/tests)."""
        self.start_rebuild(kb_id)
        return self.wait_rebuild(timeout)

    def wait_rebuild(self, timeout: float | None = None) -> dict:
        return self.rebuild_job.wait(timeout)
