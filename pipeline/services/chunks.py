"""Chunks as first-class objects: a KB admin edits a chunk's text, restores the parsed original, switches a chunk
off and on, and adds a chunk by hand (issue #28, item 1).

Every change is searchable at once and in every process:
  - edit / restore / add: the text is re-tokenized (BM25 tokens stored in the chunk row) and re-embedded (its vector
    replaced in the knowledge base's Chroma collection) before the call returns; the change hook
    (pipeline.services.changes) rebuilds this process's BM25 before returning and moves the KB generation, so the
    other processes rebuild theirs on their next request;
  - disable: both routes filter every hit on the chunk row's `enabled` flag (pipeline.retrieval.nodes.retrievable),
    read per question from the shared database — no process can return it from then on; its vector is dropped and
    BM25 soft-deletes it here (the audit knows a disabled chunk is out of the indexes on purpose);
  - enable: its vector comes back (embedded from the stored text) and BM25 holds it before the call returns.

A 全量重建 keeps a curated document (one with an edited, disabled or manual chunk) as it is: its tokens and vectors
are re-derived from the stored chunk text (`reindex_if_curated`), never re-parsed. A new version of the document
is a new document: it starts from its own parse.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pipeline.access.kb_readers import KBAccess, Reader
from pipeline.errors import CODE_ENGINE, CODE_NO_DOC, CODE_VALIDATION, EngineError
from pipeline.ingestion.service import QA_FILE_TYPE
from pipeline.ingestion.structured_chunking import indexed_text
from pipeline.services.audit_log import Actor, AuditLog
from pipeline.services.changes import SearchableChanges
from pipeline.services.lifecycle import Lifecycle
from store.chunks import ChunkStore

if TYPE_CHECKING:
    from pipeline.components import Components

log = logging.getLogger(__name__)

MAX_CHUNK_CHARS = 10_000
MAX_CONTEXT_CHARS = 200
NEW_VERSION_NOTE = "修改只属于这个版本：上传新版本时，新版本从自己的解析结果开始（不带过这些修改）"


def public(row: dict) -> dict:
    """A chunk as the doors show it: text, context, length, enabled, edited (who / when), manual."""
    return {"chunk_id": row["chunk_id"], "doc_id": row["doc_id"], "chunk_index": row["chunk_index"],
            "text": row["text"], "context": row.get("context"), "page": row.get("page"),
            "length": len(row["text"] or ""), "enabled": bool(row.get("enabled", 1)),
            "edited": row.get("original_text") is not None, "original_text": row.get("original_text"),
            "edited_by": row.get("edited_by"), "edited_at": row.get("edited_at"), "manual": bool(row.get("manual"))}


def _clean_text(text, field: str = "text", limit: int = MAX_CHUNK_CHARS, required: bool = True) -> str | None:
    if text is None and not required:
        return None
    if not isinstance(text, str):
        raise EngineError(CODE_VALIDATION, f"{field} 必须是文本", field)
    text = text.strip()
    if required and not text:
        raise EngineError(CODE_VALIDATION, "块的文本不能为空", field)
    if len(text) > limit:
        raise EngineError(CODE_VALIDATION, f"{field} 过长（最多 {limit} 字）", field)
    return text or None


def _refuse_verified(row: dict) -> None:
    """A verified Q&A entry is one chunk kept in step with its entry (pipeline.conversation.verified): it is
    changed there, not here."""
    if row.get("file_type") == QA_FILE_TYPE:
        raise EngineError(CODE_VALIDATION, "这是已核实问答：请在「已核实问答」中删除后重新添加", "chunk_id")


class ChunkService:
    def __init__(self, c: Components, access: KBAccess, lifecycle: Lifecycle, changes: SearchableChanges,
                 audit: AuditLog):
        self.c = c
        self.store = ChunkStore(c.db)
        self.access = access
        self.lifecycle = lifecycle
        self.changes = changes
        self.audit = audit

    # ---- reading
    def list(self, doc_id: int, reader: Reader | None = None) -> dict:
        """Every chunk of a document (text, context, length, enabled, edited by / at, manual) and the note that a
        new version starts from its own parse."""
        doc = self.access.document(int(doc_id), reader)
        rows = self.store.of_doc(doc["doc_id"])
        return {"doc_id": doc["doc_id"], "file_name": doc["file_name"], "kb_id": doc["kb_id"],
                "version": doc.get("version"), "active": doc.get("active"), "status": doc["status"],
                "enabled": sum(1 for r in rows if r["enabled"]), "total": len(rows),
                "note": NEW_VERSION_NOTE, "chunks": [public(r) for r in rows]}

    def get(self, chunk_id: int, reader: Reader | None = None) -> dict:
        return public(self._chunk(chunk_id, reader))

    def _chunk(self, chunk_id, reader: Reader | None) -> dict:
        try:
            chunk_id = int(chunk_id)
        except (TypeError, ValueError):
            raise EngineError(CODE_VALIDATION, "chunk_id 必须是整数", "chunk_id") from None
        row = self.store.get(chunk_id)
        if row is None:
            raise EngineError(CODE_NO_DOC, f"块不存在：{chunk_id}", "chunk_id")
        self.access.check(row["kb_id"], reader)
        return row

    def _ready_doc(self, doc_id, reader: Reader | None, refused: str) -> dict:
        """A document a KB admin may curate now: it exists, the reader may see it, it is 就绪, not a verified entry."""
        self.lifecycle.refuse_while_rebuilding()
        doc = self.access.document(int(doc_id), reader)
        if doc["status"] != "ready":
            raise EngineError(CODE_VALIDATION, f"文档还未就绪（处理中或失败），{refused}", "doc_id")
        _refuse_verified(doc)
        return doc

    def _editable(self, chunk_id, reader: Reader | None) -> dict:
        self.lifecycle.refuse_while_rebuilding()
        row = self._chunk(chunk_id, reader)
        if row["status"] != "ready":
            raise EngineError(CODE_VALIDATION, "文档还未就绪（处理中或失败），不能修改它的块", "chunk_id")
        _refuse_verified(row)
        return row

    # ---- changes
    def edit(self, chunk_id: int, text: str, actor: Actor | None = None, reader: Reader | None = None) -> dict:
        """New text for a chunk: re-tokenized and re-embedded before this returns; the parsed original is kept."""
        row = self._editable(chunk_id, reader)
        text = _clean_text(text)
        if text == row["text"]:
            return public(row)
        if text == row["original_text"]:  # edited back to what was parsed: that is a restore
            return self.restore(row["chunk_id"], actor, reader)
        by = (actor or Actor(None)).name
        self._write(row, text, lambda tokens: self.store.set_text(row["chunk_id"], text, tokens, by))
        self.audit.admin(actor, "chunk.edit", {"chunk_id": row["chunk_id"], "doc_id": row["doc_id"],
                                               "file_name": row["file_name"], "chars": len(text)}, [row["kb_id"]])
        return self.get(row["chunk_id"])

    def restore(self, chunk_id: int, actor: Actor | None = None, reader: Reader | None = None) -> dict:
        """The parsed original text back (a manual or never edited chunk: 1001)."""
        row = self._editable(chunk_id, reader)
        if row["original_text"] is None:
            raise EngineError(CODE_VALIDATION, "这个块没有被修改过（或是手动添加的），没有可恢复的原文", "chunk_id")
        original = row["original_text"]
        self._write(row, original, lambda tokens: self.store.restore(row["chunk_id"], tokens))
        self.audit.admin(actor, "chunk.restore", {"chunk_id": row["chunk_id"], "doc_id": row["doc_id"],
                                                  "file_name": row["file_name"]}, [row["kb_id"]])
        return self.get(row["chunk_id"])

    def set_enabled(self, chunk_id: int, enabled: bool, actor: Actor | None = None,
                    reader: Reader | None = None) -> dict:
        """Switch a chunk off (out of both routes and citations at once, in every process) or on again."""
        row = self._editable(chunk_id, reader)
        enabled = bool(enabled)
        kb = self.c.kbs.get(row["kb_id"])
        if enabled:
            emb = self._embed([indexed_text(row["text"], row.get("context"))])[0]
        with self.c.write_lock.writing():  # the flag and the vector change together, as a backup sees them
            if not self.store.set_enabled(row["chunk_id"], enabled):
                return public(row)  # already so: nothing to do, nothing to log
            kb.vectors.delete_ids([row["chunk_id"]])
            if enabled:
                self._add_vector(kb, row["chunk_id"], emb, row["text"], row["doc_id"], row["file_name"])
        if enabled:
            self.changes.changed(wait=True)  # BM25 holds it again before this returns
        else:
            kb.bm25.soft_delete([row["chunk_id"]])  # the row filter already hides it; BM25 drops it now too
            self.changes.changed()
        self.audit.admin(actor, "chunk.enable" if enabled else "chunk.disable",
                         {"chunk_id": row["chunk_id"], "doc_id": row["doc_id"], "file_name": row["file_name"]},
                         [row["kb_id"]])
        return self.get(row["chunk_id"])

    def add(self, doc_id: int, text: str, context: str | None = None, actor: Actor | None = None,
            reader: Reader | None = None) -> dict:
        """A chunk written by hand, appended to the document; searchable when this returns."""
        doc = self._ready_doc(doc_id, reader, "不能添加块")
        text = _clean_text(text)
        context = _clean_text(context, "context", MAX_CONTEXT_CHARS, required=False)
        full = indexed_text(text, context)
        tokens, emb = self.c.tokenizer(full), self._embed([full])[0]
        kb = self.c.kbs.get(doc["kb_id"])
        with self.c.write_lock.writing():
            chunk_id = self.store.add_manual(doc["doc_id"], text, context, tokens, (actor or Actor(None)).name)
            self._add_vector(kb, chunk_id, emb, text, doc["doc_id"], doc["file_name"])
        self.changes.changed(wait=True)
        self.audit.admin(actor, "chunk.add", {"chunk_id": chunk_id, "doc_id": doc["doc_id"],
                                              "file_name": doc["file_name"], "chars": len(text)}, [doc["kb_id"]])
        return self.get(chunk_id)

    def reparse(self, doc_id: int, actor: Actor | None = None, reader: Reader | None = None) -> dict:
        """Discard every edit, switch-off and hand-made chunk of the document: its original is parsed again (the
        document is 处理中 until then, as in a rebuild). What "unless asked to" means for a rebuild."""
        doc = self._ready_doc(doc_id, reader, "不能重新解析")
        self.c.docs.set_status(doc["doc_id"], "processing", None, "重新解析（放弃分块修改）")
        self.c.ingest.enqueue(doc["doc_id"], doc)
        self.changes.changed()  # 处理中: out of both routes now; its new chunks come with 就绪
        self.audit.admin(actor, "chunk.reparse", {"doc_id": doc["doc_id"], "file_name": doc["file_name"]},
                         [doc["kb_id"]])
        return {"doc_id": doc["doc_id"], "status": "processing"}

    # ---- the full rebuild
    def reindex_if_curated(self, doc: dict) -> bool:
        """A rebuild's turn for a document with edited, disabled or manual chunks: tokens and vectors re-derived
        from the stored chunk text (disabled chunks get tokens but no vector), the parse is not redone. False
        (nothing done) for a document that is only its parse — the rebuild re-parses it as before."""
        if doc.get("status") != "ready" or not self.store.is_curated(doc["doc_id"]):
            return False
        rows = self.store.of_doc(doc["doc_id"])
        texts = {r["chunk_id"]: indexed_text(r["text"], r.get("context")) for r in rows}
        tokens = {cid: self.c.tokenizer(t) for cid, t in texts.items()}
        live = [r for r in rows if r["enabled"]]
        embs = self._embed([texts[r["chunk_id"]] for r in live]) if live else []
        kb = self.c.kbs.get(doc["kb_id"])
        with self.c.write_lock.writing():
            kb.vectors.delete_doc(doc["doc_id"])
            self._claim(kb)
            if live:
                kb.vectors.add_many([r["chunk_id"] for r in live], embs, [r["text"] for r in live],
                                    [r["doc_id"] for r in live], [r["file_name"] for r in live])
            self.store.set_tokens(doc["doc_id"], tokens)
            kb.bm25.replace(sorted(tokens.items()))
        log.info("rebuild kept the curated chunks of %s (%d chunks re-derived)", doc["file_name"], len(rows))
        return True

    # ---- helpers
    def _write(self, row: dict, text: str, store_write) -> None:
        """Tokens + vector of the chunk's new text; the row write and the vector swap under the write gate; then
        the change hook (this process's BM25 before returning, the other processes' on their next request)."""
        full = indexed_text(text, row.get("context"))
        tokens = self.c.tokenizer(full)
        emb = self._embed([full])[0] if row["enabled"] else None
        kb = self.c.kbs.get(row["kb_id"])
        with self.c.write_lock.writing():
            store_write(tokens)
            if emb is not None:
                kb.vectors.delete_ids([row["chunk_id"]])
                self._add_vector(kb, row["chunk_id"], emb, text, row["doc_id"], row["file_name"])
            kb.bm25.replace([(row["chunk_id"], tokens)])  # the old tokens never match again, in any process
        self.changes.changed(wait=True)

    def _embed(self, texts: list[str]) -> list[list[float]]:
        self.lifecycle.require_ready()
        if self.c.models.model_warning:  # the collection holds another model's vectors: never mix them
            raise EngineError(CODE_ENGINE, f"{self.c.models.model_warning}，之后才能修改块")
        return self.c.models.embedding.embed_model.get_text_embedding_batch(texts)

    def _add_vector(self, kb, chunk_id: int, emb, text: str, doc_id: int, file_name: str) -> None:
        self._claim(kb)
        kb.vectors.add_many([chunk_id], [emb], [text], [doc_id], [file_name])

    def _claim(self, kb) -> None:
        emb = self.c.models.embedding
        kb.vectors.claim_model(emb.model_id, emb.dim)
