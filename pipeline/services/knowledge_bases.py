"""Knowledge bases: list what a reader may read, create, rename / change readers, delete with everything in it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.access.kb_readers import KBAccess, Reader
from pipeline.errors import CODE_VALIDATION, EngineError
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.changes import SearchableChanges
from pipeline.services.lifecycle import Lifecycle
from store.migrations import DEFAULT_KB_ID

if TYPE_CHECKING:
    from pipeline.components import Components


class KnowledgeBaseService:
    def __init__(self, c: Components, access: KBAccess, lifecycle: Lifecycle, changes: SearchableChanges,
                 audit: AuditLog):
        self.c = c
        self.audit = audit
        self.access = access
        self.lifecycle = lifecycle
        self.changes = changes

    def list(self, reader: Reader | None = None) -> list[dict]:
        """The knowledge bases the reader may read, with document and chunk counts and `readers` (None = open to
        every logged-in user), the default one first."""
        return self.access.readable(reader)

    def get(self, kb_id: int, reader: Reader | None = None) -> dict:
        return self.c.kbs.store.get(self.access.check(kb_id, reader))

    def health(self, kb_id: int | None = None, reader: Reader | None = None) -> dict:
        """Lifecycle.health as the reader may see it: `kb_id` must be readable (4003), counts without `kb_id` are
        those of the knowledge bases they may read, and the rebuild's current file is named only to its readers."""
        if kb_id is not None:
            kb_id = self.access.check(kb_id, reader)
        h = self.lifecycle.health(kb_id)
        if kb_id is None and self.access.readable_ids(reader) is not None:
            rows = self.access.readable(reader)
            h.update(docs=sum(int(r.get("docs") or 0) for r in rows),
                     chunks=sum(int(r.get("chunks") or 0) for r in rows), kbs=len(rows))
        h["rebuild"] = self.access.redact_progress(h["rebuild"], reader)
        return h

    def public_health(self) -> dict:
        """What anyone may see without logging in when logins are on: that the service is up, nothing more."""
        state = self.lifecycle.state
        return {"status": "ok", "engine": "ready" if state == "ready" else "loading", "state": state}

    def create(self, name: str, description: str = "", readers: list[str] | None = None,
               actor: Actor | None = None) -> dict:
        kb = self.c.kbs.create(name, description, readers)
        self.audit.admin(actor, "kb.create", {"name": kb["name"], "readers": kb.get("readers")}, [kb["kb_id"]])
        return kb

    def update(self, kb_id: int, name: str | None = None, description: str | None = None,
               readers: Any = ..., actor: Actor | None = None) -> dict:
        """`readers`: ... unchanged, None = every logged-in user, a list = only these users (and KB admins).
        A change of readers is its own audit entry (kb.readers): it changes who may read what."""
        before = self.c.kbs.store.get(kb_id) if readers is not ... else None
        kb = self.c.kbs.update(kb_id, name, description, readers)
        if readers is not ... and (before or {}).get("readers") != kb.get("readers"):
            self.audit.admin(actor, "kb.readers", {"name": kb["name"], "before": (before or {}).get("readers"),
                                                   "after": kb.get("readers")}, [kb["kb_id"]])
        if name is not None or description is not None:
            self.audit.admin(actor, "kb.update", {"name": kb["name"]}, [kb["kb_id"]])
        return kb

    def delete(self, kb_id: int, actor: Actor | None = None) -> dict:
        """Delete a knowledge base and everything in it (documents, versions, chunks, vectors, BM25, files).
        The default knowledge base stays (the SRS §7 paths work on it)."""
        c = self.c
        kb_id = c.kbs.check(kb_id)
        if kb_id == DEFAULT_KB_ID:
            raise EngineError(CODE_VALIDATION, "默认知识库不能删除（可以重命名）", "kb_id")
        self.lifecycle.refuse_while_rebuilding()
        kb = c.kbs.store.get(kb_id)
        docs = c.docs.all_docs(kb_id)
        for d in docs:
            c.ingest.cancel(d["doc_id"])
        for d in docs:
            c.docs.delete(d["doc_id"])
            c.files.delete(d.get("stored_name"))
        c.kbs.drop(kb_id)
        c.chunking.forget(kb_id)  # its own chunk settings (pipeline/ingestion/kb_chunking.py)
        if c.retrieval is not None:
            c.retrieval.forget(kb_id)
        if c.gate_background is not None:
            c.gate_background.forget(kb_id)
        self.changes.changed()  # other processes drop their handles of it (Lifecycle.refresh_indexes)
        self.audit.admin(actor, "kb.delete", {"name": kb["name"], "docs_removed": len(docs)}, [kb_id])
        return {"kb_id": kb_id, "name": kb["name"], "docs_removed": len(docs)}

    def resolve(self, kb_ids: Any = None, reader: Reader | None = None) -> list[int]:
        """The knowledge bases a question searches: the given ids (each checked to exist and be readable), or the
        default one (all readable ones when the reader may not read the default one) — pipeline.access.kb_readers."""
        return self.access.scope(kb_ids, reader)
