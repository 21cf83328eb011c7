"""A knowledge base's chunking (read, change, then rebuild that KB only) and the upload preview (预览分块).

The preview parses the file in the same parse worker child with the same budgets as the ingest and cuts it with
the same `chunk_document`, with the KB's chunking (or values being tried and not yet saved). It stores nothing:
no document row, no vectors, no BM25 tokens, no original file — the caller's temporary file is all there is.
A change of a KB's chunking applies to new uploads at once; the KB's existing documents keep their chunks until
that KB is rebuilt (`rebuild=True`, or a rebuild started later): the rebuild re-parses their stored originals.
"""
from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import CODE_ENGINE, CODE_PARSE, CODE_VALIDATION, EngineError
from pipeline.ingestion.kb_chunking import FIELDS, Chunking, chunk_document, merged
from pipeline.ingestion.parse_worker import ParseCancelled, ParseStopped
from pipeline.ingestion.parsing import ParseError, UploadRefused, check_upload, sniff_content
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.settings import SettingsService
from pipeline.settings import LABELS, Settings, bounds, field_meta
from store.files import display_name, md5_of

if TYPE_CHECKING:
    from pipeline.components import Components

PREVIEW_MAX_CHUNKS = 500  # chunks returned by a preview (count says how many there are in all)
# Each preview parses in a parse-worker child of its own while the ingest may hold another (each up to
# parse_memory_mb): previews take turns, a caller waiting longer than this is told to retry.
PREVIEW_WAIT_S = 30.0


class ChunkingService:
    def __init__(self, c: Components, settings: SettingsService, audit: AuditLog,
                 start_rebuild: Callable[[int], dict], rebuild_busy: Callable[[], bool]):
        self.c = c
        self.rebuild_busy = rebuild_busy  # Lifecycle's: a rebuild in this or any other process
        self._previewing = threading.Lock()
        self.settings = settings
        self.audit = audit
        self.start_rebuild = start_rebuild  # DocumentService.start_rebuild(kb_id): that knowledge base only

    def get(self, kb_id: int) -> dict:
        """{kb_id, chunking (what its ingest uses), overrides (the fields it sets itself), defaults (the global
        settings), fields (label, description, bounds of each field, from the settings' declarations)}."""
        kb_id = self.c.kbs.check(kb_id)
        s = self.settings.current
        return {"kb_id": kb_id, "chunking": self.c.chunking.effective(kb_id, s).as_dict(),
                "overrides": self.c.chunking.overrides(kb_id), "defaults": Chunking.of(s).as_dict(),
                "fields": {f: _field_info(f) for f in FIELDS}}

    def update(self, kb_id: int, changes: dict[str, Any], rebuild: bool = False, actor: Actor | None = None) -> dict:
        """Change the fields given (a value: this KB's own; None: follow the global setting again). Returns get()
        plus `changed` (fields whose effective value moved), `need_rebuild` (the KB has documents cut the old
        way) and `rebuild` (its status when `rebuild` started the rebuild of this KB only)."""
        kb_id = self.c.kbs.check(kb_id)
        if self.rebuild_busy():  # a rebuild in flight would cut some documents one way, some the other
            raise EngineError(CODE_ENGINE, "重建进行中，暂不能修改切块参数，请稍后再试")
        s = self.settings.current
        before_ov = self.c.chunking.overrides(kb_id)
        before = self.c.chunking.effective(kb_id, s)
        wanted = {**before_ov, **changes}
        after = merged(s, wanted)  # SettingsError (1001) naming the field, with the settings' own bounds
        saved = self.c.chunking.save(kb_id, {k: getattr(after, k) for k, v in wanted.items() if v is not None})
        changed = [f for f in FIELDS if getattr(before, f) != getattr(after, f)]
        docs = len(self.c.docs.all_docs(kb_id))
        need = bool(changed) and docs > 0
        if saved != before_ov:
            self.audit.admin(actor, "kb.chunking", {"before": before.as_dict(), "after": after.as_dict(),
                                                    "overrides": saved, "rebuild": bool(rebuild and need)}, [kb_id])
        out = {**self.get(kb_id), "changed": changed, "need_rebuild": need, "rebuild": None}
        if rebuild and need:
            out["rebuild"] = self.start_rebuild(kb_id)
            out["need_rebuild"] = False
        return out

    def preview(self, kb_id: int, file_name: str, path: Path, changes: dict[str, Any] | None = None) -> dict:
        """How `file_name` (received at `path`) would be cut in this knowledge base: {file_name, file_type, kb_id,
        chunking, count, chunks: [{index, text, context, length, page}] (the first PREVIEW_MAX_CHUNKS), warnings,
        existing (the same content is already in this KB: its doc_id), replaces (an active document of that name
        whose next version it would become)}. `changes`: chunking values to try (not saved)."""
        kb_id = self.c.kbs.check(kb_id)
        s: Settings = self.settings.current
        ck = (merged(s, {**self.c.chunking.overrides(kb_id), **changes}) if changes
              else self.c.chunking.effective(kb_id, s))
        name = display_name(file_name)
        path = Path(path)
        try:
            file_type = check_upload(name, path.stat().st_size)
            sniff_content(path, file_type)
        except (UploadRefused, ParseError) as exc:
            raise EngineError(CODE_VALIDATION, exc.reason, "file") from None
        if not self._previewing.acquire(timeout=PREVIEW_WAIT_S):
            raise EngineError(CODE_ENGINE, "另一个文件正在预览，请稍后再试")
        try:
            parsed = self.c.ingest.parse(path, file_type, s, key=("preview", uuid.uuid4().hex))
        except ParseError as exc:
            raise EngineError(CODE_PARSE, exc.reason, "file") from None
        except (ParseCancelled, ParseStopped):
            raise EngineError(CODE_PARSE, "预览已取消（服务正在停止）", "file") from None
        finally:
            self._previewing.release()
        _, pieces = chunk_document(parsed.pages, ck)
        if not pieces or not pieces[0][2].text:
            raise EngineError(CODE_PARSE, "未解析到文本", "file")
        existing = self.c.docs.find_by_md5(md5_of(path), kb_id)
        current = self.c.docs.find_active_by_name(kb_id, name)
        return {"file_name": name, "file_type": file_type, "kb_id": kb_id, "chunking": ck.as_dict(),
                "count": len(pieces), "warnings": list(parsed.warnings),
                "existing": existing["doc_id"] if existing else None,
                "replaces": ({"doc_id": current["doc_id"], "version": current["version"]}
                             if current and not existing else None),
                "chunks": [{"index": i, "text": pc.text, "context": pc.context, "length": len(pc.text),
                            "page": page.page} for i, (_, page, pc) in enumerate(pieces[:PREVIEW_MAX_CHUNKS])]}

def _field_info(name: str) -> dict:
    lo, hi = bounds(name)
    return {"label": LABELS[name], "description": Settings.model_fields[name].description, "ge": lo, "le": hi,
            "effect": field_meta(name)["effect"]}
