"""Tags and key-value metadata of documents: set at upload, read and edited later (every edit in the audit log),
and the tags in use (the chat's tag picker). Filters over them: pipeline/retrieval/doc_filter.py."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.access.kb_readers import KBAccess, Reader
from pipeline.retrieval.doc_filter import clean_metadata, clean_tags
from pipeline.services.audit_log import Actor, AuditLog

if TYPE_CHECKING:
    from pipeline.components import Components
    from pipeline.ingestion.service import UploadResult


class DocTagService:
    def __init__(self, c: Components, access: KBAccess, audit: AuditLog):
        self.c = c
        self.access = access
        self.audit = audit

    @property
    def store(self):
        return self.c.doc_tags

    def get(self, doc_id: int, reader: Reader | None = None) -> dict:
        """{doc_id, tags, metadata, auto}: what a KB admin set, and what the document itself says (file type,
        version, pages, upload date)."""
        self.access.document(int(doc_id), reader)
        return {"doc_id": int(doc_id), **self.store.get(doc_id), "auto": self.store.auto(doc_id)}

    def set(self, doc_id: int, tags: Any = None, metadata: Any = None, actor: Actor | None = None) -> dict:
        """Replace a document's tags and / or metadata (None: leave that part as it is). The next question's
        filter sees the change (filters are resolved per question)."""
        doc = self.access.document(int(doc_id), None)
        new_tags = clean_tags(tags) if tags is not None else None
        new_meta = clean_metadata(metadata) if metadata is not None else None
        before = self.store.get(doc_id)
        self.store.set(doc_id, new_tags, new_meta)
        after = self.store.get(doc_id)
        if after != before:
            self.audit.admin(actor, "document.tags", {"doc_id": int(doc_id), "file_name": doc["file_name"],
                                                      "before": before, "after": after}, [doc["kb_id"]])
        return self.get(doc_id)

    def tags(self, kb_ids: Any = None, reader: Reader | None = None) -> list[dict]:
        """[{tag, docs}] in use in these knowledge bases (default: every one the reader may read)."""
        ids = ([self.access.check(k, reader) for k in kb_ids] if kb_ids else
               sorted(kb["kb_id"] for kb in self.access.readable(reader)))
        return self.store.tags_in_use(ids)

    # ---- at upload
    @staticmethod
    def check_upload(tags: Any, metadata: Any) -> tuple[list[str], dict[str, str]]:
        """Validated before anything is stored (a bad tag refuses the upload, not half of it)."""
        return clean_tags(tags), clean_metadata(metadata)

    def at_upload(self, results: list[UploadResult], tags: list[str], metadata: dict[str, str],
                  actor: Actor | None = None) -> None:
        """Tags / metadata of freshly uploaded documents. A new version starts with those of the version it
        replaces; given tags replace them, given metadata keys are set over them."""
        for r in results:
            if not r.ok or r.existed or r.doc_id is None:
                continue
            doc = self.c.docs.get(r.doc_id)
            if doc is None:
                continue
            prev = (self.c.docs.find_active_in_lineage(doc["lineage_id"])
                    if doc.get("lineage_id") not in (None, doc["doc_id"]) else None)
            start = self.store.get(prev["doc_id"]) if prev else {"tags": [], "metadata": {}}
            new_tags = tags or start["tags"]
            new_meta = {**start["metadata"], **metadata}
            if new_tags or new_meta:
                self.store.set(r.doc_id, new_tags, new_meta)
            if tags or metadata:
                self.audit.admin(actor, "document.tags", {"doc_id": r.doc_id, "file_name": r.file_name,
                                                          "before": start, "after": {"tags": new_tags,
                                                                                     "metadata": new_meta}},
                                 [doc["kb_id"]])
